"""The report of a comparison (:mod:`tangentlens.comparison`): rich tables and PNG figures.

:func:`render_comparison` prints the runs and their compared steps, the flagged and refused
settings, the fit windows and recipe keys that differ, then the held-out loss and each compared
probe's declared tables (:mod:`tangentlens.reporting`; one per metric for a probe that declares
none) side by side per site kind and relative depth (frequency bin "all") with each later run's
difference from the first (column "Δ B", or "Δln B" for ratios: ln B − ln A).
:func:`write_comparison` writes ``compare.parquet`` (the table) and the figures the probes
declare for ``compare``, one line (colour) per run:

* a figure over depth (``Figure.over = "depth"``): a panel per metric against relative depth,
  each run at its compared step (solid) and at step 0 (dashed) where the run has it;
* a figure over training (a user's probe's ``<probe>.png`` by default): a panel per metric, a
  line per run (colour) and per (site kind, relative depth, method) every run has, over tokens
  seen;
* what a probe's own renderer draws (``Figure.render``, loaded by import path: this module
  names no probe).

A value whose row carries an interval is shown with it (``value [low, high]``, a band or error
bars in the figures). Rows refused by a must-match setting are neither tabled nor drawn.
"""

from __future__ import annotations

import functools
import statistics
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pyarrow.parquet as pq
from matplotlib.axes import Axes
from rich.console import Console
from rich.markup import escape
from rich.table import Table as RichTable

from tangentlens.comparison.runs import MODEL_LEVEL, Run, row_place
from tangentlens.comparison.table import (
    INTERVAL_NOTE,
    Comparison,
    difference_label,
    interval_note,
)
from tangentlens.drawing.compared import drawn
from tangentlens.drawing.plots import with_band
from tangentlens.drawing.tables import INIT_STEP, fmt_value
from tangentlens.report.declared import Reported, reported_probes
from tangentlens.reporting import Figure, Table, load_renderer

__all__ = ["TABLE_FILE", "render_comparison", "write_comparison"]

Row = dict[str, Any]

#: The comparison table's file name in the output folder.
TABLE_FILE = "compare.parquet"

#: The core's side-by-side table (each probe's come from its declarations).
_LOSS = Table("mean_loss", "held-out loss (each suite's own loss)")


def _place(kind: str, depth: float | None) -> str:
    if kind == MODEL_LEVEL:
        return "model"
    return kind if depth is None else f"{kind} {depth:.2f}"


def _headline(comparison: Comparison, probe: str, declared: Table) -> RichTable | None:
    """One metric at frequency bin "all": a row per (method, site kind, depth) — the methods
    averaged when the declaration says so — a column per run, then a Δ (or Δln) column per
    later run."""
    metric, averaged = declared.metric, not declared.per_method
    title = declared.compare_title or declared.title
    rows = [
        r
        for r in comparison.to_pylist()
        if r["probe"] == probe and r["metric"] == metric and r["freq_bin"] == "all"
    ]
    if not rows:
        return None
    cells: dict[tuple[str, str, float | None], dict[str, list[float]]] = defaultdict(
        lambda: defaultdict(list)
    )
    intervals: dict[tuple[str, str, float | None, str], tuple[float, float]] = {}
    for r in rows:
        method = "-" if averaged else r["method"]
        cells[(method, r["site_kind"], r["relative_depth"])][r["run"]].append(r["value"])
        if r["ci_low"] is not None and r["ci_high"] is not None and not averaged:
            where = (method, r["site_kind"], r["relative_depth"], r["run"])
            intervals[where] = (r["ci_low"], r["ci_high"])
    labels = [run.label for run in comparison.runs]
    later = [difference_label(label, labels[0]) for label in labels[1:]]
    delta = "Δln" if any(r["difference"] == "log_ratio" for r in rows) else "Δ"
    table = RichTable(
        title=f"[bold]{escape(title)}", title_justify="left", pad_edge=False, box=None
    )
    methods = {key[0] for key in cells}
    if methods != {"-"}:
        table.add_column("method")
    table.add_column("site, depth")
    for label in labels:
        table.add_column(escape(label), justify="right")
    for label in labels[1:]:  # against the first run
        table.add_column(escape(f"{delta} {label}"), justify="right")
    order = sorted(cells, key=lambda k: (k[0], k[1] != "embed", k[1], k[2] or 0.0))
    for method, kind, depth in order:
        got = cells[(method, kind, depth)]
        values = []
        for c in labels:
            text = fmt_value(statistics.fmean(got[c]) if got.get(c) else None)
            if (ci := intervals.get((method, kind, depth, c))) is not None:
                text += f" [{fmt_value(ci[0])}, {fmt_value(ci[1])}]"
            values.append(escape(text))
        for c in later:
            text = fmt_value(statistics.fmean(got[c]) if got.get(c) else None)
            if (ci := intervals.get((method, kind, depth, c))) is not None:
                text += f" [{fmt_value(ci[0])}, {fmt_value(ci[1])}]"
            values.append(escape(text))
        lead = [method] if methods != {"-"} else []
        table.add_row(*lead, _place(kind, depth), *values)
    return table


