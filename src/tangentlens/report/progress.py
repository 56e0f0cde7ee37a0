"""Rich live progress for long steps (suite training, sweeps)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

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
from tangentlens.sweep.runner import SweepEvent


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
def sweep_progress(name: str) -> Iterator[callable]:
    """A progress callback for :func:`tangentlens.sweep.runner.run_sweep`."""
    progress = _progress()
    task: TaskID | None = None

    def on_event(event: SweepEvent) -> None:
        nonlocal task
        if task is None:
            task = progress.add_task(f"sweep {name}", total=None, status="preparing data")
        if event.phase == "unit-start":
            progress.update(task, total=event.total, completed=event.done, status=event.unit)
        elif event.phase == "status":
            progress.update(task, status=event.status)
        elif event.phase in ("unit-done", "unit-skip"):
            status = "resumed: already done" if event.phase == "unit-skip" else "done"
            progress.update(task, total=event.total, completed=event.done, status=status)
            if event.phase == "unit-skip":
                progress.console.log(f"{event.unit}: already in the run directory, skipped")

    with progress:
        yield on_event
