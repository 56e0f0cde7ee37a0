"""Runs side by side: ``tangentlens.compare(runs)`` (``tangentlens compare RUN_A RUN_B …``).

:mod:`tangentlens.comparison.runs` reads run directories and places each row (site kind,
relative depth), :mod:`tangentlens.comparison.settings` says which recipe settings must match
and which are flagged, :mod:`tangentlens.comparison.table`
matches the rows and computes the differences. The rendering and figures are in
:mod:`tangentlens.report.compare_report`.
"""

from tangentlens._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        ".table": ("COMPARE_SCHEMA", "Comparison", "compare"),
        ".runs": ("Run", "read_run"),
    },
)
