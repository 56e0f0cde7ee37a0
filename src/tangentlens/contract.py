"""What a probe declares, once, and what it reads: the :class:`Probe` value a probe module
defines (conventionally ``PROBE``) and the inputs of each scope. The probes import this module;
the registry (:mod:`tangentlens.registry`), which finds them, sits above them.

One rows signature per scope: ``rows(inputs, config) -> list[row]`` with ``inputs`` a
:class:`StepInputs` (scopes ``step`` and ``tangent``) or :class:`ModelFreeInputs` (``model_free``);
a probe that also compares steps gives ``across(inputs: AcrossInputs, config)``, and may keep a
per-step ``state(inputs: StateInputs, config) -> dict`` for it. Rows are dictionaries of the
results schema (:func:`tangentlens.results.make_row` builds them).

This module imports neither torch nor a model library: a recipe is checked without them.
"""

from __future__ import annotations

import dataclasses
import keyword
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tangentlens.capture.needs import Needs

if TYPE_CHECKING:
    import numpy as np

    from tangentlens.capture.captured import Capture
    from tangentlens.results import StepLabel

__all__ = [
    "FIT_PROBE",
    "SCOPES",
    "TANGENT",
    "AcrossInputs",
    "ModelFreeInputs",
    "Probe",
    "StateInputs",
    "StepInputs",
    "Transition",
]

#: The built-in ``tangent`` probe of the proxies' gradient energy (the tangent account's headline
#: rows); like every ``tangent`` probe it scores the ``[proxies]`` stage's proxies.
TANGENT = "tangent_energy"
#: The ``probe`` value of the proxy fit's own rows (fit quality, frozen-fit diagnostics).
FIT_PROBE = "proxy_fit"
#: Where a probe's rows are computed.
SCOPES: dict[str, str] = {
    "step": "its rows come from one step's capture (a sweep's step unit, measure)",
    "tangent": (
        "it scores the proxies of the [proxies] stage (per step, across steps or both): a recipe "
        "without a [proxies] section gets the stage's defaults"
    ),
    "across": "it compares checkpoints (a sweep's across-steps unit): run a sweep",
    "model_free": "it needs no model (a unit of its own): call its rows function",
}
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")

Proxies = dict[str, dict[str, Any]]
Rows = list[dict[str, Any]]


@dataclass(frozen=True)
class StepInputs:
    """What a per-step probe reads. ``capture``: the step's capture (the whole stream);
    ``scored``: the capture energies are scored on (the held-out half, else ``capture``);
    ``proxies``: the scored tangent proxies ``{site: {method: basis (d × k)}}`` (the frozen-early
    ones, else the step's own fit; None without the proxies stage); ``own``: the step's own fit;
    ``frozen``: the frozen-early proxies (None otherwise); ``tangent``: the proxies stage's
    settings (:class:`tangentlens.core.proxy_stage.ProxiesSpec`: ``seed``, ``draws``,
    ``methods``, …; None without the stage); ``replicates``: where a probe puts the bootstrap
    replicates of its rows with intervals (:func:`tangentlens.results.replicate_record`; None:
    keep none)."""

    capture: Capture
    scored: Capture
    proxies: Proxies | None = None
    own: Proxies | None = None
    frozen: Proxies | None = None
    tangent: Any = None
    replicates: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class StateInputs:
    """What a step keeps for a probe's ``across`` rows: the ``model`` (a lens adapter), the
    step's ``capture`` and the sweep's analysis data (token rows, frequencies)."""

    model: Any
    capture: Capture
    data: Any


@dataclass(frozen=True)
class Transition:
    """One update from the previous selected step to the next: ``label`` names the later step;
    ``before`` / ``now`` the two steps' saved states (``proxies``: each step's own fit, plus what
    each probe's ``state`` kept); ``scoring`` the proxies an update is scored in (fitted on data
    of the earlier step or before); ``in_window``: the earlier step lies inside the frozen fit
    window."""

    label: StepLabel
    before: dict[str, Any]
    now: dict[str, Any]
    scoring: Proxies | None
    in_window: bool


@dataclass(frozen=True)
class AcrossInputs:
    """What an across-steps probe reads: every scored step's rows (``step_rows``) and the
    transitions between consecutive selected steps."""

    step_rows: Rows
    transitions: tuple[Transition, ...]


@dataclass(frozen=True)
class ModelFreeInputs:
    """What a model-free probe reads: the suite's name (its rows' label)."""

    suite: str


