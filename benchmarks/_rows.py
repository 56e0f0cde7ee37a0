"""Rows reported the moment they are measured: each printed as one line and appended to a
JSON-lines file, so a run cut short (an allocation's time limit, a killed job) keeps every row
measured before it.

A row is a benchmark's dict (``benchmark``, ``shape``, ``reference_name``, ``ours_s``,
``reference_s``, ``goal``, …) or a skipped part (``benchmark`` and ``skipped``: why). Each
line of the file is the row with ``time`` (ISO 8601, UTC), ``device`` and ``torch`` added.
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

__all__ = ["Emit", "RowSink", "describe", "skipped_row"]

#: What a benchmark calls with each row as it is measured.
Emit = Callable[[dict[str, Any]], None]


def skipped_row(name: str, reason: str) -> dict[str, Any]:
    """A row saying that ``name`` was not measured, and why."""
    return {"benchmark": name, "skipped": reason}


def _number(value: Any, unit: str) -> str:
    if not isinstance(value, int | float) or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.3g} {unit}"


def describe(row: dict[str, Any]) -> str:
    """One line of text for ``row`` (a measured row or a skipped part)."""
    if "skipped" in row:
        return f"{row['benchmark']}: skipped — {row['skipped']}"
    unit = row.get("unit", "s")
    ours, ref = row.get("ours_s"), row.get("reference_s")
    ratio = ours / ref if isinstance(ours, int | float) and ref else float("nan")
    return (
        f"{row['benchmark']} [{row['shape']}]: {_number(ours, unit)} against "
        f"{row['reference_name']} {_number(ref, unit)} = {_number(ratio, '×').strip()}; "
        f"goal {row['goal']}"
    )


class RowSink:
    """Prints each row on ``console`` and appends it to the JSON-lines file ``path`` (None:
    print only); ``rows`` keeps them for the final table."""

    def __init__(self, console: Console, path: str | Path | None, device: str) -> None:
        self.console = console
        self.path = None if path is None else Path(path)
        self.device = device
        self.rows: list[dict[str, Any]] = []
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        self.console.print(describe(row), highlight=False, markup=False, soft_wrap=True)
        if self.path is None:
            return
        stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        record = {**row, "time": stamp, "device": self.device, "torch": torch.__version__}
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(record, default=str) + "\n")
            out.flush()
