"""What every probe shares: the tidy result row, what a probe needs captured, and the capture of
one checkpoint step that probes turn into rows.

Rows follow one schema (:data:`ROW_FIELDS`): ``suite, step, tokens_seen, site, layer, probe,
method, rank, freq_bin, metric, value, ci_low, ci_high, n_tokens``; ``freq_bin`` is ``"all"`` or
the bin index as a string; ``method`` names the dictionary (or ``"-"`` where none applies).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Integral, Real
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tangentlens.probes.configs import Needs

if TYPE_CHECKING:
    from tangentlens.capture import CaptureStatistics
    from tangentlens.data import FrequencyTable

__all__ = [
    "ROW_FIELDS",
    "Capture",
    "Needs",
    "StepLabel",
    "bin_label",
    "check_row",
    "make_row",
    "measurement",
    "row",
]

#: The columns of a result row, in order.
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

#: The Python type of each field's non-null values (``step``, ``tokens_seen``, ``layer``,
#: ``rank``, ``n_tokens`` are integers; ``value``, ``ci_low``, ``ci_high`` numbers).
_FIELD_TYPES: dict[str, type] = {
    "suite": str,
    "step": Integral,
    "tokens_seen": Integral,
    "site": str,
    "layer": Integral,
    "probe": str,
    "method": str,
    "rank": Integral,
    "freq_bin": str,
    "metric": str,
    "value": Real,
    "ci_low": Real,
    "ci_high": Real,
    "n_tokens": Integral,
}
#: Fields that may be None (missing).
_NULLABLE = frozenset({"tokens_seen", "layer", "rank", "ci_low", "ci_high", "n_tokens"})


def check_row(row: Mapping[str, Any], where: str) -> None:
    """Refuse a row outside the results schema (a missing, extra or mistyped field), naming
    ``where`` (the unit or call) and the field."""
    if not isinstance(row, Mapping):
        raise ValueError(f"{where}: a row must be a dict of {list(ROW_FIELDS)}, got {row!r}")
    missing = [f for f in ROW_FIELDS if f not in row]
    extra = sorted(set(row) - set(ROW_FIELDS))
    if missing or extra:
        raise ValueError(
            f"{where}: a row of probe {row.get('probe')!r} has missing fields {missing} and "
            f"unknown fields {extra}; the schema: {list(ROW_FIELDS)} (make_row builds one)"
        )
    for name, kind in _FIELD_TYPES.items():
        value = row[name]
        if value is None and name in _NULLABLE:
            continue
        if isinstance(value, bool) or not isinstance(value, kind):
            raise ValueError(
                f"{where}: row field {name!r} of probe {row['probe']!r} (metric "
                f"{row.get('metric')!r}) must be {kind.__name__.lower()}"
                f"{' or None' if name in _NULLABLE else ''}, got {value!r}"
            )


@dataclass(frozen=True)
class StepLabel:
    """What names a step's rows: the suite (or model), the checkpoint step, the tokens it had
    seen, and the block index of each site (None for the embedding)."""

    suite: str
    step: int
    tokens_seen: int | None
    layers: dict[str, int | None]


@dataclass(frozen=True)
class Capture:
    """One checkpoint's captured statistics, what every per-step probe reads.

    ``statistics`` are the streamed moments, bins, type sums, reservoir and attention sums of
    one capture (:func:`tangentlens.capture.capture_statistics`); ``layers`` maps each captured
    site to its block index (None for the embedding); ``seq_len`` is the width of the token
    rows (row id // seq_len = sequence index); ``frequencies`` the token frequency table the
    bins come from. ``suite``, ``step`` and ``tokens_seen`` label the rows (the step also seeds
    the controls). :meth:`save` and :meth:`load` keep it for later, every probe giving the same
    numbers on the reloaded capture.
    """

    suite: str
    step: int
    tokens_seen: int | None
    statistics: CaptureStatistics
    layers: dict[str, int | None]
    seq_len: int
    frequencies: FrequencyTable | None = None

    def save(self, path: str | Path) -> Path:
        """Write the capture to ``path`` (a torch file, read back with ``weights_only=True``);
        written atomically. Returns the path."""
        from tangentlens.capture import save_statistics

        extra = {
            "suite": self.suite,
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "layers": dict(self.layers),
            "seq_len": self.seq_len,
            "counts": None if self.frequencies is None else self.frequencies.counts,
        }
        save_statistics(self.statistics, path, extra)
        return Path(path)

    @classmethod
    def load(cls, path: str | Path) -> Capture:
        """A capture written by :meth:`save`."""
        from tangentlens.capture import load_statistics
        from tangentlens.data import FrequencyTable

        statistics, extra = load_statistics(path)
        missing = {"suite", "step", "tokens_seen", "layers", "seq_len", "counts"} - set(extra)
        if missing:
            raise ValueError(
                f"{str(path)!r} holds capture statistics but not a tangentlens Capture (missing "
                f"{sorted(missing)}); save one with Capture.save"
            )
        counts = extra["counts"]
        return cls(
            suite=extra["suite"],
            step=int(extra["step"]),
            tokens_seen=None if extra["tokens_seen"] is None else int(extra["tokens_seen"]),
            statistics=statistics,
            layers=dict(extra["layers"]),
            seq_len=int(extra["seq_len"]),
            frequencies=None if counts is None else FrequencyTable(np.asarray(counts)),
        )


def row(
    suite: str,
    step: int,
    tokens_seen: int | None,
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
    data: StepLabel | Capture,
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
