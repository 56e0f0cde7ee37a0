"""What a verdict on a paper's finding is made of (METHODS.md §1.9): the :class:`Finding` a
probe's findings function returns (declared with its probe: ``Reporting.findings``, read by the
run's reproduction summary) and the rules every verdict shares.

A verdict names the metric, its control family or null, and the site kind it reads (one verdict
per site kind: ``resid_post`` and ``mlp_out`` are never averaged together). It is given only
from **≥ 3 scored steps** (:data:`MIN_STEPS`) against a **baseline** — step 0 (random weights)
where the run has it, else its earliest scored step, named as such (:class:`Steps`) — and a
finding "holds" only when its effect lies beyond its null; otherwise the finding is "not
testable from this run" (:data:`NOT_TESTABLE`), with the reason.

Every mean a verdict compares across steps averages **the same set** of (method, layer, site)
at each of those steps (:func:`same_cells`): a method or a layer present at some of the compared
steps only is left out of all of them, and the evidence says so (:func:`left_out`). Where the
rows carry an interval the verdict reads it:

* a mean over cells has the interval of the means of its rows' ends (:class:`Estimate`: the
  exact interval of the mean when the rows' errors move together; wider — conservative — when
  they do not);
* "above 1" means the interval's lower end is above 1;
* "A above B" (or "smaller late") means the difference is at least :data:`NULL_SDS` standard
  deviations (:func:`sds_apart`), each side's sd read from the half of its interval that faces
  the other (``(value − low) / 1.96`` for the larger, ``(high − value) / 1.96`` for the
  smaller), combined as ``√(sd_A² + sd_B²)`` — the sd of the difference when the steps' errors
  are independent, and an upper bound when they are positively correlated, as on the same
  analysed sequences.

Light: no torch.

>>> step_label(0), step_label(40)
('0 (init)', '40')
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tangentlens.models.sites import site_kind

__all__ = [
    "INIT_STEP",
    "MIN_STEPS",
    "NOT_TESTABLE",
    "NULL_SDS",
    "Estimate",
    "Finding",
    "Findings",
    "Steps",
    "cell",
    "left_out",
    "mean_by",
    "per_kind",
    "pick",
    "same_cells",
    "sds_apart",
    "step_label",
    "steps_of",
    "tokens_seen",
    "untestable",
]

#: The checkpoint at initialisation (random weights).
INIT_STEP = 0
#: Scored steps a verdict needs: a baseline, and at least two steps after it.
MIN_STEPS = 3
#: The verdict of a finding the run cannot speak to.
NOT_TESTABLE = "not testable from this run"
#: Standard deviations (of a null, or of a difference) an effect must lie beyond.
NULL_SDS = 2.0
#: The normal quantile of the rows' 95 % intervals: half-width / this = one sd.
Z_95 = 1.959963984540054

Row = dict[str, Any]
#: What a mean over steps holds fixed: a row's (method, layer, site).
Cell = tuple[Any, Any, Any]


def step_label(step: int) -> str:
    """``"0 (init)"`` for the step-0 checkpoint, the step number otherwise."""
    return f"{step} (init)" if step == INIT_STEP else str(step)


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


#: A probe's findings function: the run's rows → its verdicts (``Reporting.findings``).
Findings = Callable[[list[Row]], list[Finding]]


def untestable(claim: str, reason: str) -> Finding:
    """The finding ``claim``, not testable from this run for ``reason``."""
    return Finding(claim, None, reason)


def _kind(r: Row) -> str:
    site = r.get("site") or "-"
    return site_kind(site) or site


def pick(rows: list[Row], probe: str, metric: str, layered: bool = False) -> dict[str, list[Row]]:
    """The probe's rows of ``metric`` over every token with a value at a checkpoint, by site
    kind (``layered``: only rows of a block's sites, for findings over depth)."""
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


def per_kind(
    rows: list[Row],
    probe: str,
    metric: str,
    check: Callable[[str, list[Row]], Finding],
    layered: bool = False,
) -> list[Finding]:
    """``check(kind, rows)`` for each site kind with rows of the probe's ``metric``
    (:func:`pick`)."""
    return [check(kind, picked) for kind, picked in pick(rows, probe, metric, layered).items()]


def cell(r: Row) -> Cell:
    """What a mean over steps must hold fixed: the row's (method, layer, site)."""
    return (r.get("method"), r.get("layer"), r.get("site"))


def _cell_label(c: Cell) -> str:
    method, layer, site = c
    where = site if layer is None else f"L{layer}"
    return where if method in (None, "-") else f"{method} {where}"


def same_cells(rows: list[Row], steps: Iterable[int]) -> tuple[list[Row], list[Cell]]:
    """The rows of ``steps`` restricted to the (method, layer, site) cells present at every one
    of them, and the cells left out (present at some of them only), sorted."""
    wanted = set(steps)
    by_step: dict[int, set[Cell]] = {s: set() for s in wanted}
    for r in rows:
        if r["step"] in wanted:
            by_step[r["step"]].add(cell(r))
    common = set.intersection(*by_step.values()) if by_step else set()
    dropped = set().union(*by_step.values()) - common
    kept = [r for r in rows if r["step"] in wanted and cell(r) in common]
    return kept, sorted(dropped, key=str)


def left_out(dropped: list[Cell], why: str = "not scored at every compared step") -> str:
    """``"; left out (not scored at every compared step): pca L3, …"`` or nothing."""
    if not dropped:
        return ""
    listed = ", ".join(_cell_label(c) for c in dropped[:6])
    more = f", … {len(dropped) - 6} more" if len(dropped) > 6 else ""
    return f"; left out ({why}): {listed}{more}"


def mean_by(rows: Iterable[Row], key: str) -> dict[Any, float]:
    """The mean value of ``rows`` per value of their ``key``, keys sorted."""
    grouped: dict[Any, list[float]] = defaultdict(list)
    for r in rows:
        grouped[r[key]].append(r["value"])
    return {k: statistics.fmean(v) for k, v in sorted(grouped.items())}


def tokens_seen(rows: list[Row]) -> dict[int, int | None]:
    """Each step's tokens seen, as its rows say."""
    seen: dict[int, int | None] = {}
    for r in rows:
        seen[r["step"]] = r.get("tokens_seen")
    return seen


@dataclass(frozen=True)
class Estimate:
    """A mean over cells with the interval of the means of its rows' ends."""

    value: float
    low: float
    high: float

    @classmethod
    def of(cls, rows: list[Row]) -> Estimate:
        return cls(
            statistics.fmean(r["value"] for r in rows),
            statistics.fmean(r["ci_low"] for r in rows),
            statistics.fmean(r["ci_high"] for r in rows),
        )

    @classmethod
    def mean(cls, estimates: list[Estimate]) -> Estimate:
        return cls(
            statistics.fmean(e.value for e in estimates),
            statistics.fmean(e.low for e in estimates),
            statistics.fmean(e.high for e in estimates),
        )

    def __str__(self) -> str:
        return f"{self.value:.2f} [{self.low:.2f}, {self.high:.2f}]"


def sds_apart(larger: Estimate, smaller: Estimate) -> float:
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
class Steps:
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


def steps_of(rows: list[Row]) -> Steps:
    """The scored steps of ``rows``."""
    return Steps(sorted({r["step"] for r in rows}))