@dataclass(frozen=True)
class Probe:
    """One probe, declared once.

    ``name``: snake_case, the ``probe`` column and the recipe table; ``config``: a frozen
    dataclass validated on construction (the recipe's ``[probes.<name>]`` table); ``scope``:
    one of :data:`SCOPES`; ``metrics``: metric name → its definition (every row's ``metric``
    must be one of them); ``needs``: what the capture must keep; ``rows(inputs, config)``: the
    probe's rows (every scope but ``across``; a ``tangent`` probe may have only ``across``);
    ``across(inputs, config)``: rows across steps;
    ``state(inputs, config)``: what a step keeps for ``across``. Type-sum probes name the token
    types they track: ``tracked_types(config, counts) -> type ids`` and at most how many,
    ``max_tracked_types(config, max_tokens)`` (the memory plan). ``refits``: a ``tangent``
    probe that reads each step's own fit (``StepInputs.own``) even when the scored proxies are
    frozen: the step refits them for it. ``recipe_check(config, recipe)``: raises a
    ``ValueError`` when the rest of the recipe cannot serve the probe (e.g. a site it needs is
    not captured); run when a recipe is built."""

    name: str
    config: type
    scope: str
    metrics: Mapping[str, str]
    needs: Needs = field(default_factory=Needs)
    rows: Callable[[Any, Any], Rows] | None = None
    across: Callable[[AcrossInputs, Any], Rows] | None = None
    state: Callable[[StateInputs, Any], dict[str, Any]] | None = None
    tracked_types: Callable[[Any, np.ndarray], np.ndarray] | None = None
    max_tracked_types: Callable[[Any, int], int] | None = None
    refits: bool = False
    recipe_check: Callable[[Any, Any], None] | None = None

    def __post_init__(self) -> None:
        where = f"probe {self.name!r}"
        if (
            not isinstance(self.name, str)
            or not _NAME.match(self.name)
            or keyword.iskeyword(self.name)
        ):
            raise ValueError(f"a probe's name must be snake_case (a-z, 0-9, _), got {self.name!r}")
        if self.scope not in SCOPES:
            raise ValueError(f"{where}: scope must be one of {list(SCOPES)}, got {self.scope!r}")
        if not (dataclasses.is_dataclass(self.config) and isinstance(self.config, type)):
            raise ValueError(f"{where}: config must be a dataclass type, got {self.config!r}")
        if not self.config.__dataclass_params__.frozen:  # type: ignore[attr-defined]
            raise ValueError(f"{where}: config {self.config.__name__} must be a frozen dataclass")
        if not isinstance(self.needs, Needs):
            raise ValueError(f"{where}: needs must be a tangentlens Needs, got {self.needs!r}")
        if not self.metrics or not all(
            isinstance(k, str) and _NAME.match(k) and isinstance(v, str) and v.strip()
            for k, v in self.metrics.items()
        ):
            raise ValueError(
                f"{where}: metrics must map each snake_case metric name to its definition"
            )
        if self.scope == "across" and not callable(self.across):
            raise ValueError(f"{where}: an 'across' probe needs a callable across")
        if self.scope in ("step", "model_free") and not callable(self.rows):
            raise ValueError(f"{where}: a {self.scope!r} probe needs a callable rows")
        if self.scope == "tangent" and not (callable(self.rows) or callable(self.across)):
            raise ValueError(f"{where}: a 'tangent' probe needs a callable rows or across")
        if self.refits and self.scope != "tangent":
            raise ValueError(f"{where}: only a 'tangent' probe reads the step's own refit")
        if self.state is not None and self.across is None:
            raise ValueError(f"{where}: state is kept for across rows: give across too")
        if (self.tracked_types is None) != (self.max_tracked_types is None) or (
            self.needs.type_sums != (self.tracked_types is not None)
        ):
            raise ValueError(
                f"{where}: a probe needing type sums names its types (tracked_types and "
                "max_tracked_types), and only such a probe does"
            )

    def check_recipe(self, config: Any, recipe: Any) -> None:
        """Refuse a recipe that cannot serve this probe (its ``recipe_check``), else nothing."""
        if self.recipe_check is not None:
            self.recipe_check(config, recipe)

    @property
    def module(self) -> str:
        """The module that declares the probe's rows (or its config)."""
        function = self.rows or self.across
        return getattr(function, "__module__", None) or self.config.__module__

    @property
    def per_step(self) -> bool:
        """Whether it has rows from one step's capture (scopes ``step`` and ``tangent``)."""
        return self.scope in ("step", "tangent") and self.rows is not None

    def check_rows(self, rows: Iterable[Mapping[str, Any]], where: str) -> None:
        """Refuse rows outside the results schema or naming a metric the probe did not declare;
        ``where`` names the unit (or call) in the message."""
        from tangentlens.results import check_row

        for row in rows:
            check_row(row, where)
            if row["probe"] != self.name or row["metric"] not in self.metrics:
                raise ValueError(
                    f"{where}: probe {self.name!r} ({self.module}) returned a row of probe "
                    f"{row['probe']!r}, metric {row['metric']!r}; it declares the metrics "
                    f"{sorted(self.metrics)}"
                )
