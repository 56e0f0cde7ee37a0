"""The comparison table: the rows two or more runs share at their compared steps, side by side,
and each later run's difference from the first.

Rows match across runs on ``(probe, metric, method, rank, freq_bin, site kind, relative depth)``
(:mod:`tangentlens.comparison.runs`: the site kind makes a decoder's ``blocks.3.hook_resid_post``
and a BERT encoder's ``blocks.3.hook_normalized_resid_post`` the same place), each run at its
compared step: its last scored step with rows by default, or one step every run has. Model-free rows
(``untrained_block``, at a negative step) are not compared. A row is shared when every run has
it and no must-match setting that concerns it differs (:mod:`tangentlens.comparison.settings`:
a probe's own recipe keys included); a row that compares steps (written by the across-steps
unit: a transition from the previous scored step) only when every run's transition into its
compared step is the same (64 → 1200 is not 0 → 1200).

The table has the tidy schema plus ``run``, ``site_kind``, ``relative_depth`` and
``difference``. Per shared key, one row per run — that run's own row, unchanged, ``run`` its
label, ``difference`` null — then one row per later run B against the first run A: ``run``
``"B − A"``, ``difference`` ``"log_ratio"`` for ratio metrics (:func:`is_ratio`: ``value`` =
ln B − ln A, NaN unless both are > 0) else ``"difference"`` (``value`` = B − A), ``site`` the
site kind, ``suite``, ``step``, ``tokens_seen``, ``layer``, ``n_tokens`` null.

A difference has an interval (``ci_low``, ``ci_high``) where both runs kept the bootstrap
replicates of the two rows (``probes.tangent_energy.keep_replicates``: ``energy_fraction``,
``energy_ratio`` and ``energy_complement_ratio``): the 95 % percentile interval of the replicate
differences (ln B*ᵢ − ln A*ᵢ, or B*ᵢ − A*ᵢ), widened to contain the difference itself.
Replicate i of both runs resamples the same sequence indices (the bootstrap's seed is the
recipe's), so for runs over the same sequences this is a paired bootstrap of the difference; the
runs' own studentized intervals are asymmetric, so their bounds alone could not be combined.
Elsewhere the interval is null.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tangentlens.comparison.runs import Run, read_run, row_place
from tangentlens.comparison.settings import (
    Refusal,
    corpus_size_flag,
    estimator_refusals,
    fit_window_lines,
    flag_lines,
    precision_refusals,
    recipe_differences,
    refusals,
    transition_refusal,
)
from tangentlens.results import SCHEMA

__all__ = [
    "COMPARE_SCHEMA",
    "INTERVAL_NOTE",
    "INTERVAL_WITH_REPLICATES",
    "Comparison",
    "compare",
    "difference_label",
    "is_ratio",
]

Row = dict[str, Any]
Key = tuple[str, str, str, Any, str, str, Fraction | None]

#: The comparison table's schema: the tidy result schema plus where each row sits and whose it is.
COMPARE_SCHEMA = pa.schema(
    [
        *SCHEMA,
        pa.field("run", pa.string()),
        pa.field("site_kind", pa.string()),
        pa.field("relative_depth", pa.float64()),
        pa.field("difference", pa.string()),
    ]
)

#: Why a difference carries no interval.
INTERVAL_NOTE = (
    "differences without an interval: a run kept no bootstrap replicates for them (set "
    "probes.tangent_energy.keep_replicates = true), and the studentized intervals are "
    "asymmetric, so two runs' bounds cannot be combined"
)
#: How the differences' intervals were formed, where the runs kept replicates.
INTERVAL_WITH_REPLICATES = (
    "[lo, hi] after a difference: 95 % percentile interval of the runs' paired bootstrap "
    "replicate differences (energy_fraction, energy_ratio, energy_complement_ratio); other "
    "differences have none"
)
#: The level of the differences' intervals (that of the runs' own intervals).
DIFFERENCE_LEVEL = 0.95


def is_ratio(metric: str) -> bool:
    """Ratio metrics are compared on the log scale: ``*_ratio`` (a ratio to its null, whose
    reference is 1). ``energy_enrichment`` is not one: its null is ``(1 − D)·d/(d − 1)``,
    reported beside it (``energy_enrichment_null``), so it is compared as a plain difference."""
    return metric.endswith("_ratio")


def difference_label(later: str, first: str) -> str:
    """The ``run`` of a difference row: ``"B − A"``."""
    return f"{later} − {first}"


def _difference(metric: str, first: float | None, later: float | None) -> float:
    if first is None or later is None:
        return math.nan
    if is_ratio(metric):
        return math.log(later) - math.log(first) if first > 0 and later > 0 else math.nan
    return later - first


def _difference_interval(
    metric: str, value: float, first: np.ndarray | None, later: np.ndarray | None
) -> tuple[float | None, float | None]:
    """The percentile interval of the replicate differences (paired by replicate index),
    widened to contain ``value``; ``(None, None)`` without replicates of both rows."""
    if first is None or later is None or not math.isfinite(value):
        return None, None
    n = min(first.size, later.size)
    a, b = first[:n], later[:n]
    with np.errstate(divide="ignore", invalid="ignore"):
        differences = np.log(b) - np.log(a) if is_ratio(metric) else b - a
    differences = differences[np.isfinite(differences)]
    if differences.size < 2:
        return None, None
    tail = (1 - DIFFERENCE_LEVEL) / 2
    low, high = np.quantile(differences, (tail, 1 - tail))
    return min(float(low), value), max(float(high), value)


def _match_key(r: Row, n_layers: int) -> Key:
    """What a row (or replicate record) is matched across runs on."""
    kind, depth = row_place(r, n_layers)
    return (r["probe"], r["metric"], r["method"], r["rank"], r["freq_bin"], kind, depth)


def _replicates(run: Run, step: int) -> dict[Key, np.ndarray]:
    """The run's replicate values at ``step`` by match key."""
    out: dict[Key, np.ndarray] = {}
    for r in run.replicates:
        if r["step"] == step:
            out[_match_key(r, run.n_layers)] = np.asarray(r["replicates"], dtype=np.float64)
    return out


