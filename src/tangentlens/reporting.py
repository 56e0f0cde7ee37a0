"""What a probe reports, declared on the probe (:class:`~tangentlens.contract.Probe`): its
tables (:class:`Table`), figures (:class:`Figure`), the recipe settings two compared runs must
share (:class:`MustMatch`), the estimator notes its manifest entry records
(:class:`Estimator`), the metrics ``compare`` reads on the log scale and the findings of the
run's reproduction summary (:mod:`tangentlens.findings`). The run's report, its figures,
``compare`` and the manifest read these declarations from the registry's probes; none of them
names a probe.

A probe that declares no tables (``tables=None``) gets :func:`default_tables`: one step × layer
table per metric, in the report and in ``compare``; one that declares no figures gets
:func:`default_figures`: one PNG ``<probe>.png`` with a panel per metric over steps (a line
per layer). A custom renderer is named by import path (``"package.module:function"``), so a
probe declares it without importing the report: a table's renders a probe's rows to rich
tables (``function(rows) -> list[rich.table.Table]``); a figure's draws the run's rows, or a
comparison in ``compare``, to a path (``function(rows_or_comparison, path) -> bool``: whether
it drew; what it may read of a comparison: :class:`tangentlens.drawing.compared.Compared`). The
built-in probes' renderers live beside them (``tangentlens.probes.render``) and draw with
:mod:`tangentlens.drawing`, as a researcher's may.

This module imports neither torch nor a plotting library.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from tangentlens.findings import Findings

__all__ = [
    "Estimator",
    "Figure",
    "MustMatch",
    "Reporting",
    "Table",
    "default_figures",
    "default_tables",
    "load_renderer",
]

_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def _check_render(render: str | None, where: str) -> None:
    if render is not None and not (isinstance(render, str) and _IMPORT_PATH.match(render)):
        raise ValueError(
            f"{where}: render must be an import path 'module:function', got {render!r}"
        )


@dataclass(frozen=True)
class Table:
    """A table of one ``metric`` at frequency bin "all": in the run's report (``in_report``)
    steps down and blocks across, one table per block site kind and, when ``per_method``, per
    proxy method and rank (else the methods averaged, which the title then says), each cell
    with the row's interval where it carries one; in ``compare``
    (``in_compare``, titled ``compare_title`` if given) a row per method, site kind and depth,
    a column per run — ``per_method=False`` averages the methods (e.g. attention heads) into
    one row. ``render``: a custom renderer for the report instead (module:function of the
    probe's rows; ``metric`` then names the metric it leads with)."""

    metric: str
    title: str
    compare_title: str | None = None
    in_report: bool = True
    in_compare: bool = True
    per_method: bool = True
    render: str | None = None

    def __post_init__(self) -> None:
        _check_render(self.render, f"table {self.title!r}")
        if self.render is not None and self.in_compare:
            raise ValueError(f"table {self.title!r}: a custom renderer draws the report only")


@dataclass(frozen=True)
class Figure:
    """One panel (``metric``, its axis ``label``) of the PNG ``file``; panels that several
    probes declare for one file share it (the figure is titled by its first panel's
    ``title``). ``over``: ``"steps"`` — a line per layer over training steps (the run's
    figures); ``"depth"`` — a line per step over depth (the run's), per run at its compared
    step and at step 0 over relative depth (``compare``, titled ``compare_title`` if given).
    ``per_method``: a line (or a row of panels) per proxy method and rank, as per site kind
    and layer; False averages the methods (e.g. attention heads: the ``label`` says so).
    ``render``: a custom figure (module:function of the rows, or of the comparison when
    ``in_compare``)."""

    file: str
    metric: str
    label: str
    title: str
    over: Literal["steps", "depth"] = "steps"
    in_report: bool = True
    in_compare: bool = False
    compare_title: str | None = None
    render: str | None = None
    per_method: bool = True

    def __post_init__(self) -> None:
        _check_render(self.render, f"figure {self.file!r}")
        if not self.file.endswith(".png"):
            raise ValueError(f"figure {self.file!r}: a figure is a .png file")
        if self.over not in ("steps", "depth"):
            raise ValueError(f"figure {self.file!r}: over must be 'steps' or 'depth'")
        if self.in_report == self.in_compare and self.render is not None:
            raise ValueError(
                f"figure {self.file!r}: a custom figure is drawn in the report or in compare"
            )


@dataclass(frozen=True)
class Reporting:
    """Everything a probe declares for the report, ``compare`` and the manifest: ``tables``
    and ``figures`` (None: the defaults from its metrics, :func:`default_tables` and
    :func:`default_figures`; ``()``: none), ``must_match`` settings, ``estimators``,
    ``may_differ``: the keys of its own recipe table two compared runs may set differently
    (every other key must match, else ``compare`` refuses the probe's rows; e.g. the number of
    bootstrap replicates, which changes no value); ``log_scale``: the metrics ``compare``
    differences on the log scale, ``ln B − ln A`` (ratios whose null is 1; every other metric
    as ``B − A``); ``findings``: functions from the run's rows to the verdicts of the
    reproduction summary (:data:`tangentlens.findings.Findings`)."""

    tables: tuple[Table, ...] | None = None
    figures: tuple[Figure, ...] | None = None
    must_match: tuple[MustMatch, ...] = ()
    estimators: tuple[Estimator, ...] = ()
    may_differ: tuple[str, ...] = ()
    log_scale: tuple[str, ...] = ()
    findings: tuple[Findings, ...] = ()


@dataclass(frozen=True)
class MustMatch:
    """A recipe setting (``path``, its dotted key) two compared runs must share for the
    probe's rows it concerns to be compared (those whose metric starts with
    ``metric_prefix``; every row of the probe by default). ``name``: how the refusal line
    calls it ("draws")."""

    name: str
    path: str
    metric_prefix: str = ""


@dataclass(frozen=True)
class Estimator:
    """A manifest ``estimators`` entry (``key``: ``text``, how the probe's metrics are
    computed). ``text`` is the note, or a function ``(config, recipe) -> note`` of the probe's
    config and the recipe (None: no note for this recipe), recorded then only for a probe the
    recipe runs. A run compared with one whose entry differs refuses the probe's rows those
    that the entry covers: whose metric starts with ``metric_prefix`` and ends with
    ``metric_suffix``, or is one of ``metrics`` when given. Probes may declare one key with the
    same note: it then covers each one's rows."""

    key: str
    text: str | Callable[[Any, Any], str | None]
    metric_prefix: str = ""
    metric_suffix: str = ""
    metrics: tuple[str, ...] | None = None

    def note(self, config: Any, recipe: Any) -> str | None:
        """The note for a recipe that runs the probe with ``config``."""
        return self.text(config, recipe) if callable(self.text) else self.text


def default_tables(name: str, metrics: Iterable[str]) -> tuple[Table, ...]:
    """A table per metric (names, e.g. a probe's ``metrics`` mapping), titled
    ``<probe>: <metric>``."""
    return tuple(Table(metric, f"{name}: {metric}") for metric in metrics)


def default_figures(name: str, metrics: Iterable[str]) -> tuple[Figure, ...]:
    """One figure ``<probe>.png``: a panel per metric, a line per site kind, layer and method
    over steps — in the run's report and in ``compare`` (a line per run and place there)."""
    return tuple(
        Figure(
            f"{name}.png",
            metric,
            metric.replace("_", " "),
            f"{name} over training",
            in_compare=True,
        )
        for metric in metrics
    )


def load_renderer(path: str) -> Callable[..., Any]:
    """The function a declaration's ``render`` names (``module:function``)."""
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)
