"""Rich live progress for long steps (suite training, sweeps)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from tangentlens.models.training import TrainingEvent
from tangentlens.report.console import console
from tangentlens.sweep.executors.base import UnitEvent
from tangentlens.sweep.plan import Plan


def _progress() -> Progress:
    """The bar shared by training and sweeps: description, bar, n/N, status, elapsed, ETA."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
    )


@contextmanager
def training_progress(name: str) -> Iterator[callable]:
    """A progress callback for :func:`tangentlens.models.suites.ensure_mini_suite`."""
    progress = _progress()
    task: TaskID | None = None

    def on_event(event: TrainingEvent) -> None:
        nonlocal task
        if task is None:
            task = progress.add_task(f"training {name}", total=event.total_steps, status="")
        if event.phase == "data":
            progress.update(task, status="tokenizer and data")
        elif event.phase == "train":
            progress.update(task, completed=event.step, status=f"loss {event.loss:.3f}")
        elif event.phase == "checkpoint":
            progress.console.log(
                f"checkpoint step {event.step:>6}: held-out loss {event.val_loss:.3f}"
            )

    with progress:
        yield on_event


@contextmanager
def sweep_progress(plan: Plan, root: str | Path) -> Iterator[Callable[[UnitEvent], None]]:
    """A progress callback for :func:`tangentlens.sweep.runner.run_sweep`: one bar of units done
    (queued / running / failed counts beside it) and a line per running unit with its worker
    and what it is doing; failures and retries are logged as they happen."""
    progress = _progress()
    done = sum(unit.done(root) for unit in plan.units)
    overall = progress.add_task(
        f"sweep {plan.recipe}", total=len(plan.units), completed=done, status=""
    )
    if done:
        progress.console.log(f"{done} of {len(plan.units)} units already in {root}: skipped")
    states: dict[str, str] = {}  # unit → queued / running / failed
    lines: dict[str, TaskID] = {}  # a line per running unit

    def leave(unit: str, state: str | None) -> None:
        if unit in lines:
            progress.remove_task(lines.pop(unit))
        if state is None:
            states.pop(unit, None)
        else:
            states[unit] = state

    def on_event(event: UnitEvent) -> None:
        nonlocal done
        unit = event.unit
        if event.phase == "queued":
            states[unit] = "queued"
        elif event.phase in ("running", "status"):
            states[unit] = "running"
            if unit not in lines:
                lines[unit] = progress.add_task(f"  {unit}", total=None, status="")
            text = f"on {event.worker}" if event.phase == "running" else event.detail
            progress.update(lines[unit], status=text)
        elif event.phase == "retry":
            leave(unit, "queued")
            progress.console.log(f"[yellow]{unit}: retrying after {event.detail}")
        elif event.phase == "done":
            leave(unit, None)
            done += 1
        elif event.phase in ("failed", "skipped"):
            leave(unit, "failed")
            why = event.detail if event.phase == "failed" else f"not run: {event.detail} failed"
            progress.console.log(f"[red]{unit}: {why}")
        counts = Counter(states.values())
        summary = " · ".join(
            f"{counts[k]} {k}" for k in ("queued", "running", "failed") if counts[k]
        )
        progress.update(overall, completed=done, status=summary)

    with progress:
        yield on_event
