"""The progress bar shared by training and sweeps (``tangentlens.report.progress``; mutmut
survivors): it prints on the report's console, and its line reads description, bar, n/N,
status, elapsed time, "ETA" and the time remaining, in that order."""

from __future__ import annotations

from rich.console import Console

from tangentlens.report import progress
from tangentlens.report.console import console


def test_the_bar_prints_on_the_shared_console():
    assert progress._progress().console is console


def test_the_bar_reads_description_bar_count_status_elapsed_and_eta():
    """A task 3 of 10 done, its clock stopped at its start: 0:00:00 elapsed, no estimate yet."""
    bar = progress._progress()
    bar.get_time = lambda: 100.0
    bar.add_task("training micro", total=10, completed=3, status="loss 2.500")
    out = Console(record=True, width=120, color_system=None)
    out.print(bar.get_renderable())
    done = "━" * 12 + " " * 28  # 30 % of the bar's 40 columns
    assert out.export_text() == f"training micro {done}  3/10 loss 2.500 0:00:00 ETA -:--:--\n"
