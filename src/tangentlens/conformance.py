"""A probe's conformance check, to run in its own tests (as scikit-learn's ``check_estimator``,
which builds its own data): the probe author passes the probe, nothing else.

>>> from tangentlens.conformance import check_probe
>>> from tangentlens.probes.cosine_drift import PROBE
>>> rows = check_probe(PROBE)  # doctest: +SKIP

:func:`check_probe` refuses, with a ``ValueError`` saying what is wrong:

* a config that does not round-trip through its recipe table (its fields, or its ``to_table()``
  (:class:`~tangentlens.contract.TabledConfig`), and back through the recipe's builder);
* a reporting declaration whose custom renderer cannot be imported;
* needs its config does not give (``Probe.needs`` as a function of the config), a recipe the
  probe's own ``recipe_check`` refuses;
* rows outside the results schema or naming an undeclared metric
  (:meth:`~tangentlens.contract.Probe.check_rows`), and a state outside its namespace, from
  the probe's own functions run on inputs built here for its scope, the way a sweep builds
  them (:func:`small_inputs`): two checkpoints of a tiny random decoder
  (:func:`~tangentlens.models.tiny.random_decoder`, steps 0 and 1) captured over random token
  rows through the sweep's own step code, keeping what the probe's needs say, its proxies fitted
  (a ``tangent`` probe's), its state kept at each step and the transition between them handed
  to its ``across``; a ``model_free`` probe's rows at the step the engine gives them.

It returns the rows it checked (each step's, the model-free and the across rows, in that
order), for a test to assert values on.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch

from tangentlens.capture.captured import Capture
from tangentlens.checks import build_section
from tangentlens.core.data import AnalysisData
from tangentlens.core.proxy_stage import ProxiesSpec
from tangentlens.core.recipe import CaptureSpec, DataSpec, Recipe, SuiteSpec
from tangentlens.core.resolve import RunPlan, resolve
from tangentlens.core.states import own_view
from tangentlens.core.step import capture_scored, capture_sites, step_rows
from tangentlens.data import FrequencyTable, SpecialTokens
from tangentlens.models import lens_model
from tangentlens.models.facts import model_facts
from tangentlens.models.tiny import TINY_CONTEXT, TINY_VOCAB, random_decoder
from tangentlens.registry import (
    AcrossInputs,
    ModelFreeInputs,
    Probe,
    ProbeEntry,
    StateInputs,
    Transition,
)
from tangentlens.reporting import load_renderer
from tangentlens.results import StepLabel

__all__ = ["SmallInputs", "check_probe", "small_inputs"]

C = TypeVar("C")

#: The small recipe's settings: token rows, bins, sampled rows, the proxies stage.
_DATA = DataSpec(seq_len=TINY_CONTEXT, max_tokens=64 * TINY_CONTEXT, batch_size=16, n_bins=3)
_CAPTURE = CaptureSpec(sites=("resid_post",), embed=True, reservoir=512)
_STAGE = ProxiesSpec(methods=("seminmf", "pca"), rank=4, draws=20)
#: The two checkpoints: (step, tokens seen, the random decoder's seed).
_CHECKPOINTS = ((0, 0, 0), (1, 1024, 1))


def _table(config: Any) -> dict[str, Any]:
    return config.to_table() if hasattr(config, "to_table") else dataclasses.asdict(config)


def _check_config(probe: Probe[Any], config: Any) -> None:
    where = f"probe {probe.name!r} ({probe.module})"
    if not isinstance(config, probe.config):
        raise ValueError(f"{where}: config must be a {probe.config.__name__}, got {config!r}")
    table = _table(config)
    again = build_section(probe.config, table, f"probes.{probe.name}")
    if again != config:
        raise ValueError(
            f"{where}: config does not round-trip through its recipe table: {config!r} → "
            f"{table!r} → {again!r}"
        )


def _check_renderers(probe: Probe[Any]) -> None:
    for declared in (*probe.tables, *probe.figures):
        if declared.render is None:
            continue
        try:
            function = load_renderer(declared.render)
        except (ImportError, AttributeError) as error:
            raise ValueError(
                f"probe {probe.name!r}: renderer {declared.render!r} cannot be loaded ({error})"
            ) from None
        if not callable(function):
            raise ValueError(f"probe {probe.name!r}: renderer {declared.render!r} is not callable")


@dataclass(frozen=True)
class SmallInputs:
    """What :func:`small_inputs` built: per checkpoint its rows (``step_rows``: the capture's,
    the proxy fit's and the probe's), the probe's state (``states``, empty without one) and
    the :class:`~tangentlens.contract.AcrossInputs` of the transition between them."""

    step_rows: tuple[list[dict[str, Any]], ...]
    states: tuple[dict[str, Any], ...]
    across: AcrossInputs


def _data(generator: torch.Generator) -> AnalysisData:
    """Random token rows (no special tokens), counted and binned as a sweep counts its own."""
    rows = torch.randint(
        TINY_VOCAB, (_DATA.max_tokens // _DATA.seq_len, _DATA.seq_len), generator=generator
    ).numpy()
    special = SpecialTokens()
    frequencies = FrequencyTable.from_rows(rows, TINY_VOCAB, special, causal=True)
    return AnalysisData(
        rows.astype(np.int64), frequencies, frequencies.bins(_DATA.n_bins), special, "next_token"
    )


def _recipe(probe: Probe[C], config: C) -> Recipe:
    """The small recipe of ``probe`` alone (with the proxies stage a ``tangent`` probe scores)."""
    return Recipe(
        name="check_probe",
        suite=SuiteSpec(name="check_probe", steps="all"),
        data=_DATA,
        capture=dataclasses.replace(_CAPTURE, threads=torch.get_num_threads()),
        proxies=_STAGE if probe.scope == "tangent" else None,
        probes={probe.name: ProbeEntry(probe.name, probe, config)},
    )


def small_inputs(probe: Probe[C], config: C) -> SmallInputs:
    """The inputs a sweep would give ``probe`` with ``config`` on two checkpoints of a tiny
    random decoder (see the module docstring); its rows at each step are checked."""
    recipe = _recipe(probe, config)
    data = _data(torch.Generator().manual_seed(0))
    saved: list[dict[str, Any]] = []
    step_tables: list[list[dict[str, Any]]] = []
    states: list[dict[str, Any]] = []
    for step, tokens, seed in _CHECKPOINTS:
        model = random_decoder(seed)
        lens = lens_model(model)
        run: RunPlan = resolve(recipe, model_facts(lens, recipe.suite.name, step, data.loss))
        sites = capture_sites(model, run)
        stats, scored, fitted = capture_scored(model, sites, data, run, step)
        capture = Capture(
            recipe.suite.name, step, tokens, stats, sites, _DATA.seq_len, data.frequencies,
            kept=run.capture.kept,
        )  # fmt: skip
        replicates = [] if run.replicates(probe.name) else None
        rows, own = step_rows(run, capture, scored=scored, fitted=fitted, replicates=replicates)
        step_tables.append(rows)
        state = {}
        if probe.state is not None:
            state = probe.check_state(probe.state(StateInputs(model, capture, data), config))
        states.append(state)
        saved.append(
            {"step": step, "layers": sites, "tokens_seen": tokens, "proxies": own,
             "states": {probe.name: state}}
        )  # fmt: skip
    before, now = saved
    label = StepLabel(recipe.suite.name, now["step"], now["tokens_seen"], now["layers"])
    transition = own_view(Transition(label, before, now, None, False), probe.name)
    every_row = [r for rows in step_tables for r in rows]
    return SmallInputs(tuple(step_tables), tuple(states), AcrossInputs(every_row, (transition,)))


def check_probe(probe: Probe[C], config: C | None = None) -> list[dict[str, Any]]:
    """Check ``probe`` (with ``config``, else its config's defaults) as the module's
    docstring says, on inputs it builds for the probe's scope; returns the rows it ran and
    checked."""
    if not isinstance(probe, Probe):
        raise ValueError(f"not a tangentlens Probe: {probe!r}")
    if config is None:
        try:
            config = probe.config()
        except TypeError as error:
            raise ValueError(
                f"probe {probe.name!r}: its config has no defaults ({error}); pass config="
            ) from None
    _check_config(probe, config)
    _check_renderers(probe)
    probe.needs_for(config)
    if probe.scope == "model_free":
        inputs = ModelFreeInputs("check_probe")
        return probe.model_free_rows(inputs, config, "check_probe")
    built = small_inputs(probe, config)
    rows = [r for table in built.step_rows for r in table if r["probe"] == probe.name]
    if probe.across is not None:
        found = probe.across(built.across, config)
        probe.check_rows(found, "check_probe (across)")
        rows += found
    return rows
