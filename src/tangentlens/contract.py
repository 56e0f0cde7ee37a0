"""What a probe declares, once, and what it reads: the :class:`Probe` value a probe module
defines (conventionally ``PROBE``), the inputs of each scope and the function each scope gives.
The probes import this module; the registry (:mod:`tangentlens.registry`), which finds them,
sits above them.

One function per scope (:data:`SCOPES`), each typed by a protocol:

* ``step`` and ``tangent`` — ``rows(inputs: StepInputs, config) -> rows`` (:class:`StepRows`);
* ``model_free`` — ``rows(inputs: ModelFreeInputs, config) -> rows`` (:class:`ModelFreeRows`;
  the engine gives every such row the step :data:`MODEL_FREE_STEP`);
* ``across`` (and a ``step`` or ``tangent`` probe that also compares steps) —
  ``across(inputs: AcrossInputs, config) -> rows`` (:class:`AcrossRows`), with an optional
  per-step ``state(inputs: StateInputs, config) -> dict`` (:class:`StateOf`) kept in the
  probe's own namespace and handed back as each :class:`Transition`'s ``before`` / ``now``.

Rows are dictionaries of the results schema (:func:`tangentlens.results.make_row` builds
them). The config is a frozen dataclass, the probe's recipe table (``Probe[MyConfig]``: each
function of the probe takes an instance of it); a config whose table is not its fields as they
are gives it itself (:class:`TabledConfig`). What the probe reports (tables, figures, compared
settings, estimator notes, the metrics compared on the log scale, findings) is its
:class:`Reporting`
(:mod:`tangentlens.reporting`). :func:`tangentlens.conformance.check_probe` checks all of it.

This module imports neither torch nor a model library: a recipe is checked without them.
"""

from __future__ import annotations

import dataclasses
import keyword
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from tangentlens.capture.needs import Needs
from tangentlens.checks import Bound
from tangentlens.reporting import Reporting, default_figures, default_tables

if TYPE_CHECKING:
    import numpy as np
    import torch

    from tangentlens.capture.captured import Capture
    from tangentlens.data.frequency import FrequencyTable
    from tangentlens.models.adapter import LensModel
    from tangentlens.reporting import Figure, Table
    from tangentlens.results import StepLabel

__all__ = [
    "FIT_PROBE",
    "MODEL_FREE_STEP",
    "SCOPES",
    "STATE_KEYS",
    "AcrossInputs",
    "AcrossRows",
    "ModelFreeInputs",
    "ModelFreeRows",
    "Probe",
    "Reporting",
    "StateInputs",
    "StateOf",
    "StepData",
    "StepInputs",
    "StepRows",
    "TabledConfig",
    "Transition",
]

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
_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
#: The refusal of type sums that a probe's needs and its named types disagree on.
_TYPE_SUMS_RULE = (
    "a probe needing type sums names its types (tracked_types and max_tracked_types), and only "
    "such a probe does"
)

#: What every step's saved state holds beside the probes' own states (a probe's state may not
#: use these keys: each :class:`Transition` gives a probe its state with them).
STATE_KEYS = ("step", "layers", "tokens_seen", "proxies")

#: The ``step`` of every model-free row, set by the engine whatever the probe wrote: not a
#: checkpoint (the step-0 baseline, the report's steps and ``compare`` read checkpoints only).
MODEL_FREE_STEP = -1

Proxies = dict[str, dict[str, Any]]
Rows = list[dict[str, Any]]
#: A probe's config class (the recipe table): its functions take an instance of it.
C = TypeVar("C")
C_in = TypeVar("C_in", contravariant=True)


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
    tangent: object | None = None
    replicates: list[dict[str, Any]] | None = None


class StepData(Protocol):
    """The sweep's analysis data as a probe's ``state`` reads it: the token ``rows``
    (n_rows × seq_len ids) and their ``frequencies``."""

    rows: np.ndarray
    frequencies: FrequencyTable


@dataclass(frozen=True)
class StateInputs:
    """What a step keeps for a probe's ``across`` rows: the ``model`` (the loaded checkpoint:
    a ``HookedTransformer``, ``TransformerBridge`` or Hugging Face lens;
    ``tangentlens.models.lens_model(model)`` names its hook sites), the step's ``capture`` and
    the sweep's analysis data (token rows, frequencies)."""

    model: torch.nn.Module | LensModel
    capture: Capture
    data: StepData


@dataclass(frozen=True)
class Transition:
    """One update from the previous selected step to the next: ``label`` names the later step;
    ``before`` / ``now`` the two steps' saved states as the reading probe sees them: what its
    own ``state`` kept (its namespace: no other probe's keys), plus :data:`STATE_KEYS`
    (``proxies``: each step's own fit, with a tangent stage); ``scoring`` the proxies an
    update is scored in (fitted on data of the earlier step or before); ``in_window``: the
    earlier step lies inside the frozen fit window."""

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
    """What a model-free probe reads: the suite's name (its rows' label) and the step its rows
    are given (:data:`MODEL_FREE_STEP`, whatever the probe writes)."""

    suite: str
    step: int = MODEL_FREE_STEP


