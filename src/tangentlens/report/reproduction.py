"""Which of the seed papers' qualitative findings hold on this run, each with its numbers
(METHODS.md §1.9).

A verdict names the metric, its control family or null, and the site kind it reads (one verdict
per site kind: ``resid_post`` and ``mlp_out`` are never averaged together). It is given only
from **≥ 3 scored steps** against a **baseline** — step 0 (random weights) where the run has
it, else its earliest scored step, named as such — and a finding "holds" only when its effect
lies beyond its null; otherwise the finding is "not testable from this run", with the reason.

* bell-shaped anisotropy over depth in decoders (Razzhigaev et al.; ``centred_anisotropy``):
  at the last step the peak is at an interior layer (≥ 3 layers), and the interior peak stands
  higher above the larger end layer than at the baseline (the bell grew with training);
* intrinsic dimension rises then falls (Razzhigaev et al.; ``twonn_dimension``, mean over
  layers): it peaks at a step between the baseline and the last step, at least 5 % above the
  baseline, and ends at least 5 % below the peak;
* tangent energy well above 1 early and smaller late (Bernas et al.; ``energy_ratio``: the
  proxy over the exchangeable controls' exact mean, every layer and dictionary method of the
  site kind, the rank-1 mean direction reported on its own): the mean over the **early** steps —
  the scored steps after the baseline that had seen at most 30 % of the tokens the last scored
  step had seen — is > 1.5, above the baseline's and above the last step's;
* log-frequency correlates negatively with centroid spread (Bernas et al.;
  ``freq_distance_pearson``, the Pearson with the Bessel-corrected spread, mean over layers):
  at the last step it is below 0, below its count-preserving shuffle null's mean by more than 2
  null standard deviations (``freq_distance_pearson_null_mean`` / ``_std``), and below the
  baseline's.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tangentlens.models.sites import site_kind
from tangentlens.report.baseline import INIT_STEP, step_label

__all__ = ["EARLY_SHARE", "MIN_STEPS", "NOT_TESTABLE", "Finding", "reproduction_summary"]

#: The rank-1 mean-direction proxy (``tangentlens.proxies.MEAN_DIRECTION``).
MEAN_DIRECTION = "mean_direction"
#: Scored steps a verdict needs: a baseline, and at least two steps after it.
MIN_STEPS = 3
#: "Early": at most this share of the tokens the last scored step had seen.
EARLY_SHARE = 0.3
#: The verdict of a finding the run cannot speak to.
NOT_TESTABLE = "not testable from this run"
#: Null standard deviations an effect must lie beyond.
NULL_SDS = 2.0

Row = dict[str, Any]


@dataclass(frozen=True)
class Finding:
    """One claim of a paper (naming its metric, null and site kind), whether this run
    reproduces it (``holds``: True, False, or None when it is not testable from this run) and
    the numbers that say so (or why it cannot be tested)."""

    claim: str
    holds: bool | None
    evidence: str

    @property
    def verdict(self) -> str:
        """``"holds"``, ``"does not hold"`` or :data:`NOT_TESTABLE`."""
        if self.holds is None:
            return NOT_TESTABLE
        return "holds" if self.holds else "does not hold"


def _kind(r: Row) -> str:
    site = r.get("site") or "-"
    return site_kind(site) or site


def _pick(rows: list[Row], probe: str, metric: str, layered: bool = False) -> dict[str, list[Row]]:
    """The probe's rows of ``metric`` over every token with a value, by site kind (``layered``:
    only rows of a block's sites, for findings over depth)."""
    out: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        value = r["value"]
        if (
            r["probe"] == probe
            and r["metric"] == metric
            and r.get("freq_bin", "all") == "all"
            and value is not None
            and not math.isnan(value)
            and r["step"] is not None
            and r["step"] >= 0
            and (not layered or r["layer"] is not None)
        ):
            out[_kind(r)].append(r)
    return dict(sorted(out.items()))


def _mean_by(rows: Iterable[Row], key: str) -> dict[Any, float]:
    grouped: dict[Any, list[float]] = defaultdict(list)
    for r in rows:
        grouped[r[key]].append(r["value"])
    return {k: statistics.fmean(v) for k, v in sorted(grouped.items())}