def _bin_order(freq_bin: str) -> tuple[bool, int, str]:
    return (freq_bin == "all", int(freq_bin) if freq_bin.isdigit() else -1, freq_bin)


def _sort_key(key: Key) -> tuple[Any, ...]:
    probe, metric, method, rank, freq_bin, kind, depth = key
    return (
        probe,
        metric,
        method,
        -1 if rank is None else rank,
        _bin_order(freq_bin),
        kind,
        -1 if depth is None else depth,
    )


def _keyed(run: Run, step: int) -> dict[Key, Row]:
    """The run's rows at ``step`` by match key; a repeated key is a ``ValueError``."""
    out: dict[Key, Row] = {}
    for r in run.rows:
        if r["step"] != step:
            continue
        key = _match_key(r, run.n_layers)
        if key in out:
            raise ValueError(
                f"run {run.label} has two {r['metric']} rows at step {step} for site "
                f"{r['site']}, method {r['method']!r}, bin {r['freq_bin']!r}"
            )
        out[key] = r
    return out


@dataclass(frozen=True)
class Comparison:
    """A comparison of ``runs`` (the first is the reference of the differences), each at its
    entry of ``steps``: the table (:meth:`to_arrow`, :meth:`to_pandas`), the refused settings
    (``refused``), the flagged ones (``flagged``), the recipe keys that differ
    (``recipe_differences``: key, each run's value), the fit windows when they differ
    (``fit_windows``) and, per run, the rows of its compared step that were not shared, by probe
    (``unshared``)."""

    runs: tuple[Run, ...]
    steps: tuple[int, ...]
    table: pa.Table
    refused: tuple[Refusal, ...]
    flagged: tuple[str, ...]
    recipe_differences: tuple[tuple[str, list[str]], ...]
    fit_windows: tuple[str, ...]
    unshared: tuple[Counter, ...]

    def to_arrow(self) -> pa.Table:
        return self.table

    def to_pandas(self) -> Any:
        """A pandas DataFrame (integer columns as nullable integers)."""
        import pandas as pd

        return self.table.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)

    def to_pylist(self) -> list[Row]:
        return self.table.to_pylist()

    def __len__(self) -> int:
        return self.table.num_rows

    def __repr__(self) -> str:
        labels = ", ".join(
            f"{r.label} @ step {s}" for r, s in zip(self.runs, self.steps, strict=True)
        )
        return f"Comparison({labels}; {len(self)} rows)"

    def is_refused(self, row: Row) -> bool:
        """Whether a must-match setting that differs concerns this row."""
        return any(refusal.concerns(row) for refusal in self.refused)