class StepRows(Protocol[C_in]):
    """``rows`` of a ``step`` or ``tangent`` probe: one step's rows."""

    def __call__(self, inputs: StepInputs, config: C_in, /) -> Rows: ...


class ModelFreeRows(Protocol[C_in]):
    """``rows`` of a ``model_free`` probe (their ``step`` is set to :data:`MODEL_FREE_STEP`)."""

    def __call__(self, inputs: ModelFreeInputs, config: C_in, /) -> Rows: ...


class AcrossRows(Protocol[C_in]):
    """``across`` of a probe that compares steps."""

    def __call__(self, inputs: AcrossInputs, config: C_in, /) -> Rows: ...


class StateOf(Protocol[C_in]):
    """``state``: what one step keeps for the probe's ``across`` (tensors are moved to the
    host and saved with the step; keys other than :data:`STATE_KEYS`)."""

    def __call__(self, inputs: StateInputs, config: C_in, /) -> dict[str, Any]: ...


class TabledConfig(Protocol):
    """A config whose recipe table is not its fields as they are (e.g. a key left out at its
    default, so that runs written before that key resume) gives the table itself: the recipe's
    builder reads it back to the same config (``build_section(type(c), c.to_table()) == c``).
    A plain dataclass config needs nothing: its fields are its table."""

    def to_table(self) -> dict[str, Any]: ...


#: The functions each scope requires: one of the named fields must be callable.
_REQUIRED = {
    "step": ("rows",),
    "tangent": ("rows", "across"),
    "across": ("across",),
    "model_free": ("rows",),
}


