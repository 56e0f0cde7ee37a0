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

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tangentlens.models.catalog import (
    headless_architectures,
    resolve_loader,
    suite_family,
    suite_steps,
)
from tangentlens.models.schedule import select_steps
from tangentlens.models.shapes import suite_shape
from tangentlens.probes.configs import PROBE_NEEDS
from tangentlens.sweep.executors.base import UnitEvent, UnitFailure
from tangentlens.sweep.plan import Plan, make_plan
from tangentlens.sweep.recipe import Recipe

__all__ = [
    "PLANNED_LOADER",
    "SweepFailedError",
    "check_attention_heads",
    "check_lm_head",
    "plan_sweep",
    "run_sweep",
]

logger = logging.getLogger(__name__)

#: The loader whose models the memory plan's terms were measured on (tangentlens.sweep.memory).
PLANNED_LOADER = "hooked"


class SweepFailedError(ValueError):
    """Some units failed after their retries; the others finished. ``--resume`` runs the
    failed ones (and what depends on them) again."""

    def __init__(self, root: Path, failures: list[UnitFailure]) -> None:
        self.failures = failures
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
        super().__init__(
            "\n".join(lines) + f"{tail} — the other units of {root} finished; fix it and pass "
            "--resume to run the missing ones"
        )


def _names(group: list[UnitFailure]) -> str:
    names = [f.unit for f in group]
    return ", ".join(names) if len(names) <= 3 else f"{names[0]}, …, {names[-1]}"


def check_lm_head(recipe: Recipe) -> None:
    """Refuse probes that need gradients on a suite without a language-modelling head (no loss
    to differentiate): one line naming the suite, its architectures, those probes and the
    activation-only probes that can run."""
    architectures = headless_architectures(recipe.suite.name)
    if architectures is None:
        return
    needing = [name for name in recipe.probes if PROBE_NEEDS[name].gradients]
    if needing:
        activation_only = [name for name, needs in PROBE_NEEDS.items() if not needs.gradients]
        raise ValueError(
            f"suite {recipe.suite.name!r} has no language-modelling head (architectures "
            f"{architectures}): probes {', '.join(needing)} need gradients of a loss and cannot "
            f"run; activation-only probes can: {', '.join(activation_only)}"
        )


def check_attention_heads(recipe: Recipe) -> None:
    """Refuse probes that need per-head attention statistics (``qk_drift``) on a suite with
    grouped-query attention (fewer key/value heads than query heads, from ``config.json``): one
    line naming the suite, its heads and those probes. Whether a loaded model exposes queries,
    keys and patterns at all is checked again when each unit plans its capture."""
    needing = [name for name in recipe.probes if PROBE_NEEDS[name].attention]
    if not needing:
        return
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


def plan_sweep(recipe: Recipe) -> Plan:
    """The units of ``recipe`` over its suite's selected steps (no model library imported);
    gradient probes on a suite without a head, attention probes on a suite with grouped-query
    attention are refused here."""
    check_lm_head(recipe)
    check_attention_heads(recipe)
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
    later ``resume`` collects them. Raises :class:`SweepFailedError` when units failed.
    """
    from tangentlens.dictionaries import check_pretrained
    from tangentlens.models import PythiaSuite, open_suite
    from tangentlens.sweep.data import DATA_FILE, data_sha256
    from tangentlens.sweep.executors import check_executor, execute
    from tangentlens.sweep.manifest import finished_manifest, initial_manifest
    from tangentlens.sweep.store import RunStore

    emit = on_event or (lambda event: None)
    check_executor(recipe, detach=detach)  # before a suite is trained or the run directory made
    plan = plan_sweep(recipe)
    pretrained = getattr(recipe.probes.get("tangent_energy"), "pretrained_sae", None)
    if pretrained is not None:  # a release or SAE id the registry lacks: before any unit
        check_pretrained(pretrained.release, pretrained.ids)
    loader = resolve_loader(recipe.suite.loader, suite_family(recipe.suite.name))
    memory = _checked_memory_plan(recipe, loader)  # a sweep that cannot fit stops at once
    # a mini suite is trained here, on first use, into the cache every worker reads
    suite = open_suite(recipe.suite.name, offline=recipe.suite.offline or None)
    # damaged checkpoints and configs that change across steps stop the sweep before any unit
    # runs; identical checkpoints are recorded (manifest, report, a capture row per step)
    if isinstance(suite, PythiaSuite):  # offline, every selected revision must be cached
        suite.check_available(plan.steps)
    integrity = suite.verify(plan.steps)
    if integrity.problems():
        raise ValueError("; ".join(integrity.problems()))
    # a run has started once a checkpoint step is done: failing before that (a bad site, rank
    # or corpus) leaves no run directory behind, whatever independent units finished
    steps = [unit for unit in plan.units if unit.kind == "step"]
    with RunStore.open(
        out, resume=resume, started=lambda root: any(u.done(root) for u in steps)
    ) as store:
        manifest = initial_manifest(recipe, plan, recipe.suite.resolved_device())
        manifest["integrity"] = integrity.to_dict()
        manifest["memory_plan"] = memory
        if resume:
            previous = store.read_manifest()
            if previous.get("recipe") != recipe.identity():
                raise ValueError(
                    f"--resume: {store.root} was started with a different recipe; start a new "
                    "run directory or resume with the same recipe and overrides (executor "
                    "settings may differ)"
                )
        else:
            store.write_manifest(manifest)
        failures = execute(recipe, plan, store.root, emit, detach=detach)
        if failures:
            raise SweepFailedError(store.root, failures)
        if detach and plan.pending(store.root):
            return Path(out)
        store.write_manifest(
            finished_manifest(
                store, suite, plan, recipe.executor_dict(), data_sha256(store.root / DATA_FILE)
            )
        )
    return Path(out)
