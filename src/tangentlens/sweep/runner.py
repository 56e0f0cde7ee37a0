"""The sweep's coordinator: plan a recipe into units, run the missing ones on an executor, then
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
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tangentlens.core.bounds import check_width
from tangentlens.core.recipe import Recipe, select_layers
from tangentlens.dictionaries.proxy_config import PRETRAINED_SAE
from tangentlens.models.catalog import (
    headless_architectures,
    suite_loader,
    suite_steps,
)
from tangentlens.models.schedule import select_steps
from tangentlens.models.shapes import suite_shape
from tangentlens.registry import builtin_probes
from tangentlens.runtime import half_precision_slowdown
from tangentlens.sweep.executors.base import UnitEvent, UnitFailure
from tangentlens.sweep.plan import Plan, make_plan
from tangentlens.sweep.stops import stop_signals

__all__ = [
    "PLANNED_LOADER",
    "SweepFailedError",
    "check_attention_heads",
    "check_lm_head",
    "check_model_shape",
    "check_pretrained_sae",
    "plan_sweep",
    "run_sweep",
    "set_aside_logs",
]

logger = logging.getLogger(__name__)

#: The loader whose models the memory plan's terms were measured on (tangentlens.sweep.memory).
PLANNED_LOADER = "hooked"


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


def check_lm_head(recipe: Recipe) -> None:
    """Refuse probes that need gradients on a suite without a language-modelling head (no loss
    to differentiate): one line naming the suite, its architectures, those probes and the
    activation-only probes that can run."""
    architectures = headless_architectures(recipe.suite.name)
    if architectures is None:
        return
    needing = [key for key, entry in recipe.probes.items() if entry.probe.needs.gradients]
    if needing:
        activation_only = [  # the tangent probes score the proxies' gradient energy
            n for n, p in builtin_probes().items() if not p.needs.gradients and p.scope != "tangent"
        ]
        raise ValueError(
            f"suite {recipe.suite.name!r} has no language-modelling head (architectures "
            f"{architectures}): probes {', '.join(needing)} need gradients of a loss and cannot "
            f"run; activation-only probes can: {', '.join(activation_only)}"
        )


def check_attention_heads(recipe: Recipe) -> None:
    """Refuse probes that need per-head attention statistics (``qk_drift``) on a suite loaded
    through loader ``"hf"`` (no per-head hooks) or with grouped-query attention (fewer key/value
    heads than query heads, from ``config.json``): one line naming the suite, its heads or
    loader and those probes. Whether a loaded model exposes queries,
    keys and patterns at all is checked again when each unit plans its capture."""
    needing = [key for key, entry in recipe.probes.items() if entry.probe.needs.attention]
    if not needing:
        return
    if suite_loader(recipe.suite.name, recipe.suite.loader) == "hf":
        raise ValueError(
            f"suite {recipe.suite.name!r} loads through loader 'hf', which hooks the encoder's "
            f"layers, not its attention heads: probe(s) {', '.join(needing)} need per-head "
            "queries, keys and patterns and cannot run; drop them from the recipe"
        )
    try:
        shape = suite_shape(recipe.suite.name)
    except ValueError:  # an architecture without a memory plan: refused by the plan itself
        return
    if shape.n_kv_heads != shape.n_heads:
        raise ValueError(
            f"suite {recipe.suite.name!r} uses grouped-query attention ({shape.n_heads} query "
            f"heads, {shape.n_kv_heads} key/value heads): probe(s) {', '.join(needing)} compare "
            "each head's mean query and key and cannot run; drop them from the recipe"
        )


def check_pretrained_sae(recipe: Recipe) -> None:
    """Refuse published SAEs (``[proxies.pretrained_sae]``) before anything runs:
    a release or SAE id SAELens' registry lacks, or a release of another model than the suite's
    — the names matched through TransformerLens' alias table, the widths (``d_model``) compared
    where both are known offline (:mod:`tangentlens.models.naming`). A local suite's model is its
    ``suite.json`` ``model_name``, else its folder's name, as when its SAEs are loaded. Imports
    SAELens and TransformerLens, for a recipe with that table only; nothing is downloaded."""
    spec = getattr(recipe.proxies, PRETRAINED_SAE, None)
    if spec is None:
        return
    from tangentlens.dictionaries import check_pretrained, pretrained_models
    from tangentlens.models.catalog import parse_suite_spec
    from tangentlens.models.naming import model_key, model_width, suite_model_name

    check_pretrained(spec.release, spec.ids)
    releases = pretrained_models()
    model, suite = releases[spec.release], recipe.suite.name
    ours = suite_model_name(suite)
    try:
        width: int | None = suite_shape(suite).d_model
    except ValueError:  # an architecture without a memory plan: refused by the plan itself
        width = None
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
    if parse_suite_spec(suite)[0] == "local":  # perhaps of that model, but named otherwise
        named = f'"model_name": "{model}"'
        advice += f"; if they are checkpoints of {model!r}, say so in its suite.json ({named})"
    raise ValueError(
        f"{path}: release {spec.release!r} holds SAEs of model {model!r}"
        + ("" if theirs is None else f" (d_model {theirs})")
        + f", not of suite {described}; {advice}"
    )


def check_model_shape(recipe: Recipe) -> None:
    """Refuse, before anything runs, the settings that only the suite's model shape rules out:
    blocks ``capture.layers`` names that the model lacks, and every bound the model's width
    ``d_model`` sets on the proxies stage and the probes (``proxies.rank`` within the room of
    the control frames, ``data_matched_m``, …: :func:`~tangentlens.core.bounds.check_width`).
    A suite whose shape is not known offline is checked when its step units start."""
    try:
        shape = suite_shape(recipe.suite.name)
    except ValueError:  # an architecture without a memory plan: refused by the plan itself
        return
    select_layers(recipe.capture.layers, shape.n_layers)
    where = f"suite {recipe.suite.name!r} (d_model = {shape.d_model})"
    check_width(recipe, shape.d_model, where)


def plan_sweep(recipe: Recipe) -> Plan:
    """The units of ``recipe`` over its suite's selected steps (no model library imported);
    a loader that cannot load the suite's architecture, gradient probes on a suite without a
    head, attention probes on a suite with grouped-query attention, and settings the model's
    shape rules out are refused here."""
    suite_loader(recipe.suite.name, recipe.suite.loader)  # "auto": per architecture
    check_lm_head(recipe)
    check_attention_heads(recipe)
    check_model_shape(recipe)
    available = suite_steps(recipe.suite.name)
    return make_plan(recipe, available, select_steps(available, recipe.suite.steps))


def _checked_memory_plan(recipe: Recipe, loader: str) -> dict[str, Any]:
    """The recipe's memory plan, refused in one line when it exceeds the host budget or, for a
    model on a GPU of this machine, that GPU's memory (units on other machines check their
    GPU when they start); as recorded in the manifest, with the budgets it was checked against
    and the loader it models. The plan models the hooked loader's TransformerLens models; under
    ``loader`` "bridge" it is not a measured bound (the bridge saves less per block but holds
    GPT-NeoX's Q/K/V twice: fused and split), which a warning and the manifest say."""
    from tangentlens.sweep.memory import host_budget, plan_recipe
    from tangentlens.sweep.units import accelerator_budget

    host = host_budget(recipe)
    local = recipe.executor.kind == "local"
    accelerator = accelerator_budget(recipe.suite.resolved_device()) if local else None
    memory = plan_recipe(recipe, accelerator=accelerator, host=host)
    if loader != PLANNED_LOADER:
        logger.warning(
            "the memory plan models the %s loader's models, not the %s loader's: its peaks are "
            "estimates for this run, not measured bounds",
            PLANNED_LOADER,
            loader,
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
    recipe: Recipe,
    out: str | Path,
    *,
    resume: bool = False,
    detach: bool = False,
    on_event: Callable[[UnitEvent], None] | None = None,
) -> Path:
    """Run ``recipe`` into the run directory ``out`` on ``recipe.executor``; returns ``out``.

    ``detach`` (Slurm only): submit the missing units as dependent jobs and return at once; a
    later ``resume`` collects them. Raises :class:`SweepFailedError` when units failed. A stop
    signal (``SIGTERM``, ``SIGHUP``, ``SIGUSR1``: :mod:`tangentlens.sweep.stops`) or Ctrl-C
    raises :class:`~tangentlens.sweep.stops.Stopped` / ``KeyboardInterrupt`` with the lock
    released and the finished units kept for ``resume``.
    """
    with stop_signals():
        return _run_sweep(recipe, out, resume=resume, detach=detach, on_event=on_event)


def _run_sweep(
    recipe: Recipe,
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
    check_run_dir(out)  # a file, or a folder that cannot be written: before anything is made
    emit = on_event or (lambda event: None)
    check_executor(recipe, detach=detach)  # before a suite is trained or the run directory made
    plan = plan_sweep(recipe)
    check_pretrained_sae(recipe)  # an SAE the registry lacks or of another model: before any unit
    loader = suite_loader(recipe.suite.name, recipe.suite.loader)
    memory = _checked_memory_plan(recipe, loader)  # a sweep that cannot fit stops at once
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
        manifest = initial_manifest(recipe, plan, recipe.suite.resolved_device())
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
        failures = execute(recipe, plan, store.root, emit, detach=detach)
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
