"""Rich table pieces: a cell's value (:func:`fmt_value`), the rows' interval (:func:`interval`),
the step-0 label (:func:`step_label`) and a steps × columns table (:func:`pivot`).

Step 0 (random weights) is the baseline the later steps are read against, labelled
``0 (init)`` wherever a step is shown.

>>> fmt_value(0.12345), fmt_value(2.5e-5), fmt_value(None)
('0.123', '2.50e-05', '–')
>>> step_label(0), step_label(40)
('0 (init)', '40')
>>> interval([{"ci_low": 1.0, "ci_high": 3.0}, {"ci_low": 2.0, "ci_high": 4.0}])
(1.5, 3.5)
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from rich.markup import escape
from rich.table import Table

from tangentlens.findings import INIT_STEP, step_label

__all__ = ["INIT_STEP", "Row", "fmt_value", "interval", "pivot", "step_label"]

#: A result row (:mod:`tangentlens.results`) as a dict.
Row = dict[str, Any]


def fmt_value(value: float | None) -> str:
    """A table cell: 3 decimals, scientific notation for very large or small values, "–" for
    a missing one."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if value != 0 and (abs(value) >= 1e4 or abs(value) < 1e-3):
        return f"{value:.2e}"
    return f"{value:.3f}"


def interval(rows: list[Row]) -> tuple[float, float] | None:
    """The rows' interval (the means of their ends for several rows), or None when a row
    carries none."""
    if not rows or any(r.get("ci_low") is None or r.get("ci_high") is None for r in rows):
        return None
    return (
        statistics.fmean(r["ci_low"] for r in rows),
        statistics.fmean(r["ci_high"] for r in rows),
    )


def pivot(
    rows: list[Row],
    title: str,
    column: Callable[[Row], Any],
    cell: Callable[[list[Row]], str],
    column_label: Callable[[Any], str] = str,
    column_order: Callable[[Any], Any] | None = None,
) -> Table | None:
    """Steps down, the values of ``column(row)`` across; ``cell`` renders the rows of one
    (step, column)."""
    if not rows:
        return None
    grid: dict[tuple[int, Any], list[Row]] = defaultdict(list)
    for r in rows:
        grid[(r["step"], column(r))].append(r)
    steps = sorted({r["step"] for r in rows})
    order = column_order or (lambda c: (c is not None, str(c).zfill(6)))
    columns = sorted({column(r) for r in rows}, key=order)
    table = Table(title=f"[bold]{escape(title)}", title_justify="left", pad_edge=False, box=None)
    table.min_width = min(100, len(title) + 2)
    table.add_column("step", justify="right", style="bold")
    for c in columns:
        table.add_column(column_label(c), justify="right")
    for step in steps:
        table.add_row(step_label(step), *(cell(grid.get((step, c), [])) for c in columns))
    return table
