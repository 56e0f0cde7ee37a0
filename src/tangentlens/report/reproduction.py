"""Which of the seed papers' qualitative findings hold on this run, each with its numbers
(METHODS.md §1.9): the findings every reported probe declares (``Reporting.findings``, made of
:mod:`tangentlens.findings`), in the report's order of probes
(:func:`~tangentlens.report.declared.reported_probes`). Built in: the bell of anisotropy over
depth and the rise and fall of the intrinsic dimension (``shape_of_learning``), the
frequency–spread correlation (``frequency_geometry``), the tangent energy ratio early and late
(``tangent_energy``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tangentlens.findings import NOT_TESTABLE, Finding
from tangentlens.report.declared import reported_probes

__all__ = ["NOT_TESTABLE", "Finding", "reproduction_summary"]


def reproduction_summary(
    rows: list[dict[str, Any]], manifests: Iterable[Mapping[str, Any]] = ()
) -> list[Finding]:
    """The findings the run's probes can speak to: each reported probe's declared findings on
    ``rows`` (one per site kind with the metric's rows); ``manifests`` say which recipe key
    found each probe."""
    return [
        finding
        for probe in reported_probes(rows, manifests)
        for findings in probe.findings
        for finding in findings(rows)
    ]
