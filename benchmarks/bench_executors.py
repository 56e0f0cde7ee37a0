"""The quickstart sweep on each executor: wall time against ``local``, and the overhead each
executor adds to a unit.

Wall: the whole quickstart recipe (mini-pythia, every probe) run by :func:`run_sweep` into a
temporary directory with ``local`` (the reference), ``ray`` (a local cluster of 2 workers) and
``submitit-local`` (at most 2 jobs at once), one thread per unit. Overhead per unit: for each
unit, the time from its submission to the coordinator seeing it done, minus the time the unit
itself ran on its worker (``UnitEvent.work``); the median over units, against the median unit's
own time in the local run (goal: ≤ 5 %). For submitit that includes each job's fresh
interpreter and imports (one process per unit); the row "worker start-up" measures that part.
"""

from __future__ import annotations

import dataclasses
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks._timing import ratio_row
from tangentlens.core.recipe import Recipe, load_recipe
from tangentlens.models.suites import ensure_mini_suite
from tangentlens.sweep.executors.base import UnitEvent
from tangentlens.sweep.runner import run_sweep

_QUICK = [
    "suite.name='micro-pythia'",
    "data.seq_len=32",
    "data.max_tokens=2048",
    "proxies.rank=4",
    "probes.untrained_block.d_model=32",
    "probes.untrained_block.n_heads=2",
    "probes.untrained_block.d_mlp=64",
]


def _run(recipe: Recipe, kind: str) -> tuple[float, list[UnitEvent]]:
    recipe = dataclasses.replace(
        recipe, executor=dataclasses.replace(recipe.executor, kind=kind, workers=2)
    )
    events: list[UnitEvent] = []
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        run_sweep(recipe, f"{tmp}/run", on_event=events.append)
        wall = time.perf_counter() - start
    return wall, [e for e in events if e.phase == "done"]


def _import_seconds() -> float:
    """A fresh interpreter importing what a submitit job imports before its unit starts."""
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", "import submitit, tangentlens.sweep.executors.submitit"],
        check=True,
    )
    return time.perf_counter() - start


def run(quick: bool = False) -> list[dict[str, Any]]:
    # one thread per unit, so 2 workers fill 2 cores (units sharing a core spin-wait)
    recipe = load_recipe("quickstart", [*(_QUICK if quick else []), "capture.threads=1"])
    ensure_mini_suite(recipe.suite.name)
    shape = f"{recipe.suite.name}, {recipe.suite.steps}"
    local_wall, local_done = _run(recipe, "local")
    median_unit = statistics.median(e.work for e in local_done)
    startup = _import_seconds()
    goal = "≤ 5 % of the median unit"
    rows = []
    for kind in ("ray", "submitit-local"):
        wall, done = _run(recipe, kind)
        overhead = statistics.median(e.seconds - e.work for e in done)
        units = f"{shape}, {len(done)} units"
        rows.append(
            ratio_row(f"sweep wall, {kind} (2 workers)", shape, "local", wall, local_wall, "")
        )
        if kind == "ray":  # warm workers: start-up is paid once per worker, not per unit
            rows.append(
                ratio_row(
                    "overhead per unit, ray", units, "median unit", overhead, median_unit, goal
                )
            )
            continue
        rows += [
            ratio_row(
                "overhead per unit, submitit", units, "median unit", overhead, median_unit, ""
            ),
            ratio_row(
                "  of which job start-up",
                "python + imports",
                "median unit",
                startup,
                median_unit,
                "",
            ),
            ratio_row(
                "  scheduling (the rest)",
                units,
                "median unit",
                overhead - startup,
                median_unit,
                goal,
            ),
        ]
    return rows
