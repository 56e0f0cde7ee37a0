"""What every probe shares: the tidy result row, what a probe needs captured, and the data of
one checkpoint step that probes turn into rows.

Rows follow one schema (:data:`ROW_FIELDS`): ``suite, step, tokens_seen, site, layer, probe,
method, rank, freq_bin, metric, value, ci_low, ci_high, n_tokens``; ``freq_bin`` is ``"all"`` or
the bin index as a string; ``method`` names the dictionary (or ``"-"`` where none applies).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tangentlens.capture import CaptureStatistics
from tangentlens.data import FrequencyTable
from tangentlens.probes.configs import Needs

__all__ = ["ROW_FIELDS", "Needs", "StepData", "bin_label", "make_row", "measurement", "row"]

ROW_FIELDS: tuple[str, ...] = (
    "suite",
    "step",
    "tokens_seen",
    "site",
    "layer",
    "probe",
    "method",
    "rank",
    "freq_bin",
    "metric",
    "value",
    "ci_low",
    "ci_high",
    "n_tokens",
)


@dataclass(frozen=True)
class StepData:
    """One checkpoint step's captured statistics and where they come from.

    ``layers`` maps each captured site to its block index (None for the embedding);
    ``seq_len`` is the width of the token rows (row id // seq_len = sequence index);
    ``frequencies`` the token frequency table of the analysis corpus; ``statistics`` is None
    for rows computed from saved state rather than a capture (a sweep's transitions).
    """

    suite: str
    step: int
    tokens_seen: int
    statistics: CaptureStatistics | None
    layers: dict[str, int | None]
    seq_len: int
    frequencies: FrequencyTable | None = None


def row(
    suite: str,
    step: int,
    tokens_seen: int,
    probe: str,
    metric: str,
    value: float,
    *,
    site: str = "-",
    layer: int | None = None,
    method: str = "-",
    rank: int | None = None,
    freq_bin: str = "all",
    ci: tuple[float, float] | None = None,
    n_tokens: int | None = None,
) -> dict[str, Any]:
    """One tidy row in :data:`ROW_FIELDS` order."""
    return {
        "suite": suite,
        "step": step,
        "tokens_seen": tokens_seen,
        "site": site,
        "layer": layer,
        "probe": probe,
        "method": method,
        "rank": rank,
        "freq_bin": freq_bin,
        "metric": metric,
        "value": float(value),
        "ci_low": None if ci is None else float(ci[0]),
        "ci_high": None if ci is None else float(ci[1]),
        "n_tokens": n_tokens,
    }


def make_row(
    data: StepData,
    probe: str,
    metric: str,
    value: float,
    *,
    site: str = "-",
    layer: int | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A :func:`row` of this step; ``layer`` defaults to the captured site's block index."""
    return row(
        data.suite,
        data.step,
        data.tokens_seen,
        probe,
        metric,
        value,
        site=site,
        layer=data.layers.get(site, layer),
        **fields,
    )


def bin_label(bin_index: int | None) -> str:
    """The ``freq_bin`` value: ``"all"`` for None, else the bin index as a string."""
    return "all" if bin_index is None else str(bin_index)


def measurement(
    site: str, method: str, rank: int, bin_index: int | None, n_tokens: int
) -> dict[str, Any]:
    """The keyword arguments of :func:`make_row` that name one (site, method, bin) cell."""
    return {
        "site": site,
        "method": method,
        "rank": rank,
        "freq_bin": bin_label(bin_index),
        "n_tokens": n_tokens,
    }
