"""Which of the seed papers' qualitative findings hold on this run, each with its numbers.

* bell-shaped anisotropy over depth in decoders (Razzhigaev et al.): at the last step, centred
  anisotropy peaks at an interior layer;
* intrinsic dimension rises then falls (Razzhigaev et al.): the layer-averaged TwoNN dimension
  peaks at an interior step at least 5 % above the first step's and ends at least 5 % below
  the peak;
* tangent/normal energy ratio well above 1 early and smaller late (Bernas et al.): mean
  ``energy_ratio`` (all tokens, every site and dictionary method; the rank-1 mean direction is
  reported on its own) over the early 30 % of steps > 1.5 and above the last step's;
* negative correlation of log-frequency with centroid distance (Bernas et al.): the last step's
  Spearman correlation, averaged over layers, < 0 (the first step's is given as context: at
  initialisation it should be near 0).

Each finding is stated whichever way it comes out.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

__all__ = ["Finding", "reproduction_summary"]

#: The rank-1 mean-direction proxy (``tangentlens.probes.proxies.MEAN_DIRECTION``).
MEAN_DIRECTION = "mean_direction"

Row = dict[str, Any]


@dataclass(frozen=True)
class Finding:
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


def _bell(rows: list[Row]) -> Finding | None:
    picked = [
        r for r in _pick(rows, "shape_of_learning", "centred_anisotropy") if r["layer"] is not None
    ]
    if not picked:
        return None
    last = max(r["step"] for r in picked)
    by_layer = _mean_by([r for r in picked if r["step"] == last], "layer")
    layers = sorted(by_layer)
    peak = max(layers, key=by_layer.__getitem__)
    profile = ", ".join(f"L{k} {by_layer[k]:.3f}" for k in layers)
    return Finding(
        "bell-shaped anisotropy over depth (peak in a middle layer)",
        len(layers) >= 3 and peak not in (layers[0], layers[-1]),
        f"centred anisotropy at step {last}: {profile}; peak at L{peak}",
    )


def _rise_fall(rows: list[Row]) -> Finding | None:
    picked = [
        r for r in _pick(rows, "shape_of_learning", "twonn_dimension") if r["layer"] is not None
    ]
    if not picked:
        return None
    by_step = _mean_by(picked, "step")
    steps = sorted(by_step)
    peak = max(steps, key=by_step.__getitem__)
    trace = ", ".join(f"{s}: {by_step[s]:.1f}" for s in steps)
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
    steps = sorted(by_step)
    early = steps[: max(1, math.ceil(0.3 * len(steps)))]
    early_ratio = statistics.fmean(by_step[s] for s in early)
    late_ratio = by_step[steps[-1]]
    return Finding(
        "tangent/normal energy ratio well above 1 early, smaller late",
        early_ratio > 1.5 and late_ratio < early_ratio,
        f"mean energy ratio over steps {early}: {early_ratio:.2f}; at step {steps[-1]}: "
        f"{late_ratio:.2f}" + _mean_direction_trend(ratios),
    )


def _mean_direction_trend(ratios: list[Row]) -> str:
    """The rank-1 mean direction's energy ratio at the first and last step (or nothing)."""
    by_step = _mean_by([r for r in ratios if r["method"] == MEAN_DIRECTION], "step")
    if not by_step:
        return ""
    first, last = min(by_step), max(by_step)
    return (
        f" (mean direction m̂, rank 1: {by_step[first]:.2f} at step {first}, "
        f"{by_step[last]:.2f} at step {last})"
    )


def _frequency(rows: list[Row]) -> Finding | None:
    picked = _pick(rows, "frequency_geometry", "freq_distance_spearman")
    if not picked:
        return None
    by_step = _mean_by(picked, "step")
    first, last = min(by_step), max(by_step)
    n_sites = sum(r["step"] == last for r in picked)
    return Finding(
        "log-frequency correlates negatively with centroid distance",
        by_step[last] < 0,
        f"Spearman at step {last}, mean over {n_sites} sites: {by_step[last]:.2f} (seeds: ≈ −0.5;"
        f" at step {first}: {by_step[first]:.2f})",
    )


def reproduction_summary(rows: list[Row]) -> list[Finding]:
    """The findings the run's probes can speak to."""
    checks = (_bell, _rise_fall, _energy_trend, _frequency)
    return [f for f in (check(rows) for check in checks) if f is not None]