@dataclass(frozen=True)
class Probe(Generic[C]):
    """One probe, declared once; ``C`` is its config class.

    ``name``: snake_case, the ``probe`` column and the recipe table; ``config``: a frozen
    dataclass validated on construction (the recipe's ``[probes.<name>]`` table); ``scope``:
    one of :data:`SCOPES`; ``metrics``: metric name → its definition (every row's ``metric``
    must be one of them); ``needs``: what the capture must keep (:class:`Needs`), or a function
    of the config giving it (e.g. per-sequence sums only with a bootstrap:
    :meth:`needs_for`); ``rows(inputs, config)``: the probe's rows (every scope but
    ``across``; a ``tangent`` probe may have only ``across``); a model-free probe's rows are
    given the step :data:`MODEL_FREE_STEP` whatever it writes; ``across(inputs, config)``:
    rows across steps; ``state(inputs, config)``: what a step keeps for ``across``. Type-sum
    probes name the token types they track: ``tracked_types(config, counts) -> type ids`` and
    at most how many, ``max_tracked_types(config, max_tokens)`` (the memory plan). ``refits``:
    a ``tangent`` probe that reads each step's own fit (``StepInputs.own``) even when the scored
    proxies are frozen: the step refits them for it. ``recipe_check(config, recipe)``: raises a
    ``ValueError`` when the rest of the recipe cannot serve the probe (e.g. a site it needs is
    not captured); run when a recipe is built. ``width_bounds(config, recipe, d)``: the ranges
    (:class:`tangentlens.checks.Bound`, by recipe key) a model of width ``d`` sets on the
    probe's settings and on the proxies stage's as the probe uses them, computed as the probe
    computes them; checked when a sweep is planned and by ``measure``, before any capture.
    ``reporting``: its tables, figures, compared settings, estimator notes, the metrics
    ``compare`` reads on the log scale and its findings
    (:class:`~tangentlens.reporting.Reporting`; by default a table and a figure per metric)."""

    name: str
    config: type[C]
    scope: str
    metrics: Mapping[str, str]
    needs: Needs | Callable[[C], Needs] = field(default_factory=Needs)
    rows: StepRows[C] | ModelFreeRows[C] | None = None
    across: AcrossRows[C] | None = None
    state: StateOf[C] | None = None
    tracked_types: Callable[[C, np.ndarray], np.ndarray] | None = None
    max_tracked_types: Callable[[C, int], int] | None = None
    refits: bool = False
    recipe_check: Callable[[C, Any], None] | None = None
    width_bounds: Callable[[C, Any, int], Iterable[Bound]] | None = None
    reporting: Reporting = field(default_factory=Reporting)

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
        if isinstance(self.needs, Needs):
            self._check_needs(self.needs)
        elif not callable(self.needs):
            raise ValueError(
                f"{where}: needs must be a tangentlens Needs or a function of the config "
                f"giving one, got {self.needs!r}"
            )
        if not self.metrics or not all(
            isinstance(k, str) and _NAME.match(k) and isinstance(v, str) and v.strip()
            for k, v in self.metrics.items()
        ):
            raise ValueError(
                f"{where}: metrics must map each snake_case metric name to its definition"
            )
        required = _REQUIRED[self.scope]
        if not any(callable(getattr(self, name)) for name in required):
            article = "an" if self.scope[0] in "aeiou" else "a"
            raise ValueError(
                f"{where}: {article} {self.scope!r} probe needs a callable {' or '.join(required)}"
            )
        if self.scope == "model_free" and (self.across is not None or self.state is not None):
            raise ValueError(f"{where}: a 'model_free' probe has no across rows")
        if self.refits and self.scope != "tangent":
            raise ValueError(f"{where}: only a 'tangent' probe reads the step's own refit")
        if self.state is not None and self.across is None:
            raise ValueError(f"{where}: state is kept for across rows: give across too")
        if (self.tracked_types is None) != (self.max_tracked_types is None):
            raise ValueError(f"{where}: {_TYPE_SUMS_RULE}")

        if not isinstance(self.reporting, Reporting):
            raise ValueError(f"{where}: reporting must be a tangentlens Reporting")
        keys = [f.name for f in dataclasses.fields(self.config)]
        unknown = [k for k in self.reporting.may_differ if k not in keys]
        if unknown and not hasattr(self.config, "to_table"):
            raise ValueError(f"{where}: may_differ names {unknown}, not keys of its config {keys}")
        for item in (*self.tables, *self.figures):
            if item.metric not in self.metrics:
                raise ValueError(
                    f"{where}: {type(item).__name__.lower()} {item.title!r} shows "
                    f"{item.metric!r}, not one of its metrics {sorted(self.metrics)}"
                )
        if unknown := [m for m in self.reporting.log_scale if m not in self.metrics]:
            raise ValueError(
                f"{where}: log_scale names {unknown}, not among its metrics {sorted(self.metrics)}"
            )

    def _check_needs(self, needs: Needs) -> None:
        """Refuse needs whose type sums and the probe's named types disagree."""
        if needs.type_sums != (self.tracked_types is not None):
            raise ValueError(f"probe {self.name!r}: {_TYPE_SUMS_RULE}")

    def needs_for(self, config: C | None) -> Needs:
        """What the probe needs from a capture with ``config`` (None: its config's defaults):
        ``needs``, or what the function ``needs`` gives for it."""
        if isinstance(self.needs, Needs):
            return self.needs
        needs = self.needs(self.config() if config is None else config)
        if not isinstance(needs, Needs):
            raise ValueError(
                f"probe {self.name!r} ({self.module}): needs(config) must return a tangentlens "
                f"Needs, got {type(needs).__name__}"
            )
        self._check_needs(needs)
        return needs

    @property
    def tables(self) -> tuple[Table, ...]:
        """The tables it declares, else one per metric."""
        declared = self.reporting.tables
        return default_tables(self.name, self.metrics) if declared is None else declared

    @property
    def figures(self) -> tuple[Figure, ...]:
        """The figures it declares, else one ``<name>.png`` with a panel per metric."""
        declared = self.reporting.figures
        return default_figures(self.name, self.metrics) if declared is None else declared

    def check_recipe(self, config: C, recipe: Any) -> None:
        """Refuse a recipe that cannot serve this probe (its ``recipe_check``), else nothing."""
        if self.recipe_check is not None:
            self.recipe_check(config, recipe)

    def bounds(self, config: C, recipe: Any, d: int) -> list[Bound]:
        """The ranges a model of width ``d`` sets on its settings (its ``width_bounds``)."""
        return [] if self.width_bounds is None else list(self.width_bounds(config, recipe, d))

    @property
    def module(self) -> str:
        """The module that declares the probe's rows (or its config)."""
        function = self.rows or self.across
        return getattr(function, "__module__", None) or self.config.__module__

    @property
    def per_step(self) -> bool:
        """Whether it has rows from one step's capture (scopes ``step`` and ``tangent``)."""
        return self.scope in ("step", "tangent") and self.rows is not None

    def check_state(self, state: Any) -> dict[str, Any]:
        """``state`` (what ``state`` returned) if it is a dict of string keys outside
        :data:`STATE_KEYS`, else a ``ValueError`` naming the probe."""
        where = f"probe {self.name!r} ({self.module})"
        if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
            raise ValueError(
                f"{where}: state must return a dict with string keys, got {type(state).__name__}"
            )
        if shared := sorted(set(state) & set(STATE_KEYS)):
            raise ValueError(
                f"{where}: its state uses the keys {shared}, which every transition already "
                f"holds ({', '.join(STATE_KEYS)}): rename them"
            )
        return state

    def model_free_rows(self, inputs: ModelFreeInputs, config: C, where: str) -> Rows:
        """A ``model_free`` probe's rows, each given the step :data:`MODEL_FREE_STEP` (whatever
        the probe wrote: its rows are no checkpoint's) and checked (:meth:`check_rows`)."""
        if self.scope != "model_free" or self.rows is None:
            raise ValueError(f"probe {self.name!r} ({self.scope}) has no model-free rows")
        rows = [{**r, "step": MODEL_FREE_STEP} for r in self.rows(inputs, config)]  # type: ignore[arg-type]
        self.check_rows(rows, where)
        return rows

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
