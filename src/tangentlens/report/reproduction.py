"""Which of the seed papers' qualitative findings hold on this run, each with its numbers.

* bell-shaped anisotropy over depth in decoders (Razzhigaev et al.): at the last step, centred
  anisotropy peaks at an interior layer;
* intrinsic dimension rises then falls (Razzhigaev et al.): the layer-averaged TwoNN dimension
  peaks at an interior step at least 5 % above the first step's and ends at least 5 % below
  the peak;
* tangent/normal energy ratio well above 1 early and smaller late (Bernas et al.): mean
  ``energy_ratio`` (all tokens, every site and dictionary method; the rank-1 mean direction is
  reported on its own) over the early 30 % of the trained steps (step 0 is the initialisation
  baseline, not "early") > 1.5, above the step-0 value where there is one, and above the last
  step's;
* negative correlation of log-frequency with centroid distance (Bernas et al.): the last step's
  Pearson correlation with the Bessel-corrected spread (the headline: it reads ≈ 0 when spread
  does not depend on frequency, where the raw Spearman reads +0.13 to +0.19), averaged over
  layers, < 0 (the first step's is given as context: at initialisation it should be near 0).

Each finding is stated whichever way it comes out, with the metric's value at step 0 (random
weights) beside the later ones where the rows have step 0: at initialisation the architecture
already sets these values (:mod:`tangentlens.report.baseline`).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tangentlens.report.baseline import INIT_STEP, step_label

__all__ = ["Finding", "reproduction_summary"]

#: The rank-1 mean-direction proxy (``tangentlens.proxies.MEAN_DIRECTION``).
MEAN_DIRECTION = "mean_direction"

Row = dict[str, Any]


@dataclass(frozen=True)
class Finding:
    """One claim of a paper, whether this run reproduces it, and the numbers that say so."""

    claim: str
    holds: bool
    evidence: str


def _mean_by(rows: list[Row], key: str) -> dict[Any, float]:
    grouped: dict[Any, list[float]] = defaultdict(list)
    for r in rows:
        if r["value"] is not None and not math.isnan(r["value"]):
            grouped[r[key]].append(r["value"])
    return {k: statistics.fmean(v) for k, v in grouped.items()}


def _pick(rows: list[Row], probe: str, metric: str) -> list[Row]:
    return [r for r in rows if r["probe"] == probe and r["metric"] == metric]


def _at_init(steps: Iterable[int], describe: Callable[[int], str]) -> str:
    """``"; at step 0 (init): " + describe(0)`` where ``steps`` hold step 0 and a later step,
    else ""."""
    steps = set(steps)
    if INIT_STEP not in steps or max(steps) == INIT_STEP:
        return ""
    return f"; at step {step_label(INIT_STEP)}: {describe(INIT_STEP)}"


def _bell(rows: list[Row]) -> Finding | None:
    picked = [
        r for r in _pick(rows, "shape_of_learning", "centred_anisotropy") if r["layer"] is not None
    ]
    if not picked:
        return None
    steps = {r["step"] for r in picked}
    last = max(steps)
    by_layer = _by_layer(picked, last)
    layers = sorted(by_layer)
    peak = max(layers, key=by_layer.__getitem__)
    return Finding(
        "bell-shaped anisotropy over depth (peak in a middle layer)",
        len(layers) >= 3 and peak not in (layers[0], layers[-1]),
        f"centred anisotropy at step {last}: {_profile(by_layer)}; peak at L{peak}"
        + _at_init(steps, lambda s: _profile(_by_layer(picked, s))),
    )


def _by_layer(rows: list[Row], step: int) -> dict[Any, float]:
    return _mean_by([r for r in rows if r["step"] == step], "layer")


def _profile(by_layer: dict[Any, float]) -> str:
    """``"L0 0.115, L1 0.135"``."""
    return ", ".join(f"L{k} {by_layer[k]:.3f}" for k in sorted(by_layer))


def _rise_fall(rows: list[Row]) -> Finding | None:
    picked = [
        r for r in _pick(rows, "shape_of_learning", "twonn_dimension") if r["layer"] is not None
    ]
    if not picked:
        return None
    by_step = _mean_by(picked, "step")
    steps = sorted(by_step)
    peak = max(steps, key=by_step.__getitem__)
    trace = ", ".join(f"{step_label(s)}: {by_step[s]:.1f}" for s in steps)
    return Finding(
        "intrinsic dimension rises early, then falls",
        len(steps) >= 3
        and peak not in (steps[0], steps[-1])
        and by_step[peak] > 1.05 * by_step[steps[0]]
        and by_step[steps[-1]] < by_step[peak] / 1.05,
        f"TwoNN (mean over layers) by step — {trace}",
    )


def _energy_trend(rows: list[Row]) -> Finding | None:
    ratios = [r for r in _pick(rows, "tangent_energy", "energy_ratio") if r["freq_bin"] == "all"]
    picked = [r for r in ratios if r["method"] != MEAN_DIRECTION]
    if not picked:
        return None
    by_step = _mean_by(picked, "step")
    steps = [s for s in sorted(by_step) if s != INIT_STEP] or [INIT_STEP]
    early = steps[: max(1, math.ceil(0.3 * len(steps)))]
    early_ratio = statistics.fmean(by_step[s] for s in early)
    late_ratio = by_step[steps[-1]]
    above_init = early_ratio > by_step.get(INIT_STEP, -math.inf) or steps == [INIT_STEP]
    return Finding(
        "tangent/normal energy ratio well above 1 early (and above its step-0 value), smaller late",
        early_ratio > 1.5 and late_ratio < early_ratio and above_init,
        f"mean energy ratio over steps {early}: {early_ratio:.2f}; at step {steps[-1]}: "
        f"{late_ratio:.2f}"
        + _at_init(by_step, lambda s: f"{by_step[s]:.2f}")
        + _mean_direction_trend(ratios),
    )


def _mean_direction_trend(ratios: list[Row]) -> str:
    """The rank-1 mean direction's energy ratio at the first and last step (or nothing)."""
    by_step = _mean_by([r for r in ratios if r["method"] == MEAN_DIRECTION], "step")
    if not by_step:
        return ""
    first, last = min(by_step), max(by_step)
    return (
        f" (mean direction m̂, rank 1: {by_step[first]:.2f} at step {step_label(first)}, "
        f"{by_step[last]:.2f} at step {last})"
    )


def _frequency(rows: list[Row]) -> Finding | None:
    picked = _pick(rows, "frequency_geometry", "freq_distance_pearson")
    if not picked:
        return None
    by_step = _mean_by(picked, "step")
    first, last = min(by_step), max(by_step)
    n_sites = sum(r["step"] == last for r in picked)
    return Finding(
        "log-frequency correlates negatively with centroid distance",
        by_step[last] < 0,
        f"Pearson at step {last}, mean over {n_sites} sites: {by_step[last]:.2f} (seeds: ≈ −0.5;"
        f" at step {step_label(first)}: {by_step[first]:.2f})",
    )


def reproduction_summary(rows: list[Row]) -> list[Finding]:
    """The findings the run's probes can speak to."""
    checks = (_bell, _rise_fall, _energy_trend, _frequency)
    return [f for f in (check(rows) for check in checks) if f is not None]
