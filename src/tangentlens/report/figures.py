"""PNG figures of a run, written to ``RUN_DIR/figures``: each figure a present probe declares
(:mod:`tangentlens.reporting`; a probe that declares none gets ``<probe>.png``, a panel per
metric over steps). The built-in probes':

* ``tangent_energy.png`` — per site at the deepest captured layer, two rows: the energy
  fraction of each proxy with its bootstrap interval (a band) against the controls' band
  (min–max, and mean) over steps; the energy ratio (proxy over its controls' exact mean) with its
  interval against the null's 1, with a dotted line per proxy at its step-0 ratio (random
  weights already read ≠ 1: the baseline training is read against); one column per frequency
  bin (bin 0 the rarest);
* ``anisotropy_depth.png`` — centred and cosine anisotropy against depth, one line per step;
* ``twonn.png`` — TwoNN intrinsic dimension over steps, one line per layer;
* ``qk_drift.png`` — cos(m_Q, m_K) and attention entropy over steps (mean over heads).

A figure never averages rows that differ in a key that varies: a line (or a row of panels) per
site kind, and per proxy method and rank unless the figure declares that it averages the
methods (``Figure.per_method``, e.g. over attention heads, named in its label). Where the rows
carry an interval it is drawn as a band. Steps are drawn on a symmetric-log axis (step 0 and
Pythia's log-spaced early steps both show).
:func:`energy_by_bin` draws the tangent energy of one step per frequency bin from result rows
(e.g. a notebook's single-checkpoint table).
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from tangentlens import reporting
from tangentlens.models.sites import site_kind
from tangentlens.report.baseline import INIT_STEP, step_label
from tangentlens.report.declared import reported_probes
from tangentlens.sweep.store import read_results

__all__ = ["energy_by_bin", "tangent_energy_figure", "write_figures"]

Row = dict[str, Any]

_ENERGY_PROBE = "tangent_energy"
_ENERGY_LABEL = "gradient energy fraction"


#: A line's key: the row's site kind, block, proxy method and rank (method and rank None where
#: a figure averages the methods).
LineKey = tuple[str, Any, Any, Any]


@dataclass(frozen=True)
class _Point:
    """One step of a line: the value and its interval (NaN where the rows carry none)."""

    step: int
    value: float
    low: float
    high: float


def _kind(r: Row) -> str:
    return site_kind(r["site"] or "-") or "-"


def _lines(
    rows: list[Row], probe: str, metric: str, per_method: bool = True
) -> dict[LineKey, list[_Point]]:
    """``{(site kind, layer, method, rank): points over steps}`` of the metric's rows, steps
    ascending; with ``per_method=False`` the methods of one (site kind, layer) are averaged (the
    interval: the means of their ends)."""
    grouped: dict[tuple[LineKey, int], list[Row]] = defaultdict(list)
    for r in rows:
        if r["probe"] == probe and r["metric"] == metric and r["value"] is not None:
            proxy = (r["method"], r["rank"]) if per_method else (None, None)
            grouped[((_kind(r), r["layer"], *proxy), r["step"])].append(r)
    out: dict[LineKey, list[_Point]] = defaultdict(list)
    for (key, step), found in sorted(grouped.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        out[key].append(_point(step, found))
    return dict(out)


def _point(step: int, rows: list[Row]) -> _Point:
    value = statistics.fmean(r["value"] for r in rows)
    if any(r.get("ci_low") is None or r.get("ci_high") is None for r in rows):
        return _Point(step, value, math.nan, math.nan)
    low = statistics.fmean(r["ci_low"] for r in rows)
    return _Point(step, value, low, statistics.fmean(r["ci_high"] for r in rows))


def _line_label(key: LineKey, keys: Iterable[LineKey]) -> str:
    """A line's name from the keys that vary among ``keys``: its layer, then its site kind and
    its method (rank) where several are drawn."""
    kind, layer, method, rank = key
    keys = list(keys)
    parts = [_layer_name(layer) if kind in ("embed", "-") or layer is not None else kind]
    if len({k[0] for k in keys if k[1] is not None}) > 1 and layer is not None:
        parts.append(kind)
    if len({k[2:] for k in keys}) > 1:
        parts.append(str(method) if rank is None else f"{method} (rank {rank})")
    return " ".join(parts)


def _draw_line(ax: Axes, points: list[_Point], fmt: str = "o-", **style: Any) -> None:
    """The points over steps, with their interval as a band where they carry one."""
    steps = [p.step for p in points]
    line = ax.plot(steps, [p.value for p in points], fmt, **style)[0]
    if any(not math.isnan(p.low) for p in points):
        ax.fill_between(
            steps,
            [p.low for p in points],
            [p.high for p in points],
            color=line.get_color(),
            alpha=0.2,
            linewidth=0,
        )


def _steps_axis(ax: Any) -> None:
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlim(left=0)
    ax.set_xlabel("training step")
    ax.grid(alpha=0.3)


def _layer_name(layer: Any) -> str:
    return "embed" if layer is None else f"layer {layer}"


def _depth(layer: int | None) -> int:
    """Sort key of a layer: the embedding (``None``) is the shallowest."""
    return -1 if layer is None else layer


def _energy_rows(rows: Iterable[Row]) -> list[Row]:
    return [r for r in rows if r["probe"] == _ENERGY_PROBE]


def _deepest_layer(energy: list[Row]) -> int | None:
    return max((r["layer"] for r in energy), key=_depth)


def _bin_order(freq_bin: str) -> tuple[bool, int, str]:
    """Sort key of a ``freq_bin``: bins "0", "1", … "10" in numeric order, then "all"."""
    return (freq_bin == "all", int(freq_bin) if freq_bin.isdigit() else -1, freq_bin)


def _method_colors(energy: list[Row]) -> dict[str, str]:
    """One colour per proxy method (sorted by name), the same in every energy figure."""
    return {method: f"C{i}" for i, method in enumerate(sorted({r["method"] for r in energy}))}


def _by_step(rows: list[Row], metric: str) -> dict[int, _Point]:
    """``{step: point}`` of one site's and one method's ``metric`` rows."""
    return {r["step"]: _point(r["step"], [r]) for r in rows if r["metric"] == metric}


def _energy_over_steps(ax: Axes, rows: list[Row], method: str, color: str) -> None:
    """One proxy method at one site: its energy fraction over steps with its bootstrap
    interval (a band), its own controls' band (min–max) and mean (ranks differ:
    mean_direction is rank 1)."""
    value = _by_step(rows, "energy_fraction")
    low, mean, high = (_by_step(rows, f"energy_control_{m}") for m in ("min", "mean", "max"))
    steps = sorted(value)
    _draw_line(ax, [value[s] for s in steps], color=color, label=f"{method} proxy")
    ax.fill_between(
        steps,
        [low[s].value for s in steps],
        [high[s].value for s in steps],
        color=color,
        alpha=0.08,
        hatch="//",
        label=f"{method} controls (min–max)",
    )
    ax.plot(steps, [mean[s].value for s in steps], "--", color=color, linewidth=0.8)


def _ratio_over_steps(ax: Axes, rows: list[Row], method: str, color: str) -> None:
    """One proxy method at one site: its energy ratio over steps with its interval, and a
    dotted line at its step-0 ratio."""
    ratio = _by_step(rows, "energy_ratio")
    steps = sorted(ratio)
    _draw_line(ax, [ratio[s] for s in steps], color=color, label=f"{method} proxy")
    if INIT_STEP in ratio and len(steps) > 1:
        ax.axhline(
            ratio[INIT_STEP].value,
            color=color,
            linestyle=":",
            linewidth=1.2,
            label=f"{method} at step {step_label(INIT_STEP)}",
        )


def _bin_title(freq_bin: str, bins: list[str]) -> str:
    if freq_bin == "all":
        return "all tokens"
    numbered = [b for b in bins if b.isdigit()]
    end = " (rarest)" if freq_bin == "0" else ""
    if numbered and freq_bin == max(numbered, key=int) and freq_bin != "0":
        end = " (most frequent)"
    return f"frequency bin {freq_bin}{end}"


def tangent_energy_figure(rows: list[Row], path: Path) -> bool:
    """The tangent_energy probe's figure (the module's docstring); False without its rows."""
    energy = _energy_rows(rows)
    if not energy:
        return False
    deepest = _deepest_layer(energy)
    energy = [r for r in energy if r["layer"] == deepest]
    sites = sorted({r["site"] for r in energy})
    bins = sorted({r["freq_bin"] for r in energy}, key=_bin_order)
    colors = _method_colors(energy)
    fig, axes = plt.subplots(
        2 * len(sites),
        len(bins),
        figsize=(3.2 * len(bins), 3.2 * 2 * len(sites)),
        sharey="row",
        squeeze=False,
    )
    for i, site in enumerate(sites):
        top, bottom = axes[2 * i], axes[2 * i + 1]
        for j, b in enumerate(bins):
            for method, color in colors.items():
                picked = [
                    r
                    for r in energy
                    if r["site"] == site and r["freq_bin"] == b and r["method"] == method
                ]
                if picked:
                    _energy_over_steps(top[j], picked, method, color)
                    _ratio_over_steps(bottom[j], picked, method, color)
            bottom[j].axhline(1.0, color="0.3", linewidth=0.8, label="null (ratio 1)")
            top[j].set_title(f"{_bin_title(b, bins)} — {site}", fontsize=8)
            for ax in (top[j], bottom[j]):
                ax.set_yscale("log")
                _steps_axis(ax)
        top[0].set_ylabel(_ENERGY_LABEL)
        bottom[0].set_ylabel("energy ratio (proxy / controls' exact mean)")
    axes[0][0].legend(fontsize=7)
    axes[1][0].legend(fontsize=7)
    fig.suptitle(f"Tangent energy vs matched-rank controls ({_layer_name(deepest)})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _as_rows(rows: Any) -> list[Row]:
    """Row dicts from an iterable of dicts, a pyarrow Table, or a table with ``.to_arrow()``."""
    if hasattr(rows, "to_pylist"):
        return rows.to_pylist()
    if hasattr(rows, "to_arrow"):
        return rows.to_arrow().to_pylist()
    return list(rows)


def _only(values: set[Any], given: Any, what: str) -> Any:
    """``given`` if it is among ``values``, else the only value; a ValueError otherwise."""
    shown = sorted(values, key=str)
    if given is not None:
        if given not in values:
            raise ValueError(f"no tangent_energy rows at {what} {given!r}; present: {shown}")
        return given
    if len(values) > 1:
        raise ValueError(f"the rows hold several {what}s {shown}; pass {what}= to pick one")
    return next(iter(values))


def _cells(energy: list[Row]) -> dict[tuple[str, str], dict[str, Row]]:
    """``{(method, freq_bin): {metric: row}}``; a ValueError on a repeated measurement."""
    cells: dict[tuple[str, str], dict[str, Row]] = defaultdict(dict)
    for r in energy:
        cell = cells[(r["method"], r["freq_bin"])]
        if r["metric"] in cell:
            raise ValueError(
                f"several {r['metric']} rows for method {r['method']!r}, bin {r['freq_bin']!r} "
                "(rows of several suites or runs?); pass the rows of one run"
            )
        cell[r["metric"]] = r
    return cells


def _value(cell: dict[str, Row], metric: str, field: str = "value") -> float:
    r = cell.get(metric)
    return math.nan if r is None or r.get(field) is None else float(r[field])


def _spread(centre: list[float], low: list[float], high: list[float]) -> list[list[float]] | None:
    """Error-bar lengths below and above ``centre`` (NaN where unknown); None if none is known."""
    below = [max(c - lo, 0.0) for c, lo in zip(centre, low, strict=True)]
    above = [max(hi - c, 0.0) for c, hi in zip(centre, high, strict=True)]
    if all(math.isnan(v) for v in below + above):
        return None
    return [below, above]


def energy_by_bin(
    rows: Any,
    *,
    site: str | None = None,
    step: int | None = None,
    ax: Axes | None = None,
    path: str | Path | None = None,
) -> Figure:
    """Tangent energy of one step per frequency bin: a bar per proxy method and bin.

    ``rows``: tidy result rows (dicts), a pyarrow Table, or an object with ``.to_arrow()``.
    Each bar is the ``energy_fraction`` with its bootstrap interval (``ci_low``/``ci_high``) as
    an error bar; the method's matched-rank controls are a diamond at ``energy_control_mean``
    with a ``energy_control_min``–``energy_control_max`` range. Bins run "0" (rarest), "1", …,
    then "all". ``site`` defaults to the deepest layer's (the first by name on a tie; the
    embedding is the shallowest), ``step`` to the only step present. Draws into ``ax`` if
    given, else a new figure; saves a PNG to ``path`` if given. Returns the figure.
    """
    energy = _energy_rows(_as_rows(rows))
    if not energy:
        raise ValueError(
            "no tangent_energy rows: the figure needs results of the tangent_energy probe"
        )
    step = _only({r["step"] for r in energy}, step, "step")
    energy = [r for r in energy if r["step"] == step]
    if site is None:
        deepest = _deepest_layer(energy)
        site = min(r["site"] for r in energy if r["layer"] == deepest)
    site = _only({r["site"] for r in energy}, site, "site")
    energy = [r for r in energy if r["site"] == site]
    cells = _cells(energy)
    bins = sorted({b for _, b in cells}, key=_bin_order)
    colors = _method_colors(energy)
    if ax is None:
        fig = Figure(figsize=(max(4.0, 1.5 + 0.2 * len(bins) * (len(colors) + 1)), 3.6))
        ax = fig.add_subplot()
    fig = ax.figure if isinstance(ax.figure, Figure) else ax.figure.figure  # a subfigure's root
    width = 0.8 / len(colors)
    plotted: list[float] = []
    for i, (method, color) in enumerate(colors.items()):
        offset = (i - (len(colors) - 1) / 2) * width
        xs = [j + offset for j in range(len(bins))]
        got = [cells.get((method, b), {}) for b in bins]
        fraction = [_value(c, "energy_fraction") for c in got]
        ranks = {r["rank"] for c in got for r in c.values() if r.get("rank") is not None}
        label = f"{method} (rank {ranks.pop()})" if len(ranks) == 1 else method
        ax.bar(
            xs,
            fraction,
            width * 0.9,
            color=color,
            label=label,
            yerr=_spread(
                fraction,
                [_value(c, "energy_fraction", "ci_low") for c in got],
                [_value(c, "energy_fraction", "ci_high") for c in got],
            ),
            error_kw={"ecolor": "black", "elinewidth": 1.0, "capsize": 2},
        )
        mean = [_value(c, "energy_control_mean") for c in got]
        low = [_value(c, "energy_control_min") for c in got]
        high = [_value(c, "energy_control_max") for c in got]
        ax.errorbar(
            [x + width * 0.25 for x in xs],
            mean,
            yerr=_spread(mean, low, high),
            fmt="D",
            color="0.25",
            markerfacecolor="white",
            markersize=4,
            elinewidth=1.0,
            label="controls: mean, min–max" if i == len(colors) - 1 else "_nolegend_",
            zorder=3,
        )
        plotted += fraction + mean + low + high
    known = [v for v in plotted if not math.isnan(v)]
    ax.set_yscale("log" if known and min(known) > 0 else "linear")
    ax.set_xticks(range(len(bins)), bins)
    if len(bins) > 1 and bins[-1] == "all":
        ax.axvline(len(bins) - 1.5, color="0.6", linestyle=":", linewidth=0.8)
    ax.set_xlabel("token-frequency bin (0 = rarest)")
    ax.set_ylabel(_ENERGY_LABEL)
    layer = next(r["layer"] for r in energy)
    ax.set_title(f"Tangent energy: {site} ({_layer_name(layer)}), step {step}")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if path is not None:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    return fig


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
                        and (r["layer"] is None or _kind(r) == kind)
                        and (method is None or (r["method"], r["rank"]) == (method, rank))
                    ):
                        per_layer[-1 if r["layer"] is None else r["layer"]].append(r["value"])
                if per_layer:
                    layers = sorted(per_layer)
                    values = [statistics.fmean(per_layer[k]) for k in layers]
                    color = cmap(i / max(len(steps) - 1, 1))
                    ax.plot(layers, values, "o-", color=color, label=f"{step}")
            ticks = sorted(
                {-1 if r["layer"] is None else r["layer"] for r in rows if r["probe"] == probe}
            )
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
        order = sorted(lines, key=lambda k: (_depth(k[1]), k[0], str(k[2]), k[3] or 0))
        for key in order:
            _draw_line(ax, lines[key], label=_line_label(key, lines))
        ax.set_ylabel(figure.label)
        _steps_axis(ax)
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
