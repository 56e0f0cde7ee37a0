"""What a figure of ``compare`` reads of the comparison it is given (a
:class:`tangentlens.comparison.Comparison`, described here by the parts it reads, so a renderer
needs no import from the comparison): its runs — each with its ``label``, every row
(``rows``) and where a row sits in the model (``place``: site kind and relative depth) — and
whether a must-match setting that differs concerns a row (``is_refused``)."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import Protocol

from tangentlens.drawing.tables import Row

__all__ = ["Compared", "ComparedRun", "drawn"]


class ComparedRun(Protocol):
    """One compared run, as a figure reads it."""

    @property
    def label(self) -> str:
        """The run's name in the comparison."""

    @property
    def rows(self) -> Sequence[Row]:
        """Every row of the run, all steps."""

    def place(self, row: Row) -> tuple[str, Fraction | None]:
        """The row's site kind and relative depth."""


class Compared(Protocol):
    """A comparison, as a figure reads it."""

    @property
    def runs(self) -> Sequence[ComparedRun]:
        """The runs, the reference of the differences first."""

    def is_refused(self, row: Row) -> bool:
        """Whether a must-match setting that differs concerns this row."""


def drawn(comparison: Compared, run: ComparedRun, probe: str, metric: str) -> list[Row]:
    """The run's rows of ``probe``/``metric`` at frequency bin "all" that are not refused."""
    return [
        r
        for r in run.rows
        if r["probe"] == probe
        and r["metric"] == metric
        and r["freq_bin"] == "all"
        and not comparison.is_refused(r)
    ]