@dataclass(frozen=True)
class _Steps:
    """The scored steps of a metric and its baseline (step 0, else the earliest)."""

    steps: list[int]

    @property
    def baseline(self) -> int:
        return INIT_STEP if INIT_STEP in self.steps else self.steps[0]

    @property
    def last(self) -> int:
        return self.steps[-1]

    def baseline_label(self) -> str:
        if self.baseline == INIT_STEP:
            return f"step {step_label(INIT_STEP)}"
        return f"step {self.baseline} (the earliest scored: no step 0)"

    def too_few(self) -> str | None:
        """Why the steps cannot carry a verdict, or None."""
        n = len(self.steps)
        if n >= MIN_STEPS:
            return None
        listed = ", ".join(map(str, self.steps)) or "none"
        return (
            f"{n} scored step{'s' * (n != 1)} with this metric ({listed}); a verdict needs "
            f"≥ {MIN_STEPS}: a baseline (step 0, else the earliest) and two later steps"
        )


def _untestable(claim: str, reason: str) -> Finding:
    return Finding(claim, None, reason)


def _bell(kind: str, picked: list[Row]) -> Finding:
    claim = (
        f"bell-shaped anisotropy over depth (centred_anisotropy σ₁²/Σσ², no null: read against "
        f"the baseline's profile) at {kind}"
    )
    steps = _Steps(sorted({r["step"] for r in picked}))
    reason = steps.too_few()
    if reason:
        return _untestable(claim, reason)
    last, base = _by_layer(picked, steps.last), _by_layer(picked, steps.baseline)
    if len(last) < 3:
        return _untestable(claim, f"{len(last)} layers at step {steps.last} (a bell needs ≥ 3)")
    layers = sorted(last)
    peak = max(layers, key=last.__getitem__)
    holds = peak not in (layers[0], layers[-1]) and _bump(last) > _bump(base)
    return Finding(
        claim,
        holds,
        f"at step {steps.last}: {_profile(last)}; peak at L{peak}; baseline "
        f"{steps.baseline_label()}: {_profile(base)}",
    )


def _bump(by_layer: dict[Any, float]) -> float:
    """How far the highest interior layer stands above the larger end layer (−inf: none)."""
    layers = sorted(by_layer)
    inner = [by_layer[k] for k in layers[1:-1]]
    if not inner:
        return -math.inf
    return max(inner) - max(by_layer[layers[0]], by_layer[layers[-1]])


def _by_layer(rows: list[Row], step: int) -> dict[Any, float]:
    return _mean_by((r for r in rows if r["step"] == step), "layer")


def _profile(by_layer: dict[Any, float]) -> str:
    """``"L0 0.115, L1 0.135"``."""
    return ", ".join(f"L{k} {by_layer[k]:.3f}" for k in sorted(by_layer))


def _rise_fall(kind: str, picked: list[Row]) -> Finding:
    claim = (
        f"intrinsic dimension rises early, then falls (twonn_dimension, mean over layers, "
        f"against the baseline) at {kind}"
    )
    by_step = _mean_by(picked, "step")
    steps = _Steps(list(by_step))
    reason = steps.too_few()
    if reason:
        return _untestable(claim, reason)
    after = [s for s in steps.steps if s > steps.baseline]
    peak = max(after, key=by_step.__getitem__)
    holds = (
        peak != steps.last
        and by_step[peak] > 1.05 * by_step[steps.baseline]
        and by_step[steps.last] < by_step[peak] / 1.05
    )
    trace = ", ".join(f"{step_label(s)}: {by_step[s]:.1f}" for s in steps.steps)
    return Finding(
        claim,
        holds,
        f"by step — {trace}; baseline {steps.baseline_label()}; peak at step {peak}",
    )


def _tokens_seen(rows: list[Row]) -> dict[int, int | None]:
    seen: dict[int, int | None] = {}
    for r in rows:
        seen[r["step"]] = r.get("tokens_seen")
    return seen