def _labels(paths: Sequence[Path], labels: Sequence[str] | None) -> list[str]:
    if labels is not None:
        if len(labels) != len(paths) or len(set(labels)) != len(labels):
            raise ValueError(
                f"labels must name each of the {len(paths)} runs once, got {list(labels)}"
            )
        return list(labels)
    names = [p.name for p in paths]
    if len(set(names)) == len(names):
        return names
    return [str(p) for p in paths]  # same folder names: the paths tell them apart


def compare(
    runs: Sequence[str | Path],
    *,
    step: int | str = "last",
    labels: Sequence[str] | None = None,
) -> Comparison:
    """Compare the run directories ``runs`` (two or more; finished or partial), the first being
    the reference of the differences.

    ``step``: ``"last"`` (each run's last scored step with rows) or a step every run has.
    ``labels``: the runs' names in the table (default: the folder names). Returns a
    :class:`Comparison` whose table holds the shared rows side by side and the differences (see
    the module docstring). A ``ValueError`` when fewer than two runs are given or no row is shared.
    """
    if isinstance(runs, str | Path):
        raise ValueError(f"runs must be a list of run directories, got the single path {runs!r}")
    paths = [Path(r) for r in runs]
    if len(paths) < 2:
        raise ValueError(f"compare needs two or more run directories, got {len(paths)}")
    read = [read_run(p, label) for p, label in zip(paths, _labels(paths, labels), strict=True)]
    steps = [run.pick_step(step) for run in read]
    mixed, precision_flags = precision_refusals(read)
    refused = [*refusals(read), *estimator_refusals(read), *mixed]
    if (across := transition_refusal(read, steps)) is not None:
        refused.append(across)
    flagged = [*flag_lines(read), *precision_flags]
    size = corpus_size_flag(read, steps)
    if size is not None:
        flagged.append(size)
    keyed = [_keyed(run, s) for run, s in zip(read, steps, strict=True)]
    kept = [_replicates(run, s) for run, s in zip(read, steps, strict=True)]
    common = set(keyed[0]).intersection(*keyed[1:])
    shared = sorted(
        (k for k in common if not any(r.concerns(keyed[0][k]) for r in refused)),
        key=_sort_key,
    )
    out: list[Row] = []
    for key in shared:
        _, metric, method, rank, freq_bin, kind, depth = key
        place = {"site_kind": kind, "relative_depth": None if depth is None else float(depth)}
        for run, rows in zip(read, keyed, strict=True):
            out.append({**rows[key], "run": run.label, **place, "difference": None})
        first = keyed[0][key]["value"]
        for run, rows, replicates in zip(read[1:], keyed[1:], kept[1:], strict=True):
            value = _difference(metric, first, rows[key]["value"])
            low, high = _difference_interval(metric, value, kept[0].get(key), replicates.get(key))
            out.append(
                {
                    **dict.fromkeys(SCHEMA.names),
                    "site": kind,
                    "probe": key[0],
                    "method": method,
                    "rank": rank,
                    "freq_bin": freq_bin,
                    "metric": metric,
                    "value": value,
                    "ci_low": low,
                    "ci_high": high,
                    "run": difference_label(run.label, read[0].label),
                    **place,
                    "difference": "log_ratio" if is_ratio(metric) else "difference",
                }
            )
    if not out:
        at = ", ".join(f"{run.label} step {s}" for run, s in zip(read, steps, strict=True))
        why = "; ".join(r.line for r in refused) or "no metric at a common site kind and depth"
        raise ValueError(f"the runs share no comparable row ({at}): {why}")
    compared = set(shared)
    unshared = tuple(Counter(k[0] for k in rows if k not in compared) for rows in keyed)
    return Comparison(
        runs=tuple(read),
        steps=tuple(steps),
        table=pa.Table.from_pylist(out, schema=COMPARE_SCHEMA),
        refused=tuple(refused),
        flagged=tuple(flagged),
        recipe_differences=tuple(recipe_differences(read)),
        fit_windows=tuple(fit_window_lines(read)),
        unshared=unshared,
    )
