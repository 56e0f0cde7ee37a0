"""Which of the seed papers' qualitative findings hold on this run, each with its numbers
(METHODS.md §1.9).

A verdict names the metric, its control family or null, and the site kind it reads (one verdict
per site kind: ``resid_post`` and ``mlp_out`` are never averaged together). It is given only
from **≥ 3 scored steps** against a **baseline** — step 0 (random weights) where the run has
it, else its earliest scored step, named as such — and a finding "holds" only when its effect
lies beyond its null; otherwise the finding is "not testable from this run", with the reason.

Every mean a verdict compares across steps averages **the same set** of (method, layer, site)
at each of those steps (:func:`_same_cells`): a method or a layer present at some of the
compared steps only is left out of all of them, and the evidence says so. Where the rows carry
an interval the verdict reads it:

* a mean over cells has the interval of the means of its rows' ends (the exact interval of the
  mean when the rows' errors move together; wider — conservative — when they do not);
* "above 1" means the interval's lower end is above 1;
* "A above B" (or "smaller late") means the difference is at least :data:`NULL_SDS` standard
  deviations, each side's sd read from the half of its interval that faces the other
  (``(value − low) / 1.96`` for the larger, ``(high − value) / 1.96`` for the smaller), combined
  as ``√(sd_A² + sd_B²)`` — the sd of the difference when the steps' errors are independent, and
  an upper bound when they are positively correlated, as on the same analysed sequences.

The findings:

* bell-shaped anisotropy over depth in decoders (Razzhigaev et al.; ``centred_anisotropy``,
  no interval and no null: read against the baseline's profile over the same layers): at the
  last step the peak is at an interior layer (≥ 3 layers), and the interior peak stands higher
  above the larger end layer than at the baseline (the bell grew with training; one that
  shrank from its baseline does not hold);
* intrinsic dimension rises then falls (Razzhigaev et al.; ``twonn_dimension``, mean over the
  layers scored at every step): it peaks at a step between the baseline and the last step, at
  least 5 % above the baseline, and ends at least 5 % below the peak;
* tangent energy well above 1 early and smaller late (Bernas et al.; ``energy_ratio``: the
  proxy over the exchangeable controls' exact mean, every layer and dictionary method of the
  site kind, the rank-1 mean direction reported on its own; it reads the rows' bootstrap
  intervals and is not testable without them): over the **early** steps — the scored steps
  after the baseline that had seen at most 30 % of the tokens the last scored step had seen —
  every step's interval lies above 1 and their mean exceeds 1.5, the early mean lies 2 sd above
  the baseline's and 2 sd above the last step's;
* log-frequency correlates negatively with centroid spread (Bernas et al.;
  ``freq_distance_pearson``, the Pearson with the Bessel-corrected spread, mean over the sites
  with a shuffle null at the last step and at the baseline): at the last step it is below 0,
  below its count-preserving shuffle null's mean by more than 2 null standard deviations
  (``freq_distance_pearson_null_mean`` / ``_std``; the null of the mean has at most the mean of
  the sites' sds), and below the baseline's by more than 2 sd (each step's shuffle-null sd
  standing for its statistic's: the Pearson rows carry no interval).
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

__all__ = [
    "EARLY_SHARE",
    "MIN_STEPS",
    "NOT_TESTABLE",
    "NULL_SDS",
    "Finding",
    "reproduction_summary",
]

#: The rank-1 mean-direction proxy (``tangentlens.proxies.MEAN_DIRECTION``).
MEAN_DIRECTION = "mean_direction"
#: Scored steps a verdict needs: a baseline, and at least two steps after it.
MIN_STEPS = 3
#: "Early": at most this share of the tokens the last scored step had seen.
EARLY_SHARE = 0.3
#: The verdict of a finding the run cannot speak to.
NOT_TESTABLE = "not testable from this run"
#: Standard deviations (of a null, or of a difference) an effect must lie beyond.
NULL_SDS = 2.0
#: The normal quantile of the rows' 95 % intervals: half-width / this = one sd.
Z_95 = 1.959963984540054
#: What "well above 1" means for the early energy ratio (besides every interval above 1).
WELL_ABOVE = 1.5

Row = dict[str, Any]
Cell = tuple[Any, Any, Any]


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


def _cell(r: Row) -> Cell:
    """What a mean over steps must hold fixed: the row's (method, layer, site)."""
    return (r.get("method"), r.get("layer"), r.get("site"))


def _cell_label(cell: Cell) -> str:
    method, layer, site = cell
    where = site if layer is None else f"L{layer}"
    return where if method in (None, "-") else f"{method} {where}"


