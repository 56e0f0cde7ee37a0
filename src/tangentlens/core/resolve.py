"""A recipe resolved once: the frozen :class:`RunPlan` that every check, the sweep's units, the
memory plan, the manifest and :func:`tangentlens.measure` read.

:func:`resolve` parses the suite's facts once (:func:`~tangentlens.models.facts.suite_facts`:
family, loader, shape, steps and revisions, tokenizer), asks each probe what it needs for its
config (``Probe.needs``), refuses what the suite rules out (each refusal written once, here:
:func:`refuse_no_loss`, :func:`refuse_attention`, the blocks and the widths), and derives the
capture request (:class:`~tangentlens.capture.request.CaptureRequest`) the capture and the
memory plan both read, the fit window, the memory plan for every number of capture passes it
may use and the estimator notes (:mod:`tangentlens.core.estimators`). A sweep saves it in its
run directory (``plan.json``); each unit receives it and plans nothing again.

Light: no torch, no model library.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tangentlens.capture.needs import Needs
from tangentlens.capture.request import CaptureRequest
from tangentlens.core.bounds import check_width
from tangentlens.core.estimators import estimator_notes
from tangentlens.core.memory import MemoryPlan, PlanInputs, fitting_plan, memory_plans
from tangentlens.core.recipe import Recipe, select_layers
from tangentlens.dictionaries.policy import early_window
from tangentlens.models.facts import SuiteFacts, suite_facts
from tangentlens.models.schedule import select_steps
from tangentlens.registry import builtin_probes

__all__ = ["RunPlan", "refuse_attention", "refuse_no_loss", "resolve"]


@dataclass(frozen=True)
class RunPlan:
    """A recipe resolved against its suite.

    ``recipe``: the recipe; ``suite``: its suite's facts; ``steps``: the selected checkpoints;
    ``window``: the frozen-early fit window over the suite's checkpoints (``()`` without one);
    ``capture``: what a step's capture keeps; ``window_capture``: what a forward-only capture
    (a fit-window checkpoint, the published SAEs' latents) keeps: sampled rows; ``needs``:
    what each probe (by recipe key) declared it needs for its config; ``estimators``: the
    manifest's notes on how the metrics are computed; ``memory``: the memory plan of a step's
    capture for each number of capture passes the recipe allows (one, or every count when
    ``capture.passes`` is 0 — the fewest that fit are chosen where a unit runs), empty where
    the suite's shape is not known offline (and for a model in memory); ``memory_inputs``: what
    those plans multiply out."""

    recipe: Recipe
    suite: SuiteFacts
    steps: tuple[int, ...]
    window: tuple[int, ...]
    capture: CaptureRequest
    window_capture: CaptureRequest
    needs: Mapping[str, Needs]
    estimators: Mapping[str, str]
    memory: tuple[MemoryPlan, ...] = ()
    memory_inputs: PlanInputs | None = None

    def memory_plan(self, *, accelerator: int | None = None, host: int | None = None) -> MemoryPlan:
        """The memory plan of the fewest capture passes that fit the budgets given (bytes; None:
        not checked); a ``ValueError`` in one line when none fits (naming the largest parts,
        what reduces them and a ``data.batch_size`` that fits) or the suite's shape is unknown."""
        if self.memory_inputs is None:
            raise ValueError(f"no memory plan: {self.suite.unknown_shape}")
        return fitting_plan(self.memory, self.memory_inputs, accelerator=accelerator, host=host)

    def replicates(self, key: str) -> bool:
        """Whether probe ``key`` keeps its bootstrap replicates (declared in its needs)."""
        return self.needs[key].replicates

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form: what ``plan.json`` in the run directory holds."""
        return {
            "recipe": self.recipe.to_dict(),
            "suite": self.suite.to_dict(),
            "steps": list(self.steps),
            "window": list(self.window),
            "capture": dataclasses.asdict(self.capture),
            "window_capture": dataclasses.asdict(self.window_capture),
            "needs": {key: dataclasses.asdict(n) for key, n in self.needs.items()},
            "estimators": dict(self.estimators),
            "memory": [plan.to_dict() for plan in self.memory],
        }


def refuse_no_loss(needs: Mapping[str, Needs], why: str | None) -> None:
    """Refuse, in one line, the probes that need gradients where there is no loss to
    differentiate (``why``: the reason, None when there is one), naming the built-in
    activation-only probes that can run."""
    needing = [key for key, n in needs.items() if n.gradients]
    if why is None or not needing:
        return
    activation_only = [  # the tangent probes score the proxies' gradient energy
        name
        for name, probe in builtin_probes().items()
        if not probe.needs_for(None).gradients and probe.scope != "tangent"
    ]
    raise ValueError(
        f"probe(s) {', '.join(needing)} cannot run: {why} (they need gradients of a loss); "
        f"activation-only probes can: {', '.join(activation_only)}"
    )


def refuse_attention(needs: Mapping[str, Needs], why: str | None) -> None:
    """Refuse, in one line, the probes that need per-head attention statistics where they
    cannot be taken (``why``: the reason, None when they can)."""
    needing = [key for key, n in needs.items() if n.attention]
    if why is not None and needing:
        raise ValueError(
            f"probe(s) {', '.join(needing)} cannot run: {why}; drop them from the recipe"
        )


#: How a refusal names what is not a suite: a model in memory, a capture measured again.
_DESCRIBED = {"model": "the model", "capture": "the capture"}


def _capture_request(recipe: Recipe, needs: Mapping[str, Needs], frozen: bool) -> CaptureRequest:
    """What a step's capture keeps for the probes' ``needs`` (and the proxy fits' sampled
    rows)."""
    union = Needs()
    for n in needs.values():
        union = union.union(n)
    if recipe.proxies is not None:
        union = union.union(Needs(reservoir=True))
    types = 0
    if union.type_sums:
        for entry in recipe.probes.values():
            if entry.probe.max_tracked_types is not None:
                types += entry.probe.max_tracked_types(entry.config, recipe.data.max_tokens)
    return CaptureRequest(
        needs=union,
        n_bins=recipe.data.n_bins if union.bins else 0,
        reservoir=recipe.capture.reservoir if union.reservoir else 0,
        type_limit=types,
        sequence_sums=frozen and union.sequence_sums,
        seed=recipe.capture.seed,
    )


def resolve(recipe: Recipe, suite: SuiteFacts | None = None) -> RunPlan:
    """``recipe`` resolved against ``suite`` (default: the facts of ``recipe.suite``, parsed
    here once). Refuses, with a ``ValueError`` in one line, gradient probes without a loss,
    attention probes where per-head statistics cannot be taken, ``capture.layers`` naming
    blocks the model lacks, settings outside the bounds the model's width sets, and a step
    selection the suite cannot serve."""
    facts = suite or suite_facts(recipe.suite.name, recipe.suite.loader)
    needs = {key: entry.needs for key, entry in recipe.probes.items()}
    refuse_no_loss(needs, facts.no_loss)
    refuse_attention(needs, facts.attention)
    if facts.n_layers is not None:
        select_layers(recipe.capture.layers, facts.n_layers)
    if facts.d_model is not None:
        where = _DESCRIBED.get(facts.kind, f"suite {facts.name!r}")
        check_width(recipe, facts.d_model, f"{where} (d_model = {facts.d_model})")
    stage, window = recipe.proxies, ()
    frozen = stage is not None and stage.frozen
    if frozen:  # over the suite's checkpoints, whatever the selection
        window = early_window(facts.steps, stage.early_fraction, stage.window_checkpoints)
    capture = _capture_request(recipe, needs, frozen)
    inputs = None if facts.shape is None else PlanInputs.of(recipe, capture, facts.shape)
    return RunPlan(
        recipe=recipe,
        suite=facts,
        steps=tuple(select_steps(facts.steps, recipe.suite.steps)),
        window=window,
        capture=capture,
        window_capture=CaptureRequest(
            Needs(reservoir=True), reservoir=recipe.capture.reservoir, seed=recipe.capture.seed
        ),
        needs=needs,
        estimators=estimator_notes(recipe),
        memory=() if inputs is None else memory_plans(inputs),
        memory_inputs=inputs,
    )
