"""PNG figures of a run, written to ``RUN_DIR/figures``: each figure a present probe declares
(:mod:`tangentlens.reporting`; a probe that declares none gets ``<probe>.png``, a panel per
metric over steps), drawn here — over steps, a line per site kind, layer and method; over depth,
a line per step — or, where the declaration names one (``Figure.render``), by the probe's own
renderer, loaded by import path: this module names no probe.

A figure never averages rows that differ in a key that varies: a line (or a row of panels) per
site kind, and per proxy method and rank unless the figure declares that it averages the
methods (``Figure.per_method``, e.g. over attention heads, named in its label); over depth, the
embedding's rows are the left end of every line and rows about the whole model (site ``"-"``)
are left out (they have no depth), over steps they are a line of their own. Where the rows
carry an interval it is drawn as a band. Steps are drawn on a symmetric-log axis (step 0 and
Pythia's log-spaced early steps both show).
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from tangentlens import reporting
from tangentlens.drawing.plots import Point, depth, draw_line, layer_name, point, steps_axis
from tangentlens.models.sites import site_kind
from tangentlens.report.declared import reported_probes
from tangentlens.sweep.store import read_results

__all__ = ["write_figures"]

Row = dict[str, Any]

#: A line's key: the row's site kind, block, proxy method and rank (method and rank None where
#: a figure averages the methods).
LineKey = tuple[str, Any, Any, Any]
#: The label of a line of rows about the whole model (site ``"-"``, no block; the tables' ``-``).
WHOLE_MODEL = "whole model"


def _kind(r: Row) -> str:
    return site_kind(r["site"] or "-") or "-"


def _depth(r: Row) -> int | None:
    """A row's place over depth: its block, −1 for the embedding, None for a row about the whole
    model (or of another kind with no block)."""
    if r["layer"] is not None:
        return r["layer"]
    return -1 if _kind(r) == "embed" else None


def _lines(
    rows: list[Row], probe: str, metric: str, per_method: bool = True
) -> dict[LineKey, list[Point]]:
    """``{(site kind, layer, method, rank): points over steps}`` of the metric's rows, steps
    ascending; with ``per_method=False`` the methods of one (site kind, layer) are averaged (the
    interval: the means of their ends)."""
    grouped: dict[tuple[LineKey, int], list[Row]] = defaultdict(list)
    for r in rows:
        if r["probe"] == probe and r["metric"] == metric and r["value"] is not None:
            proxy = (r["method"], r["rank"]) if per_method else (None, None)
            grouped[((_kind(r), r["layer"], *proxy), r["step"])].append(r)
    out: dict[LineKey, list[Point]] = defaultdict(list)
    for (key, step), found in sorted(grouped.items(), key=lambda kv: kv[0][1]):  # by step
        out[key].append(point(step, found))
    return dict(out)


def _line_label(key: LineKey, keys: Iterable[LineKey]) -> str:
    """A line's name from the keys that vary among ``keys``: its layer, then its site kind and
    its method (rank) where several are drawn."""
    kind, layer, method, rank = key
    keys = list(keys)
    # no block: the embedding ("embed"), a row about the whole model, or a kind with no block
    blockless = WHOLE_MODEL if kind == "-" else kind
    parts = [blockless if layer is None else layer_name(layer)]
    if len({k[0] for k in keys if k[1] is not None}) > 1 and layer is not None:
        parts.append(kind)
    if len({k[2:] for k in keys}) > 1:
        parts.append(str(method) if rank is None else f"{method} (rank {rank})")
    return " ".join(parts)


def _groups(rows: list[Row], panel: tuple[str, reporting.Figure]) -> list[tuple[str, Any, Any]]:
    """The (block site kind, method, rank) groups of a panel's rows that a depth figure draws
    apart (method and rank None when the figure averages the methods), sorted."""
    probe, figure = panel
    found = {
        (_kind(r), *((r["method"], r["rank"]) if figure.per_method else (None, None)))
        for r in rows
        if r["probe"] == probe and r["metric"] == figure.metric and r["layer"] is not None
    }
    return sorted(found, key=str) or [("-", None, None)]


def _over_depth(
    rows: list[Row], path: Path, panels: list[tuple[str, reporting.Figure]], title: str
) -> bool:
    """A column of panels per declared panel (probe, figure), a row per (block site kind,
    method, rank) that varies: a line per step over depth (the embedding at the left)."""
    present = [
        p for p in panels if any(r["probe"] == p[0] and r["metric"] == p[1].metric for r in rows)
    ]
    if not present:
        return False
    grid = [_groups(rows, p) for p in present]
    n_rows = max(len(g) for g in grid)
    fig, axes = plt.subplots(
        n_rows, len(present), figsize=(5.5 * len(present), 3.8 * n_rows), squeeze=False
    )
    steps = sorted({r["step"] for r in rows})
    cmap = plt.get_cmap("viridis")
    for col, ((probe, figure), groups) in enumerate(zip(present, grid, strict=True)):
        for row_index, (kind, method, rank) in enumerate(groups):
            ax = axes[row_index][col]
            for i, step in enumerate(steps):
                per_layer: dict[int, list[float]] = defaultdict(list)
                for r in rows:
                    if (
                        r["probe"] == probe
                        and r["metric"] == figure.metric
                        and r["step"] == step
                        and _depth(r) is not None
                        and (r["layer"] is None or _kind(r) == kind)
                        and (method is None or (r["method"], r["rank"]) == (method, rank))
                    ):
                        per_layer[_depth(r)].append(r["value"])
                if per_layer:
                    layers = sorted(per_layer)
                    values = [statistics.fmean(per_layer[k]) for k in layers]
                    color = cmap(i / max(len(steps) - 1, 1))
                    ax.plot(layers, values, "o-", color=color, label=f"{step}")
            ticks = sorted({_depth(r) for r in rows if r["probe"] == probe} - {None})
            ax.set_xticks(ticks, ["emb" if t == -1 else f"L{t}" for t in ticks])
            ax.set_xlabel("depth")
            ax.set_ylabel(figure.label)
            named = [kind if len({g[0] for g in groups}) > 1 else None]
            if len({g[1:] for g in groups}) > 1:
                named.append(str(method) if rank is None else f"{method} (rank {rank})")
            if any(named):
                ax.set_title(", ".join(n for n in named if n), fontsize=9)
            ax.grid(alpha=0.3)
        for ax in axes[len(groups) :, col]:
            ax.set_visible(False)
    axes[0][-1].legend(title="step", fontsize=7, ncol=2)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _per_layer_over_steps(
    rows: list[Row], path: Path, panels: list[tuple[str, reporting.Figure]], title: str
) -> bool:
    """A panel per declared panel (probe, figure): a line per (site kind, layer, method, rank)
    over steps (the methods averaged where the figure says so), with the rows' interval as a
    band."""
    present = [
        p for p in panels if any(r["probe"] == p[0] and r["metric"] == p[1].metric for r in rows)
    ]
    if not present:
        return False
    fig, axes = plt.subplots(1, len(present), figsize=(5.5 * len(present), 3.8))
    axes = axes if len(present) > 1 else [axes]
    for ax, (probe, figure) in zip(axes, present, strict=True):
        lines = _lines(rows, probe, figure.metric, figure.per_method)
        order = sorted(lines, key=lambda k: (depth(k[1]), k[0], str(k[2]), k[3] or 0))
        for key in order:
            draw_line(ax, lines[key], label=_line_label(key, lines))
        ax.set_ylabel(figure.label)
        steps_axis(ax)
    axes[-1].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _declared_figures(
    rows: list[Row], run_dir: Path
) -> dict[str, list[tuple[str, reporting.Figure]]]:
    """File → its panels ``(probe, declaration)``, from each present probe's declared figures
    (:mod:`tangentlens.reporting`) that the run's report draws, in the report's probe order."""
    manifest_path = run_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    files: dict[str, list[tuple[str, reporting.Figure]]] = {}
    for probe in reported_probes(rows, [manifest]):
        for figure in probe.figures:
            if figure.in_report:
                files.setdefault(figure.file, []).append((probe.name, figure))
    return files


def write_figures(run_dir: str | Path) -> list[Path]:
    """Write every figure the run's results allow (each present probe's declared figures, over
    every token: ``freq_bin`` "all"); returns their paths."""
    rows = read_results(run_dir).to_pylist()
    folder = Path(run_dir) / "figures"
    folder.mkdir(exist_ok=True)
    written = []
    pooled = [r for r in rows if r["freq_bin"] == "all"]
    for name, panels in _declared_figures(rows, Path(run_dir)).items():
        path = folder / name
        first = panels[0][1]
        if first.render is not None:
            drew = reporting.load_renderer(first.render)(rows, path)
        else:
            draw = _over_depth if first.over == "depth" else _per_layer_over_steps
            drew = draw(pooled, path, panels, first.title)
        if drew:
            written.append(path)
    return written
