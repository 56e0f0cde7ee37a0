"""The sweep's coordinator: resolve a recipe once (:func:`~tangentlens.core.resolve.resolve`:
the suite's facts, the checks, what each capture keeps, the memory plan, the fit window), plan
it into units, run the missing ones on an executor — each receives the resolved recipe — then
complete the manifest.

>>> plan = plan_sweep(load_recipe("quickstart"))          # doctest: +SKIP
>>> print(plan.render())                                   # doctest: +SKIP
>>> run_sweep(load_recipe("quickstart"), "runs/quickstart")  # doctest: +SKIP

Planning imports no model library (:mod:`tangentlens.sweep.plan`); what each unit does is in
:mod:`tangentlens.sweep.units`, the executors in :mod:`tangentlens.sweep.executors`. Only the
coordinator takes the run directory's lock; units write their outputs atomically, so
``--resume`` runs exactly the units whose output is missing, on any executor, and gives the
table of an uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tangentlens.core.recipe import Recipe
from tangentlens.core.resolve import RunPlan, resolve
from tangentlens.dictionaries.proxy_config import PRETRAINED_SAE
from tangentlens.runtime import half_precision_slowdown
from tangentlens.sweep.executors.base import UnitEvent, UnitFailure
from tangentlens.sweep.plan import Plan, make_plan
from tangentlens.sweep.stops import stop_signals

__all__ = [
    "PLANNED_LOADER",
    "PLAN_FILE",
    "SweepFailedError",
    "check_pretrained_sae",
    "plan_sweep",
    "run_sweep",
    "set_aside_logs",
]

logger = logging.getLogger(__name__)

#: The loader whose models the memory plan's terms were measured on (tangentlens.core.memory).
PLANNED_LOADER = "hooked"
#: The resolved recipe, as the run directory keeps it (:meth:`RunPlan.to_dict`).
PLAN_FILE = "plan.json"


class SweepFailedError(ValueError):
    """Some units failed after their retries; the others finished. With ``kept`` the run
    directory stays and ``--resume`` runs the failed ones (and what depends on them) again;
    without (no unit that loads a checkpoint had finished), nothing was kept and the same
    command starts afresh."""

    def __init__(self, root: Path, failures: list[UnitFailure], *, kept: bool = True) -> None:
        self.failures = failures
        self.kept = kept
        by_error: dict[str, list[UnitFailure]] = {}
        for failure in failures:
            if not failure.error.startswith("not run:"):
                by_error.setdefault(failure.error, []).append(failure)
        lines = []
        for error, group in by_error.items():  # one line per distinct error
            units = group[0].unit if len(group) == 1 else f"{len(group)} units ({_names(group)})"
            log = f" (log: {group[0].log})" if group[0].log else ""
            lines.append(f"{units}: {error}{log}")
        not_run = len(failures) - sum(len(g) for g in by_error.values())
        tail = f"; {not_run} unit(s) that need them not run" if not_run else ""
        if kept:
            advice = (
                f" — {root} is kept with the units that finished; fix it and pass --resume to "
                "run the missing ones"
            )
        else:
            advice = (
                f" — no checkpoint had been measured, so nothing was kept ({root} removed); fix "
                "it and run the same command again"
            )
        super().__init__("\n".join(lines) + tail + advice)


def _names(group: list[UnitFailure]) -> str:
    names = [f.unit for f in group]
    return ", ".join(names) if len(names) <= 3 else f"{names[0]}, …, {names[-1]}"


def set_aside_logs(root: Path, failures: list[UnitFailure]) -> list[UnitFailure]:
    """Copy the run directory's ``logs/`` into a new temporary folder (the run directory is
    about to be removed) and return ``failures`` with their logs pointing there."""
    logs = Path(root) / "logs"
    if not logs.is_dir():
        return failures
    kept = Path(tempfile.mkdtemp(prefix="tangentlens-logs-"))
    shutil.copytree(logs, kept, dirs_exist_ok=True)
    moved = []
    for failure in failures:
        try:
            where = kept / Path(failure.log).resolve().relative_to(logs.resolve())
        except ValueError:  # not a file of logs/ (e.g. "the Ray worker logs")
            moved.append(failure)
        else:
            moved.append(dataclasses.replace(failure, log=str(where)))
    return moved


def check_pretrained_sae(run: RunPlan) -> None:
    """Refuse published SAEs (``[proxies.pretrained_sae]``) before anything runs:
    a release or SAE id SAELens' registry lacks, or a release of another model than the suite's
    — the names matched through TransformerLens' alias table, the widths (``d_model``) compared
    where both are known offline (:mod:`tangentlens.models.naming`). A local suite's model is its
    ``suite.json`` ``model_name``, else its folder's name, as when its SAEs are loaded. Imports
    SAELens and TransformerLens, for a recipe with that table only; nothing is downloaded."""
    spec = getattr(run.recipe.proxies, PRETRAINED_SAE, None)
    if spec is None:
        return
    from tangentlens.dictionaries import check_pretrained, pretrained_models
    from tangentlens.models.naming import model_key, model_width

    check_pretrained(spec.release, spec.ids)
    releases = pretrained_models()
    model, suite = releases[spec.release], run.suite.name
    ours, width = run.suite.model_name, run.suite.d_model
    theirs = model_width(model)
    same_name = model_key(model) == model_key(ours)
    if same_name and (None in (width, theirs) or width == theirs):
        return
    path = f"proxies.{PRETRAINED_SAE}"
    train = "train an SAE on the suite's activations with method 'sae' in proxies.methods"
    if same_name:
        raise ValueError(
            f"{path}: release {spec.release!r} holds SAEs of model {model!r} (d_model "
            f"{theirs}), but the checkpoints of suite {suite!r} (model {ours!r}) have d_model "
            f"{width}: they are not that model's; {train}"
        )
    details = [f"model {ours!r}"] if ours != suite else []
    if width is not None:
        details.append(f"d_model {width}")
    described = f"{suite!r}" + (f" ({', '.join(details)})" if details else "")
    matching = [name for name, of in releases.items() if model_key(of) == model_key(ours)]
    if matching:
        listed = ", ".join(matching[:4]) + (f", … {len(matching) - 4} more" if matching[4:] else "")
        advice = f"choose a release of {ours!r} ({listed}) or {train}"
    else:
        advice = f"SAELens' registry has no release for {ours!r}: {train}"
    if run.suite.kind == "local":  # perhaps of that model, but named otherwise
        named = f'"model_name": "{model}"'
        advice += f"; if they are checkpoints of {model!r}, say so in its suite.json ({named})"
    raise ValueError(
        f"{path}: release {spec.release!r} holds SAEs of model {model!r}"
        + ("" if theirs is None else f" (d_model {theirs})")
        + f", not of suite {described}; {advice}"
    )


def plan_sweep(recipe: Recipe | RunPlan) -> Plan:
    """The units of ``recipe`` (resolved here once, unless given resolved) over its suite's
    selected steps; no model library imported. What :func:`~tangentlens.core.resolve.resolve`
    refuses is refused here (a loader that cannot load the suite, gradient probes on a suite
    without a head, attention probes where per-head statistics cannot be taken, settings the
    model's shape rules out), and a published SAE's selection step (:func:`make_plan`)."""
    return make_plan(recipe if isinstance(recipe, RunPlan) else resolve(recipe))


def _checked_memory_plan(run: RunPlan) -> dict[str, Any]:
    """The recipe's memory plan, refused in one line when it exceeds the host budget or, for a
    model on a GPU of this machine, that GPU's memory (units on other machines check their
    GPU when they start); as recorded in the manifest, with the budgets it was checked against
    and the loader it models. The plan models the hooked loader's TransformerLens models; under
    the loader "bridge" it is not a measured bound (the bridge saves less per block but holds
    GPT-NeoX's Q/K/V twice: fused and split), which a warning and the manifest say."""
    from tangentlens.core.memory import host_budget
    from tangentlens.sweep.units import accelerator_budget

    recipe = run.recipe
    host = host_budget(recipe)
    local = recipe.executor.kind == "local"
    accelerator = accelerator_budget(recipe.suite.resolved_device()) if local else None
    memory = run.memory_plan(accelerator=accelerator, host=host)
    if run.suite.loader != PLANNED_LOADER:
        logger.warning(
            "the memory plan models the %s loader's models, not the %s loader's: its peaks are "
            "estimates for this run, not measured bounds",
            PLANNED_LOADER,
            run.suite.loader,
        )
    return {
        **memory.to_dict(),
        "budgets": {"accelerator": accelerator, "host": host},
        "modelled_loader": PLANNED_LOADER,
    }


#: Above this slowdown against float32, a half-precision CPU sweep is warned about.
SLOW_HALF_PRECISION = 8.0


def warn_slow_half_precision(recipe: Recipe) -> float | None:
    """Warn when the recipe runs a half-precision model on this machine's CPU and the CPU's
    matmuls at that dtype are more than :data:`SLOW_HALF_PRECISION` times slower than float32
    (no native kernels); returns the measured slowdown (None when it does not apply)."""
    if recipe.suite.dtype == "float32" or recipe.suite.resolved_device() != "cpu":
        return None
    slowdown = half_precision_slowdown(recipe.suite.dtype)
    if slowdown > SLOW_HALF_PRECISION:
        logger.warning(
            "suite.dtype = %r on this CPU: its matmuls run %.0f× slower than float32 here (no "
            "native %s kernels); set suite.dtype = 'float32' for a CPU sweep (twice the "
            "weights' memory)",
            recipe.suite.dtype,
            slowdown,
            recipe.suite.dtype,
        )
    return slowdown


def run_sweep(
    recipe: Recipe | RunPlan,
    out: str | Path,
    *,
    resume: bool = False,
    detach: bool = False,
    on_event: Callable[[UnitEvent], None] | None = None,
) -> Path:
    """Run ``recipe`` (resolved here once, unless given resolved: a
    :class:`~tangentlens.core.resolve.RunPlan`) into the run directory ``out`` on its
    executor; returns ``out``. The resolved recipe is saved there (:data:`PLAN_FILE`) and
    every unit receives it.

    ``detach`` (Slurm only): submit the missing units as dependent jobs and return at once; a
    later ``resume`` collects them. Raises :class:`SweepFailedError` when units failed. A stop
    signal (``SIGTERM``, ``SIGHUP``, ``SIGUSR1``: :mod:`tangentlens.sweep.stops`) or Ctrl-C
    raises :class:`~tangentlens.sweep.stops.Stopped` / ``KeyboardInterrupt`` with the lock
    released and the finished units kept for ``resume``.
    """
    with stop_signals():
        run = recipe if isinstance(recipe, RunPlan) else resolve(recipe)
        return _run_sweep(run, out, resume=resume, detach=detach, on_event=on_event)


def _run_sweep(
    run: RunPlan,
    out: str | Path,
    *,
    resume: bool,
    detach: bool,
    on_event: Callable[[UnitEvent], None] | None,
) -> Path:
    from tangentlens.core.data import DATA_FILE, data_sha256
    from tangentlens.models import open_suite
    from tangentlens.sweep.downloads import check_downloads, sweep_downloads
    from tangentlens.sweep.executors import check_executor, execute
    from tangentlens.sweep.manifest import finished_manifest, initial_manifest
    from tangentlens.sweep.store import RunStore, check_run_dir
    from tangentlens.sweep.timing import time_summary

    started = time.perf_counter()
    recipe = run.recipe
    check_run_dir(out)  # a file, or a folder that cannot be written: before anything is made
    emit = on_event or (lambda event: None)
    check_executor(recipe, detach=detach)  # before a suite is trained or the run directory made
    plan = make_plan(run)
    check_pretrained_sae(run)  # an SAE the registry lacks or of another model: before any unit
    memory = _checked_memory_plan(run)  # a sweep that cannot fit stops at once
    if recipe.executor.kind == "local":
        warn_slow_half_precision(recipe)  # other executors' workers may have other CPUs
    # a mini suite is trained here, on first use, into the cache every worker reads
    suite = open_suite(recipe.suite.name, offline=recipe.suite.offline or None)
    # offline, everything the units will load must be cached: the missing items are named
    check_downloads(sweep_downloads(recipe, plan, suite), recipe)
    # damaged checkpoints, configs that change across steps or are not the published one stop
    # the sweep before any unit runs; identical checkpoints are recorded (manifest, report, a
    # capture row per step)
    integrity = suite.verify(plan.steps)
    if integrity.problems():
        raise ValueError("; ".join(integrity.problems()))
    for line in integrity.warnings():
        logger.warning("%s", line)

    # a run has started once a unit that loads a checkpoint is done (the costly work is kept
    # for --resume): a failure before that (a bad site or corpus) leaves no run directory
    # behind, and the failed units' logs are set aside
    def begun(root: Path) -> bool:
        return any(unit.done(root) for unit in plan.units if unit.model)

    with RunStore.open(out, resume=resume, started=begun) as store:
        manifest = initial_manifest(run, plan, recipe.suite.resolved_device())
        manifest["integrity"] = integrity.to_dict()
        manifest["memory_plan"] = memory
        if store.resuming:
            previous = store.read_manifest()
            if not recipe.same_identity(previous.get("recipe")):
                raise ValueError(
                    f"--resume: {store.root} was started with a different recipe; start a new "
                    "run directory or resume with the same recipe and overrides (executor "
                    "settings may differ)"
                )
        else:
            store.write_manifest(manifest)
        store.write_file(PLAN_FILE, json.dumps(run.to_dict(), indent=1))
        failures = execute(run, plan, store.root, emit, detach=detach)
        if failures:
            kept = store.resuming or begun(store.root)
            if not kept:  # the run directory goes: its logs must not go with it
                failures = set_aside_logs(store.root, failures)
            raise SweepFailedError(store.root, failures, kept=kept)
        if detach and plan.pending(store.root):
            return Path(out)
        manifest = finished_manifest(
            store, suite, plan, recipe.executor_dict(), data_sha256(store.root / DATA_FILE)
        )
        manifest["time"] = time_summary(
            store.root,
            plan,
            recipe,
            suite_steps=len(suite.steps),
            wall_seconds=time.perf_counter() - started,
        )
        manifest["resumed"] = store.resuming
        store.write_manifest(manifest)
    return Path(out)
