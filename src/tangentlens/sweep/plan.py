"""The sweep as a plan: a small graph of units, each with explicit inputs and one atomic output.

Planning reads only the resolved recipe (:class:`~tangentlens.core.resolve.RunPlan`: the
suite's steps, the selection, the fit window); it imports no model library, so
``tangentlens sweep --plan-only`` and recipe errors answer at once. Units, by kind:

* ``data`` — token rows, frequency table and bins, written once (``state/data.npz``);
* ``pretrained-sae`` (with ``[proxies.pretrained_sae]``) — a forward-only capture
  of the selection step (:func:`pretrained_step`), the published SAEs loaded through SAELens and
  checked against the suite, their proxy latents chosen and the proxy bases saved
  (``state/pretrained-sae.pt``) with the SAEs' fit diagnostics as rows;
* ``window-<N>`` (``proxies.fit_policy = "frozen_early"``) — a forward-only capture of fit-window
  checkpoint N: its activation moments and sampled rows (``state/window-<N>.pt``);
* ``fit-proxies`` — the frozen proxies fitted on the pooled window (``state/proxies.pt``, with the
  published SAEs' proxies added), and their fit diagnostics as rows;
* ``step-<N>`` — one capture of step N and every per-step probe's rows; saves what cross-step
  units need (``state/step-<N>.pt``: the step's own fit, tracked centroids, embedding rows);
* ``across-steps`` — what compares steps, from the saved step state and rows: every update from
  one selected step to the next (update alignment), the angles between consecutive steps'
  refits (subspace stability), the drift–anisotropy correlation across steps. One unit, not
  one per transition: each is a fraction of a second, less than a worker's start-up;
* ``<probe>`` (kind ``model_free``) — one per model-free probe, named by it (``untrained_block``
  → ``untrained-block``; ``model-free-<probe>`` where that name is another unit's): its rows,
  no checkpoint.

A unit is done when its output exists; every output is written to a temporary name and renamed
into place, so a unit that runs twice (retry, requeue, duplicate submission) leaves one output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tangentlens.core.resolve import RunPlan
from tangentlens.dictionaries.proxy_config import PRETRAINED_SAE

__all__ = [
    "PRETRAINED_UNIT",
    "UNIT_KINDS",
    "Plan",
    "Unit",
    "make_plan",
    "model_free_unit",
    "pretrained_step",
]

#: Unit kinds in the order a plan lists them.
UNIT_KINDS: tuple[str, ...] = (
    "data",
    "pretrained",
    "window",
    "fit",
    "step",
    "across",
    "model_free",
)


@dataclass(frozen=True)
class Unit:
    """One unit of work: ``name`` (unique in the plan), ``kind`` (one of :data:`UNIT_KINDS`),
    the checkpoint ``step`` it concerns (None where none), the units it reads (``deps``),
    its ``output`` relative to the run directory, and whether it loads a model (``model``:
    such units get the executor's GPUs)."""

    name: str
    kind: str
    step: int | None
    deps: tuple[str, ...]
    output: str
    model: bool = False

    def done(self, root: str | Path) -> bool:
        return (Path(root) / self.output).exists()


@dataclass(frozen=True)
class Plan:
    """The units of one recipe over one suite, in an order that respects every dependency."""

    recipe: str
    suite: str
    steps: tuple[int, ...]
    window: tuple[int, ...]
    units: tuple[Unit, ...]

    def __getitem__(self, name: str) -> Unit:
        for unit in self.units:
            if unit.name == name:
                return unit
        raise KeyError(name)

    def pending(self, root: str | Path) -> list[Unit]:
        """The units whose output is missing in the run directory ``root``."""
        return [unit for unit in self.units if not unit.done(root)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe,
            "suite": self.suite,
            "steps": list(self.steps),
            "window": list(self.window),
            "units": [
                {"name": u.name, "kind": u.kind, "step": u.step, "deps": list(u.deps)}
                for u in self.units
            ],
        }

    def render(self, root: str | Path | None = None) -> str:
        """A few lines: one per unit kind with its count and what it waits for; with ``root``,
        how many of each are already done there."""
        window = f"; fit window {_steps_text(self.window)}" if self.window else ""
        lines = [
            f"plan {self.recipe}: {self.suite}, {len(self.steps)} steps "
            f"({_steps_text(self.steps)}){window}"
        ]
        for kind in UNIT_KINDS:
            units = [u for u in self.units if u.kind == kind]
            if not units:
                continue
            label = units[0].name if len(units) == 1 else f"{kind}-<step> × {len(units)}"
            if len(units) > 1 and units[0].step is None:  # named by their probes
                label = ", ".join(u.name for u in units)
            deps = sorted({_dep_label(d, self) for u in units for d in u.deps})
            after = f"after {', '.join(deps)}" if deps else ""
            done = ""
            if root is not None:
                done = f"{sum(u.done(root) for u in units)}/{len(units)} done"
            lines.append(f"  {label:<24}{after:<34}{done}".rstrip())
        lines.append(f"{len(self.units)} units")
        return "\n".join(lines)


def _steps_text(steps: Sequence[int]) -> str:
    if len(steps) <= 8:
        return ", ".join(map(str, steps))
    return f"{', '.join(map(str, steps[:3]))}, …, {', '.join(map(str, steps[-2:]))}"


def _dep_label(name: str, plan: Plan) -> str:
    kind = plan[name].kind
    same = [u for u in plan.units if u.kind == kind]
    return name if len(same) == 1 else f"{kind}-<step>"


def _name(kind: str, step: int) -> str:
    return f"{kind}-{step:08d}"


#: The unit that loads the published SAEs and chooses their proxy latents.
PRETRAINED_UNIT = "pretrained-sae"


def pretrained_step(run: RunPlan) -> int | None:
    """The checkpoint whose activations choose the published SAEs' latents (None without
    ``pretrained_sae``): ``select_step``, else the first selected step. It must be one of the
    suite's checkpoints and not after the first selected step (a proxy comes from data of the
    scored step or earlier)."""
    stage, suite_steps = run.recipe.proxies, run.suite.steps
    if stage is None or stage.pretrained_sae is None:
        return None
    first = min(run.steps)
    step = stage.pretrained_sae.select_step
    if step is None:
        return first
    key = f"proxies.{PRETRAINED_SAE}.select_step"
    if step not in suite_steps:
        raise ValueError(
            f"{key} = {step} is not a checkpoint of the suite; its steps: "
            f"{_steps_text(sorted(suite_steps))}"
        )
    if step > first:
        raise ValueError(
            f"{key} = {step} is after the first selected step {first}: the latents must be "
            "chosen on data of the scored steps or earlier"
        )
    return step


#: Unit names the plan gives itself (a model-free probe's unit is renamed rather than take one).
_RESERVED = ("data", PRETRAINED_UNIT, "fit-proxies", "across-steps")


def model_free_unit(probe: str) -> str:
    """The unit of the model-free probe named ``probe``: its name hyphenated
    (``untrained_block`` → ``untrained-block``), prefixed ``model-free-`` where that would be
    another unit's name."""
    name = probe.replace("_", "-")
    taken = name in _RESERVED or name.startswith(("step-", "window-"))
    return f"model-free-{name}" if taken else name


def make_plan(run: RunPlan) -> Plan:
    """The units of the resolved recipe ``run`` over its selected steps (the fit window is
    drawn from all the suite's checkpoints, whatever the selection)."""
    recipe, window, selected = run.recipe, run.window, run.steps
    data = Unit("data", "data", None, (), "state/data.npz")
    units = [data]
    select = pretrained_step(run)
    pretrained: tuple[str, ...] = ()
    if select is not None:
        units.append(
            Unit(
                PRETRAINED_UNIT,
                "pretrained",
                select,
                (data.name,),
                f"results/{PRETRAINED_UNIT}.parquet",
                True,
            )
        )
        pretrained = (PRETRAINED_UNIT,)
    if window:
        windows = [
            Unit(
                _name("window", s),
                "window",
                s,
                (data.name,),
                f"state/{_name('window', s)}.pt",
                True,
            )
            for s in window
        ]
        units += windows
        units.append(
            Unit(
                "fit-proxies",
                "fit",
                window[-1],
                tuple(u.name for u in windows) + pretrained,
                "results/fit-proxies.parquet",
            )
        )
    upstream = ("data", *(("fit-proxies",) if window else ()), *pretrained)
    steps = [
        Unit(_name("step", s), "step", s, upstream, f"results/{_name('step', s)}.parquet", True)
        for s in selected
    ]
    units += steps
    if any(entry.probe.across is not None for entry in recipe.probes.values()):
        units.append(
            Unit(
                "across-steps",
                "across",
                selected[-1],
                tuple(u.name for u in steps),
                "results/across-steps.parquet",
            )
        )
    for entry in recipe.scoped("model_free"):
        name = model_free_unit(entry.probe.name)
        units.append(Unit(name, "model_free", None, (), f"results/{name}.parquet"))
    return Plan(recipe.name, recipe.suite.name, tuple(selected), window, tuple(units))