def _header(comparison: Comparison) -> list[str]:
    first = comparison.runs[0].label
    lines = [f"[bold]{len(comparison.runs)} runs[/] (differences against {escape(first)})"]
    for run, step in zip(comparison.runs, comparison.steps, strict=True):
        suite = run.manifest.get("suite", {})
        family = f", {suite['family']}" if "family" in suite else ""
        tokens = next((r["tokens_seen"] for r in run.rows if r["step"] == step), None)
        seen = "" if tokens is None else f", {tokens:,} tokens seen"
        partial = "" if run.finished else f" · [yellow]partial run ({len(run.steps)} steps)[/]"
        lines.append(
            f"• {escape(run.label)}: {escape(str(run.root))} · {escape(str(suite.get('name')))}"
            f" ({run.n_layers} blocks{family}) · step {step}{seen}{partial}"
        )
    lines += [f"[yellow]flagged: {escape(line)}[/]" for line in comparison.flagged]
    lines += [f"[red]refused: {escape(r.line)}[/]" for r in comparison.refused]
    lines += [f"[dim]{escape(line)}[/]" for line in comparison.fit_windows]
    unshared = [
        f"{run.label}: " + ", ".join(f"{probe} {n}" for probe, n in sorted(counts.items()))
        for run, counts in zip(comparison.runs, comparison.unshared, strict=True)
        if counts
    ]
    if unshared:
        lines.append(
            f"[dim]rows not shared (refused or in one run only): {escape('; '.join(unshared))}[/]"
        )
    differences = [r for r in comparison.to_pylist() if r["difference"] is not None]
    with_interval = sorted({r["metric"] for r in differences if r["ci_low"] is not None})
    if with_interval:
        lines.append(f"[dim]{escape(interval_note(with_interval))}[/]")
    else:
        lines.append(f"[dim]{INTERVAL_NOTE}[/]")
    return lines


def _recipe_table(comparison: Comparison) -> RichTable | None:
    if not comparison.recipe_differences:
        return None
    table = RichTable(
        title="[bold]recipe settings that differ", title_justify="left", pad_edge=False, box=None
    )
    table.add_column("key")
    for run in comparison.runs:
        table.add_column(escape(run.label))
    for key, values in comparison.recipe_differences:
        table.add_row(escape(key), *(escape(v) for v in values))
    return table


def _probes(comparison: Comparison) -> list[Reported]:
    """The probes of the compared rows, with their declarations (report order)."""
    return reported_probes(comparison.to_pylist(), [run.manifest for run in comparison.runs])


def render_comparison(comparison: Comparison, console: Console) -> None:
    """Print the comparison's header lines and tables."""
    for line in _header(comparison):
        console.print(line, soft_wrap=True)
    console.print()
    tables = [_recipe_table(comparison), _headline(comparison, "capture", _LOSS)]
    tables += [
        _headline(comparison, probe.name, declared)
        for probe in _probes(comparison)
        for declared in probe.tables
        if declared.in_compare
    ]
    for table in tables:
        if table is not None:
            console.print(table)
            console.print()


# ---------------------------------------------------------------------------------- figures


