"""A probe's conformance check, to run in its own tests (as scikit-learn's ``check_estimator``):

>>> from tangentlens.conformance import check_probe
>>> from tangentlens.probes.cosine_drift import PROBE
>>> check_probe(PROBE)  # the declaration, its config's recipe table, its reporting

:func:`check_probe` refuses, with a ``ValueError`` saying what is wrong:

* a config that does not round-trip through its recipe table (its fields, or its ``to_table()``
  (:class:`~tangentlens.contract.TabledConfig`), and back through the recipe's builder);
* a reporting declaration whose custom renderer cannot be imported;
* rows outside the results schema or naming an undeclared metric
  (:meth:`~tangentlens.contract.Probe.check_rows`), from the probe's own functions run on the
  inputs given: ``step`` (a :class:`~tangentlens.contract.StepInputs`, for ``rows`` of a
  ``step`` or ``tangent`` probe), ``across`` (an :class:`~tangentlens.contract.AcrossInputs`)
  and ``state`` (a :class:`~tangentlens.contract.StateInputs`: the state must be a dict outside
  the shared keys). A ``model_free`` probe's rows are always run (they need no model).

It returns the rows it checked (step, model-free and across, in that order), for a test to
assert values on.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tangentlens.checks import build_section
from tangentlens.registry import (
    AcrossInputs,
    ModelFreeInputs,
    Probe,
    StateInputs,
    StepInputs,
)
from tangentlens.reporting import load_renderer

__all__ = ["check_probe"]


def _table(config: Any) -> dict[str, Any]:
    return config.to_table() if hasattr(config, "to_table") else dataclasses.asdict(config)


def _check_config(probe: Probe, config: Any) -> None:
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


def _check_renderers(probe: Probe) -> None:
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


def check_probe(
    probe: Probe,
    config: Any = None,
    *,
    step: StepInputs | None = None,
    across: AcrossInputs | None = None,
    state: StateInputs | None = None,
) -> list[dict[str, Any]]:
    """Check ``probe`` (with ``config``, else its config's defaults) as the module's
    docstring says; returns the rows it ran and checked."""
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
    rows: list[dict[str, Any]] = []
    if step is not None:
        if not probe.per_step:
            raise ValueError(f"probe {probe.name!r} ({probe.scope}) has no per-step rows")
        rows += probe.rows(step, config)
    if probe.scope == "model_free":
        rows += probe.rows(ModelFreeInputs("check_probe"), config)
    if state is not None:
        if probe.state is None:
            raise ValueError(f"probe {probe.name!r} keeps no state")
        probe.check_state(probe.state(state, config))
    if across is not None:
        if probe.across is None:
            raise ValueError(f"probe {probe.name!r} has no across rows")
        rows += probe.across(across, config)
    probe.check_rows(rows, "check_probe")
    return rows