def _same_cells(rows: list[Row], steps: Iterable[int]) -> tuple[list[Row], list[Cell]]:
    """The rows of ``steps`` restricted to the (method, layer, site) cells present at every one
    of them, and the cells left out (present at some of them only), sorted."""
    wanted = set(steps)
    by_step: dict[int, set[Cell]] = {s: set() for s in wanted}
    for r in rows:
        if r["step"] in wanted:
            by_step[r["step"]].add(_cell(r))
    common = set.intersection(*by_step.values()) if by_step else set()
    dropped = set().union(*by_step.values()) - common
    kept = [r for r in rows if r["step"] in wanted and _cell(r) in common]
    return kept, sorted(dropped, key=str)


def _left_out(dropped: list[Cell], why: str = "not scored at every compared step") -> str:
    """``"; left out (not scored at every compared step): pca L3, …"`` or nothing."""
    if not dropped:
        return ""
    listed = ", ".join(_cell_label(c) for c in dropped[:6])
    more = f", … {len(dropped) - 6} more" if len(dropped) > 6 else ""
    return f"; left out ({why}): {listed}{more}"


def _mean_by(rows: Iterable[Row], key: str) -> dict[Any, float]:
    grouped: dict[Any, list[float]] = defaultdict(list)
    for r in rows:
        grouped[r[key]].append(r["value"])
    return {k: statistics.fmean(v) for k, v in sorted(grouped.items())}


@dataclass(frozen=True)
class _Estimate:
    """A mean over cells with the interval of the means of its rows' ends."""

    value: float
    low: float
    high: float

    @classmethod
    def of(cls, rows: list[Row]) -> _Estimate:
        return cls(
            statistics.fmean(r["value"] for r in rows),
            statistics.fmean(r["ci_low"] for r in rows),
            statistics.fmean(r["ci_high"] for r in rows),
        )

    @classmethod
    def mean(cls, estimates: list[_Estimate]) -> _Estimate:
        return cls(
            statistics.fmean(e.value for e in estimates),
            statistics.fmean(e.low for e in estimates),
            statistics.fmean(e.high for e in estimates),
        )

    def __str__(self) -> str:
        return f"{self.value:.2f} [{self.low:.2f}, {self.high:.2f}]"


def _sds_apart(larger: _Estimate, smaller: _Estimate) -> float:
    """``larger − smaller`` in sd of the difference, each sd read from the half of its interval
    facing the other, combined as √(sd₁² + sd₂²) (inf when both intervals are points)."""
    below = (larger.value - larger.low) / Z_95
    above = (smaller.high - smaller.value) / Z_95
    sd = math.hypot(max(below, 0.0), max(above, 0.0))
    difference = larger.value - smaller.value
    if sd > 0:
        return difference / sd
    return math.copysign(math.inf, difference) if difference else 0.0


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


def _steps_of(rows: list[Row]) -> _Steps:
    return _Steps(sorted({r["step"] for r in rows}))


def _untestable(claim: str, reason: str) -> Finding:
    return Finding(claim, None, reason)


def _bell(kind: str, picked: list[Row]) -> Finding:
    claim = (
        f"bell-shaped anisotropy over depth (centred_anisotropy σ₁²/Σσ², no null: read against "
        f"the baseline's profile) at {kind}"
    )
    steps = _steps_of(picked)
    reason = steps.too_few()
    if reason:
        return _untestable(claim, reason)
    same, dropped = _same_cells(picked, (steps.baseline, steps.last))
    last, base = _by_layer(same, steps.last), _by_layer(same, steps.baseline)
    if len(last) < 3:
        return _untestable(
            claim,
            f"{len(last)} layers scored at both step {steps.last} and the baseline (a bell "
            "needs ≥ 3)",
        )
    layers = sorted(last)
    peak = max(layers, key=last.__getitem__)
    grown = _bump(last) > max(_bump(base), 0.0)
    holds = peak not in (layers[0], layers[-1]) and grown
    return Finding(
        claim,
        holds,
        f"at step {steps.last}: {_profile(last)}; peak at L{peak}; baseline "
        f"{steps.baseline_label()}: {_profile(base)}" + _left_out(dropped),
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
    steps = _steps_of(picked)
    reason = steps.too_few()
    if reason:
        return _untestable(claim, reason)
    same, dropped = _same_cells(picked, steps.steps)
    if not same:
        return _untestable(claim, "no layer is scored at every step")
    by_step = _mean_by(same, "step")
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
        f"by step — {trace}; baseline {steps.baseline_label()}; peak at step {peak}"
        + _left_out(dropped),
    )


def _tokens_seen(rows: list[Row]) -> dict[int, int | None]:
    seen: dict[int, int | None] = {}
    for r in rows:
        seen[r["step"]] = r.get("tokens_seen")
    return seen