def _over_training(
    comparison: Comparison, path: Path, *, panels: list[tuple[str, Figure]], title: str
) -> bool:
    """A panel per (probe, figure) over training, as the run's report draws it: a line per run
    (colour) and per (site kind, relative depth, method, rank) that every run has (the methods
    averaged where the figure says so), over tokens seen when every row knows them, with the
    rows' interval as a band."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.8), squeeze=False)
    drew = False
    for ax, (probe, figure) in zip(axes[0], panels, strict=True):
        shown = [drawn(comparison, run, probe, figure.metric) for run in comparison.runs]

        def key(r: Row, run: Run, per_method: bool = figure.per_method) -> tuple[Any, ...]:
            proxy = (r["method"], r["rank"]) if per_method else (None, None)
            return (*row_place(r, run.n_layers), *proxy)

        shared = set.intersection(
            *({key(r, run) for r in rows} for run, rows in zip(comparison.runs, shown, strict=True))
        )
        tokens = all(r["tokens_seen"] is not None for rows in shown for r in rows)
        for i, (run, rows) in enumerate(zip(comparison.runs, shown, strict=True)):
            for j, where in enumerate(sorted(shared, key=str)):
                by_x: dict[int, list[Row]] = defaultdict(list)
                for r in rows:
                    if key(r, run) == where:
                        by_x[r["tokens_seen"] if tokens else r["step"]].append(r)
                points = [
                    (x, statistics.fmean(r["value"] for r in got), *_mean_interval(got))
                    for x, got in sorted(by_x.items())
                ]
                if points:
                    kind, depth, method, rank = where
                    place = _place(kind, None if depth is None else float(depth))
                    proxy = (
                        ""
                        if method is None
                        else f" {method}" + ("" if rank is None else f" (rank {rank})")
                    )
                    style = {"color": f"C{i}", "alpha": 1.0 - 0.5 * j / max(len(shared), 1)}
                    with_band(ax, points, label=f"{run.label} {place}{proxy}", **style)
                    drew = True
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel("tokens seen (0 = initialisation)" if tokens else "training step")
        ax.set_ylabel(figure.label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    if not drew:
        plt.close(fig)
        return False
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _mean_interval(rows: list[Row]) -> tuple[float | None, float | None]:
    """The means of the rows' interval ends, or ``(None, None)`` when a row carries none."""
    if any(r["ci_low"] is None or r["ci_high"] is None for r in rows):
        return None, None
    return (
        statistics.fmean(r["ci_low"] for r in rows),
        statistics.fmean(r["ci_high"] for r in rows),
    )


def _depth_profile(ax: Axes, comparison: Comparison, probe: str, metric: str) -> bool:
    """One line per run at its compared step (solid) and at step 0 (dashed), over relative
    depth (the embedding and the residual stream after each block)."""
    drew = False
    for i, (run, step) in enumerate(zip(comparison.runs, comparison.steps, strict=True)):
        rows = drawn(comparison, run, probe, metric)
        lines = [(step, "o-", run.label, 1.0)]
        if step != INIT_STEP and INIT_STEP in run.steps:
            lines.append((INIT_STEP, "o--", f"{run.label} at init", 0.6))
        for at, style, label, alpha in lines:
            points = sorted(
                (float(depth), r["value"])
                for r in rows
                if r["step"] == at
                for kind, depth in [row_place(r, run.n_layers)]
                if kind in ("embed", "resid_post")
            )
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, style, color=f"C{i}", alpha=alpha, label=label, markersize=4)
                drew = True
    ax.set_xlim(-0.03, 1.03)
    ax.set_xlabel("relative depth (0 = embedding, 1 = last block)")
    ax.grid(alpha=0.3)
    return drew


def _profiles(
    comparison: Comparison, path: Path, *, panels: list[tuple[str, str, str]], title: str
) -> bool:
    """A panel per (probe, metric, label) over relative depth (:func:`_depth_profile`)."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.8), squeeze=False)
    drew = [
        _depth_profile(ax, comparison, probe, metric)
        for ax, (probe, metric, _) in zip(axes[0], panels, strict=True)
    ]
    if not any(drew):
        plt.close(fig)
        return False
    for ax, (_, _, label), did in zip(axes[0], panels, drew, strict=True):
        ax.set_ylabel(label)
        if did:
            ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_comparison(comparison: Comparison, out: str | Path) -> list[Path]:
    """Write ``compare.parquet`` and every figure the runs' rows allow into ``out`` (created);
    returns the paths written."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    table = folder / TABLE_FILE
    pq.write_table(comparison.table, table)
    written = [table]
    files: dict[str, list[tuple[str, Figure]]] = {}
    for probe in _probes(comparison):
        for figure in probe.figures:
            if figure.in_compare:
                files.setdefault(figure.file, []).append((probe.name, figure))
    jobs: dict[str, Callable[[Path], bool]] = {}
    for name, panels in files.items():
        first = panels[0][1]
        if first.render is not None:
            jobs[name] = functools.partial(load_renderer(first.render), comparison)
        elif first.over == "depth":
            specs = [(probe, f.metric, f.label) for probe, f in panels]
            title = first.compare_title or first.title
            jobs[name] = functools.partial(_profiles, comparison, panels=specs, title=title)
        else:
            title = first.compare_title or first.title
            jobs[name] = functools.partial(_over_training, comparison, panels=panels, title=title)
    for name, draw in jobs.items():
        path = folder / name
        if draw(path):
            written.append(path)
    return written
