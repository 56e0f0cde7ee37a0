"""The results schema: the tidy row every probe returns, its parquet schema, and
:class:`ResultTable`, the rows of a measurement in memory.

Rows follow one schema (:data:`ROW_FIELDS`): ``suite, step, tokens_seen, site, layer, probe,
method, rank, freq_bin, metric, value, ci_low, ci_high, n_tokens``; ``freq_bin`` is ``"all"`` or
the bin index as a string; ``method`` names the dictionary (or ``"-"`` where none applies);
``rank`` is the width of the basis a row measures (None where no basis applies). The store
(:mod:`tangentlens.sweep.store`) writes :data:`SCHEMA`; :func:`check_row` refuses a row outside it.

A row with a bootstrap interval may keep its replicates (opt-in,
``probes.tangent_energy.keep_replicates``): one record per row (:func:`replicate_record`, the
row's labels :data:`REPLICATE_FIELDS` and the list of replicate values, in replicate order;
parquet :data:`REPLICATE_SCHEMA`), from which intervals of differences between runs are formed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, Protocol

import pyarrow as pa

__all__ = [
    "REPLICATE_FIELDS",
    "REPLICATE_SCHEMA",
    "ROW_FIELDS",
    "SCHEMA",
    "Labelled",
    "ResultTable",
    "StepLabel",
    "bin_label",
    "check_row",
    "make_row",
    "measurement",
    "replicate_record",
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

#: The parquet type of each field.
_ARROW_TYPES = {
    "suite": pa.string(),
    "step": pa.int64(),
    "tokens_seen": pa.int64(),
    "site": pa.string(),
    "layer": pa.int64(),
    "probe": pa.string(),
    "method": pa.string(),
    "rank": pa.int64(),
    "freq_bin": pa.string(),
    "metric": pa.string(),
    "value": pa.float64(),
    "ci_low": pa.float64(),
    "ci_high": pa.float64(),
    "n_tokens": pa.int64(),
}
#: The parquet schema of result rows, in :data:`ROW_FIELDS` order.
SCHEMA = pa.schema([(name, _ARROW_TYPES[name]) for name in ROW_FIELDS])

#: The labels of a replicate record: the row's, without its value, interval and counts.
REPLICATE_FIELDS: tuple[str, ...] = tuple(
    f for f in ROW_FIELDS if f not in ("tokens_seen", "value", "ci_low", "ci_high", "n_tokens")
)
#: The parquet schema of replicate records: :data:`REPLICATE_FIELDS` and ``replicates``.
REPLICATE_SCHEMA = pa.schema(
    [
        *((name, _ARROW_TYPES[name]) for name in REPLICATE_FIELDS),
        ("replicates", pa.list_(pa.float64())),
    ]
)


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


class Labelled(Protocol):
    """Whatever carries a :class:`StepLabel`'s fields: a step label, or a capture (which labels
    its own rows)."""

    @property
    def suite(self) -> str: ...
    @property
    def step(self) -> int: ...
    @property
    def tokens_seen(self) -> int | None: ...
    @property
    def layers(self) -> Mapping[str, int | None]: ...


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
    data: Labelled,
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


class ResultTable:
    """Tidy result rows (the sweep's schema: ``suite, step, tokens_seen, site, layer, probe,
    method, rank, freq_bin, metric, value, ci_low, ci_high, n_tokens``)."""

    def __init__(self, rows: Iterable[Mapping[str, Any]]) -> None:
        self._table = pa.Table.from_pylist(list(rows), schema=SCHEMA)

    def to_arrow(self) -> pa.Table:
        return self._table

    def to_pandas(self) -> Any:
        """A pandas DataFrame, one row per measurement (``step``, ``layer``, ``rank``,
        ``n_tokens`` as nullable integers: the embedding's layer is missing, not NaN)."""
        import pandas as pd

        return self._table.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)

    def to_pylist(self) -> list[dict[str, Any]]:
        return self._table.to_pylist()

    def __len__(self) -> int:
        return self._table.num_rows

    def __repr__(self) -> str:
        probes = sorted(set(self._table.column("probe").to_pylist()))
        return f"ResultTable({len(self)} rows; probes {probes})"

    def where(self, **fields: Any) -> ResultTable:
        """The rows whose ``fields`` equal the given values (``metric="energy_ratio"``, …)."""
        unknown = sorted(set(fields) - set(SCHEMA.names))
        if unknown:
            raise ValueError(f"unknown row fields {unknown}; allowed: {SCHEMA.names}")
        return ResultTable(r for r in self.to_pylist() if all(r[k] == v for k, v in fields.items()))

    def value(self, **fields: Any) -> float:
        """The value of the one row whose ``fields`` equal the given values."""
        rows = self.where(**fields).to_pylist()
        if len(rows) != 1:
            raise ValueError(
                f"{len(rows)} rows match {fields}; name the row fully (site, method, freq_bin, …)"
            )
        return rows[0]["value"]


def replicate_record(row: Mapping[str, Any], values: Iterable[float]) -> dict[str, Any]:
    """The replicate record of ``row`` (a result row): its labels and the replicate ``values``
    (NaN for a replicate without a value)."""
    return {
        **{name: row[name] for name in REPLICATE_FIELDS},
        "replicates": [float(v) for v in values],
    }