def _energy(kind: str, picked: list[Row]) -> Finding:
    claim = (
        "tangent energy ratio (energy_ratio: the proxy over the exchangeable controls' exact "
        f"mean, null 1; read with its bootstrap intervals) well above 1 early, above its "
        f"baseline, smaller late at {kind}"
    )
    tangent = [r for r in picked if r["method"] != MEAN_DIRECTION]
    steps = _steps_of(tangent)
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
    compared = [steps.baseline, *early, steps.last]
    same, dropped = _same_cells(tangent, compared)
    if not same:
        return _untestable(claim, "no (method, layer, site) is scored at every compared step")
    if any(r.get("ci_low") is None or r.get("ci_high") is None for r in same):
        return _untestable(
            claim,
            "the energy_ratio rows carry no interval (probes.tangent_energy.bootstrap = 0): the "
            "verdict reads the intervals",
        )
    at = {s: _Estimate.of([r for r in same if r["step"] == s]) for s in compared}
    early_mean = _Estimate.mean([at[s] for s in early])
    base, late = at[steps.baseline], at[steps.last]
    above_one = all(at[s].low > 1 for s in early)
    over_base, over_late = _sds_apart(early_mean, base), _sds_apart(early_mean, late)
    holds = (
        above_one
        and early_mean.value > WELL_ABOVE
        and over_base >= NULL_SDS
        and over_late >= NULL_SDS
    )
    per_step = ", ".join(f"{s}: {at[s]}" for s in early)
    cells = len({_cell(r) for r in same})
    return Finding(
        claim,
        holds,
        f"early steps (≤ {EARLY_SHARE:.0%} of the {seen[steps.last]:,} tokens seen by step "
        f"{steps.last}) {per_step}, mean {early_mean}; at step {steps.last}: {late}; baseline "
        f"{steps.baseline_label()}: {base}; early − baseline {_in_sd(over_base)}, early − late "
        f"{_in_sd(over_late)}; mean over the same {cells} (method, layer, site) at every "
        f"compared step" + _left_out(dropped) + _mean_direction_trend(picked),
    )


def _in_sd(sds: float) -> str:
    return f"{sds:+.1f} sd"


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
        f"beyond {NULL_SDS:g} sd of its count-preserving shuffle null, {NULL_SDS:g} sd below the "
        f"baseline) at {kind}"
    )
    steps = _steps_of(picked)
    reason = steps.too_few()
    if reason:
        return _untestable(claim, reason)
    last, baseline = steps.last, steps.baseline
    compared = (baseline, last)
    with_null = {
        (r["step"], _cell(r))
        for r in nulls.get("freq_distance_pearson_null_std", [])
        if r["step"] in compared
    } & {(r["step"], _cell(r)) for r in nulls.get("freq_distance_pearson_null_mean", [])}
    for step in (last, baseline):
        if not any(s == step for s, _ in with_null):
            return _untestable(
                claim,
                f"no shuffle null at step {step} (freq_distance_pearson_null_mean/_std: "
                "frequency_geometry.null_draws = 0, no reservoir, or too few sampled rows)",
            )
    usable = [r for r in picked if (r["step"], _cell(r)) in with_null]
    same, _ = _same_cells(usable, compared)
    if not same:
        return _untestable(claim, "no site has the Pearson and its null at both compared steps")
    cells = {_cell(r) for r in same}
    dropped = sorted({_cell(r) for r in picked if r["step"] in compared} - cells, key=str)

    def mean(rows: list[Row], step: int) -> float:
        return statistics.fmean(r["value"] for r in rows if r["step"] == step and _cell(r) in cells)

    observed, base = mean(same, last), mean(same, baseline)
    null_mean = mean(nulls["freq_distance_pearson_null_mean"], last)
    null_sd = mean(nulls["freq_distance_pearson_null_std"], last)
    base_sd = mean(nulls["freq_distance_pearson_null_std"], baseline)
    beyond = observed < null_mean - NULL_SDS * null_sd
    spread = math.hypot(null_sd, base_sd)  # the change's sd: √(sd_last² + sd_baseline²)
    below = (base - observed) / spread if spread > 0 else (math.inf if base > observed else 0.0)
    return Finding(
        claim,
        observed < 0 and beyond and below >= NULL_SDS,
        f"Pearson at step {last}, mean over {len(cells)} site{'s' * (len(cells) != 1)}: "
        f"{observed:.3f}; shuffle null {null_mean:.3f} ± {null_sd:.3f} (effect "
        f"{_in_sds(observed - null_mean, null_sd)}); baseline {steps.baseline_label()}: "
        f"{base:.3f} ± {base_sd:.3f} (change {_in_sds(observed - base, spread)}; seeds: ≈ −0.5, "
        "for a statistic of their own)"
        + _left_out(dropped, "no shuffle null, or not scored at both compared steps"),
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