def _energy(kind: str, picked: list[Row]) -> Finding:
    claim = (
        "tangent energy ratio (energy_ratio: the proxy over the exchangeable controls' exact "
        f"mean, null 1) well above 1 early, above its baseline, smaller late at {kind}"
    )
    tangent = [r for r in picked if r["method"] != MEAN_DIRECTION]
    by_step = _mean_by(tangent, "step")
    steps = _Steps(list(by_step))
    reason = steps.too_few()
    if reason:
        return _untestable(claim, reason)
    seen = _tokens_seen(tangent)
    unknown = [s for s in steps.steps if seen.get(s) is None]
    if unknown:
        return _untestable(
            claim, f'tokens seen unknown at step {unknown[0]}: "early" cannot be defined'
        )
    horizon = EARLY_SHARE * seen[steps.last]  # type: ignore[operator]
    early = [s for s in steps.steps if steps.baseline < s < steps.last and seen[s] <= horizon]
    if not early:
        return _untestable(
            claim,
            f"no scored step between the baseline ({steps.baseline_label()}) and step "
            f"{steps.last} within the first {EARLY_SHARE:.0%} of its {seen[steps.last]:,} "
            "tokens seen",
        )
    early_ratio = statistics.fmean(by_step[s] for s in early)
    base, late = by_step[steps.baseline], by_step[steps.last]
    holds = early_ratio > 1.5 and early_ratio > base and late < early_ratio
    return Finding(
        claim,
        holds,
        f"mean over the early steps {early} (≤ {EARLY_SHARE:.0%} of the {seen[steps.last]:,} "
        f"tokens seen by step {steps.last}): {early_ratio:.2f}; at step {steps.last}: "
        f"{late:.2f}; baseline {steps.baseline_label()}: {base:.2f}"
        + _mean_direction_trend(picked),
    )


def _mean_direction_trend(picked: list[Row]) -> str:
    """The rank-1 mean direction's energy ratio at the first and last step (or nothing)."""
    by_step = _mean_by([r for r in picked if r["method"] == MEAN_DIRECTION], "step")
    if not by_step:
        return ""
    first, last = min(by_step), max(by_step)
    return (
        f" (mean direction m̂, rank 1: {by_step[first]:.2f} at step {step_label(first)}, "
        f"{by_step[last]:.2f} at step {last})"
    )


def _frequency(kind: str, picked: list[Row], nulls: dict[str, list[Row]]) -> Finding:
    claim = (
        "log-frequency correlates negatively with centroid spread (freq_distance_pearson, "
        f"beyond {NULL_SDS:g} sd of its count-preserving shuffle null, below the baseline) at "
        f"{kind}"
    )
    by_step = _mean_by(picked, "step")
    steps = _Steps(list(by_step))
    reason = steps.too_few()
    if reason:
        return _untestable(claim, reason)
    last = steps.last
    means = [r for r in nulls.get("freq_distance_pearson_null_mean", []) if r["step"] == last]
    sds = [r for r in nulls.get("freq_distance_pearson_null_std", []) if r["step"] == last]
    if not means or not sds:
        return _untestable(
            claim,
            f"no shuffle null at step {last} (freq_distance_pearson_null_mean/_std: "
            "frequency_geometry.null_draws = 0, no reservoir, or too few sampled rows)",
        )
    null_mean = statistics.fmean(r["value"] for r in means)
    null_sd = statistics.fmean(r["value"] for r in sds)
    observed, base = by_step[last], by_step[steps.baseline]
    beyond = observed < null_mean - NULL_SDS * null_sd
    n_sites = sum(r["step"] == last for r in picked)
    return Finding(
        claim,
        observed < 0 and beyond and observed < base,
        f"Pearson at step {last}, mean over {n_sites} site{'s' * (n_sites != 1)}: "
        f"{observed:.3f}; shuffle null {null_mean:.3f} ± {null_sd:.3f} (effect "
        f"{_in_sds(observed - null_mean, null_sd)}); baseline {steps.baseline_label()}: "
        f"{base:.3f} (seeds: ≈ −0.5, for a statistic of their own)",
    )


def _in_sds(effect: float, sd: float) -> str:
    return f"{effect / sd:+.1f} null sd" if sd > 0 else f"{effect:+.3f}, null sd 0"


def _per_kind(
    rows: list[Row],
    probe: str,
    metric: str,
    check: Callable[[str, list[Row]], Finding],
    layered: bool = False,
) -> list[Finding]:
    return [check(kind, picked) for kind, picked in _pick(rows, probe, metric, layered).items()]


def reproduction_summary(rows: list[Row]) -> list[Finding]:
    """The findings the run's probes can speak to, one per site kind with the metric's rows."""
    out = _per_kind(rows, "shape_of_learning", "centred_anisotropy", _bell, layered=True)
    out += _per_kind(rows, "shape_of_learning", "twonn_dimension", _rise_fall, layered=True)
    out += _per_kind(rows, "tangent_energy", "energy_ratio", _energy)
    nulls = {
        metric: _pick(rows, "frequency_geometry", metric)
        for metric in ("freq_distance_pearson_null_mean", "freq_distance_pearson_null_std")
    }
    for kind, picked in _pick(rows, "frequency_geometry", "freq_distance_pearson").items():
        out.append(_frequency(kind, picked, {m: by.get(kind, []) for m, by in nulls.items()}))
    return out
