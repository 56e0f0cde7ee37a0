"""The ``local`` executor: every unit in this process, one at a time, in plan order (the
offline default, and today's speed: nothing is serialised or sent anywhere)."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from pathlib import Path

from tangentlens.core.recipe import Recipe
from tangentlens.sweep.executors.base import Emit, Finished, UnitEvent, error_line
from tangentlens.sweep.plan import Unit
from tangentlens.sweep.units import failure_log, retryable, run_unit

__all__ = ["LocalBackend"]


class LocalBackend:
    """Runs each submitted unit in-process when waited on; reports its status lines."""

    capacity = 1

    def __init__(self, recipe: Recipe, root: str | Path, emit: Emit) -> None:
        self.recipe, self.root, self.emit = recipe, Path(root), emit
        self.queue: list[Unit] = []

    def submit(self, units: Sequence[Unit]) -> None:
        self.queue.extend(units)

    def wait(self, timeout: float) -> list[Finished]:
        if not self.queue:
            return []
        unit = self.queue.pop(0)
        self.emit(UnitEvent("running", unit.name, worker=f"{socket.gethostname()}:{os.getpid()}"))

        def status(text: str) -> None:
            self.emit(UnitEvent("status", unit.name, detail=text))

        started = time.perf_counter()
        try:
            report = run_unit(self.recipe, self.root, unit, status)
        except Exception as error:  # reported (and retried) by the scheduler
            log = failure_log(self.root, unit.name)
            seconds = time.perf_counter() - started
            return [Finished(unit, error_line(error), log, seconds, retry=retryable(error))]
        return [Finished(unit, seconds=time.perf_counter() - started, work=report.seconds)]
