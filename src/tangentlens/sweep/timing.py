"""What a sweep costs: each unit's measured time, and a whole sweep's time predicted from them.

Every unit writes ``timings/<unit>.json`` (its kind, step and seconds of work, wherever it ran)
when it finishes. A sweep's cost splits into a **fixed** part, paid once whatever the number of
steps — the analysis data, the fit window's captures, the frozen fit (and the published SAEs'
selection) — and a **marginal** part per checkpoint, the step unit (load, capture, every probe,
the part write), plus the across-steps unit. With ``P`` units running at once::

    predicted = data + ⌈windows / P⌉ · window + fit + ⌈steps / P⌉ · step + across
                (+ the model-free units when P = 1: otherwise they run beside the others)

(the critical path of the plan's graph with the units of one kind taking their median time).
:func:`sweep_cost` reads the timings of a run directory; :func:`predicted_seconds` evaluates the
formula for any number of steps, so one measured step predicts a whole suite.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tangentlens.core.recipe import Recipe
from tangentlens.sweep.plan import Plan

__all__ = [
    "TIMINGS_DIR",
    "SweepCost",
    "parallel_units",
    "plan_counts",
    "plan_time_line",
    "predicted_seconds",
    "read_unit_times",
    "step_parts",
    "sweep_cost",
    "time_line",
    "time_summary",
    "timing_record",
]

#: Where the units' timings are written, relative to the run directory.
TIMINGS_DIR = "timings"


def timing_record(
    kind: str,
    step: int | None,
    seconds: float,
    host: str,
    parts: Mapping[str, float] | None = None,
) -> str:
    """The JSON text of one unit's ``timings/<unit>.json``; ``parts``: where its time went
    (phase → seconds, e.g. a step's capture and each probe), when timed."""
    record: dict[str, Any] = {"kind": kind, "step": step, "seconds": seconds, "host": host}
    if parts:
        record["parts"] = dict(parts)
    return json.dumps(record)


def step_parts(times: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Where a step unit's time went (phase → seconds), from a run's unit timings
    (:func:`read_unit_times`): the median over its step units, phase by phase, in the order
    the phases ran; empty when no step unit recorded its parts."""
    by_phase: dict[str, list[float]] = {}
    for record in times.values():
        parts = record.get("parts")
        if record.get("kind") == "step" and isinstance(parts, dict):
            for phase, seconds in parts.items():
                by_phase.setdefault(str(phase), []).append(float(seconds))
    return {phase: statistics.median(values) for phase, values in by_phase.items()}


def read_unit_times(root: str | Path) -> dict[str, dict[str, Any]]:
    """Unit name → its timing record (``kind``, ``step``, ``seconds``, ``host``) for every unit
    of the run directory ``root`` that finished and recorded one (unreadable records are
    skipped: a timing is informative, never needed)."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted((Path(root) / TIMINGS_DIR).glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(record, dict) and isinstance(record.get("seconds"), int | float):
            out[path.stem] = record
    return out


@dataclass(frozen=True)
class SweepCost:
    """The median seconds of each kind of unit timed (``seconds``: kind → median, e.g.
    ``"step"`` = the marginal cost of a checkpoint) and how many of each were timed
    (``counts``)."""

    seconds: dict[str, float]
    counts: dict[str, int]

    @property
    def fixed(self) -> float:
        """Seconds paid once whatever the number of steps, in series: every timed unit but the
        steps and the across-steps unit."""
        return sum(
            self.seconds[kind] * n
            for kind, n in self.counts.items()
            if kind not in ("step", "across")
        )

    @property
    def step(self) -> float | None:
        """The marginal seconds of one checkpoint (None when no step unit was timed)."""
        return self.seconds.get("step")

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": dict(self.seconds), "counts": dict(self.counts), "fixed": self.fixed}


#: Unit kinds of earlier runs' timings, under their current name.
_RENAMED_KINDS = {"untrained": "model_free"}


def sweep_cost(times: dict[str, dict[str, Any]]) -> SweepCost:
    """The :class:`SweepCost` of a run's unit timings (:func:`read_unit_times`)."""
    by_kind: dict[str, list[float]] = {}
    for record in times.values():
        kind = str(record.get("kind"))
        by_kind.setdefault(_RENAMED_KINDS.get(kind, kind), []).append(float(record["seconds"]))
    return SweepCost(
        {kind: statistics.median(values) for kind, values in by_kind.items()},
        {kind: len(values) for kind, values in by_kind.items()},
    )


def parallel_units(recipe: Recipe) -> int | None:
    """Units the recipe's executor runs at once: 1 for ``local``, the concurrent workers for
    ``ray`` and ``submitit-local``, ``array_parallelism`` for ``slurm`` (None: unlimited)."""
    from tangentlens.sweep.executors.base import concurrent_units

    kind = recipe.executor.kind
    if kind == "local":
        return 1
    if kind == "slurm":
        return recipe.executor.array_parallelism or None
    return concurrent_units(recipe)


def predicted_seconds(
    cost: SweepCost, counts: Mapping[str, int], parallel: int | None
) -> float | None:
    """The predicted wall time of the units ``counts`` names (unit kind → how many; e.g.
    :func:`plan_counts`) at ``parallel`` units at once (None: unlimited), each taking the median
    time of its kind in ``cost`` (module docstring); None when a kind ``counts`` needs was never
    timed."""
    if parallel is not None and parallel < 1:
        raise ValueError(f"parallel must be ≥ 1 or None, got {parallel}")
    if any(n < 0 for n in counts.values()):
        raise ValueError(f"unit counts must be ≥ 0, got {dict(counts)}")
    total = 0.0
    for kind, n in counts.items():
        if not n:
            continue
        if kind not in cost.seconds:
            return None
        if kind in ("window", "step"):  # independent units of one kind share the workers
            total += (1 if parallel is None else math.ceil(n / parallel)) * cost.seconds[kind]
        elif kind != "model_free" or parallel == 1:  # it runs beside the others when it can
            total += n * cost.seconds[kind]
    return total


def plan_counts(plan: Plan) -> dict[str, int]:
    """Units of each kind in ``plan``."""
    return dict(Counter(unit.kind for unit in plan.units))


def time_summary(
    root: str | Path, plan: Plan, recipe: Recipe, *, suite_steps: int, wall_seconds: float
) -> dict[str, Any]:
    """The manifest's ``time`` entry of a finished run: the units' cost (:class:`SweepCost`),
    the executor's parallelism, the predicted wall time of this plan and of the whole suite
    (``suite_steps`` checkpoints, the same fit window) from those costs, and the measured wall
    time of the invocation that finished the run (``wall_seconds``)."""
    cost = sweep_cost(read_unit_times(root))
    counts = plan_counts(plan)
    parallel = parallel_units(recipe)

    def predict(steps: int) -> float | None:
        return predicted_seconds(cost, {**counts, "step": steps}, parallel)

    return {
        "units": cost.to_dict(),
        "parallel": parallel,
        "steps": counts.get("step", 0),
        "suite_steps": suite_steps,
        "predicted_seconds": predict(counts.get("step", 0)) if counts.get("step") else None,
        "predicted_suite_seconds": predict(suite_steps),
        "wall_seconds": wall_seconds,
    }


def time_line(time: dict[str, Any], resumed: bool) -> str:
    """One line of a run's cost for the report: fixed and marginal seconds, the predicted
    against the measured wall time (not measured when the run was resumed: its invocations'
    times do not add up), and the prediction for the whole suite."""
    seconds, counts = time["units"]["seconds"], time["units"]["counts"]
    parts = [f"fixed {time['units']['fixed']:.0f} s"]
    if counts.get("window"):
        parts[0] += f" ({counts['window']} window captures of {seconds['window']:.1f} s)"
    if "step" in seconds:
        parts.append(f"a step {seconds['step']:.1f} s")
    predicted = time.get("predicted_seconds")
    if predicted is not None:
        measured = (
            "resumed: not comparable" if resumed else f"measured {time['wall_seconds']:.0f} s"
        )
        parts.append(f"predicted {predicted:.0f} s for {time['steps']} step(s), {measured}")
    suite = time.get("predicted_suite_seconds")
    if suite is not None:
        parts.append(f"all {time['suite_steps']} checkpoints: predicted {suite:.0f} s")
    return f"time ({_at_once(time['parallel'])}): " + "; ".join(parts)


def _at_once(parallel: int | None) -> str:
    return "units unlimited at once" if parallel is None else f"{parallel} unit(s) at once"


def plan_time_line(plan: Plan, recipe: Recipe, timed: str | Path, done: str | Path | None) -> str:
    """What ``--plan-only`` says of time: the plan's wall time predicted from the unit times of
    the run directory ``timed`` (a run of this suite and these probes, e.g. one step of it), and
    the time of the units not yet done in ``done`` (None: a new run)."""
    cost = sweep_cost(read_unit_times(timed))
    if cost.step is None:
        return f"time: {timed} has no finished step unit to predict from"
    parallel = parallel_units(recipe)
    counts = plan_counts(plan)
    total = predicted_seconds(cost, counts, parallel)
    if total is None:
        missing = sorted(kind for kind in counts if kind not in cost.seconds)
        return f"time: {timed} timed no unit of kind(s) {', '.join(missing)}: no prediction"
    line = (
        f"time ({_at_once(parallel)}), from the units of {timed}: fixed {cost.fixed:.0f} s, "
        f"a step {cost.step:.1f} s; predicted {total:.0f} s for {counts.get('step', 0)} step(s)"
    )
    if done is not None:
        pending = Counter(unit.kind for unit in plan.pending(done))
        left = predicted_seconds(cost, pending, parallel) or 0.0
        line += f", {left:.0f} s for the {sum(pending.values())} unit(s) not done in {done}"
    return line
