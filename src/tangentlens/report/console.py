"""The rich console shared by the CLI and the reports."""

from __future__ import annotations

import math

from rich.console import Console

console = Console(highlight=False)
error_console = Console(stderr=True, highlight=False)


def fail(message: str) -> None:
    """One red line on stderr (the CLI exits with code 2 after it)."""
    error_console.print(f"[bold red]error:[/] {message}", soft_wrap=True)


def fmt_value(value: float | None) -> str:
    """A table cell: 3 decimals, scientific notation for very large or small values, "–" for
    a missing one.

    >>> fmt_value(0.12345), fmt_value(2.5e-5), fmt_value(None)
    ('0.123', '2.50e-05', '–')
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if value != 0 and (abs(value) >= 1e4 or abs(value) < 1e-3):
        return f"{value:.2e}"
    return f"{value:.3f}"
