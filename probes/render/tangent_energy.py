"""The ``tangent_energy`` probe's tables and figures, named by import path in its ``Reporting``
(:mod:`tangentlens.probes.tangent_energy`); the report and ``compare`` load them when they draw.

* :func:`energy_tables` — steps × frequency bins (bin 0 the rarest) of ``energy_ratio`` with its
  p-value and its bootstrap interval at the deepest layer, per site there and per proxy method;
* :func:`tangent_energy_figure` — ``tangent_energy.png``: per site at the deepest captured layer,
  two rows: the energy fraction of each proxy with its bootstrap interval (a band) against the
  controls' band (min–max, and mean) over steps; the energy ratio (proxy over its controls'
  exact mean) with its interval against the null's 1, with a dotted line per proxy at its
  step-0 ratio (random weights already read ≠ 1: the baseline training is read against); one
  column per frequency bin (bin 0 the rarest);
* :func:`energy_ratio_figure` — ``energy_ratio.png`` of ``compare``: the energy ratio over
  training, one panel per proxy method, at the deepest relative depth every run captured
  (frequency bin "all"); tokens seen on a symmetric-log axis, so step 0 (the initialisation
  baseline) sits at the left edge;
* :func:`energy_by_bin` — the tangent energy of one step per frequency bin from result rows
  (e.g. a notebook's single-checkpoint table).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from rich.markup import escape
from rich.table import Table

from tangentlens.drawing.compared import Compared, drawn
from tangentlens.drawing.plots import (
    Point,
    depth,
    draw_line,
    layer_name,
    point,
    steps_axis,
    with_band,
)
from tangentlens.drawing.tables import INIT_STEP, Row, fmt_value, interval, pivot, step_label

__all__ = [
    "bin_label",
    "energy_by_bin",
    "energy_ratio_figure",
    "energy_tables",
    "tangent_energy_figure",
]

#: The probe whose rows these draw.
NAME = "tangent_energy"
_ENERGY_LABEL = "gradient energy fraction"

#: The rarest bin (bins are equal-mass quantiles of log frequency, ascending).
RAREST_BIN = "0"


def bin_label(freq_bin: str, bins: list[str]) -> str:
    """A frequency-bin column: which end is rare (``"0 (rarest)"``, the last bin ``"… (most
    frequent)"``), ``"all"`` as it is."""
    numbered = [b for b in bins if b.isdigit()]
    if freq_bin == RAREST_BIN:
        return f"{freq_bin} (rarest)"
    if numbered and freq_bin == max(numbered, key=int):
        return f"{freq_bin} (most frequent)"
    return freq_bin


def _bin_order(freq_bin: str) -> tuple[bool, int, str]:
    """Sort key of a ``freq_bin``: bins "0", "1", … "10" in numeric order, then "all"."""
    return (freq_bin == "all", int(freq_bin) if freq_bin.isdigit() else -1, freq_bin)


# ------------------------------------------------------------------------------------ tables


def _ratio_and_p(cell_rows: list[Row]) -> str:
    """One cell of an energy table: ``energy_ratio``, its p-value and, below, the ratio's
    bootstrap interval (one site, method, bin and step)."""
    by_metric = {r["metric"]: r for r in cell_rows}
    if "energy_ratio" not in by_metric:
        return "–"
    ratio = by_metric["energy_ratio"]
    p = by_metric.get("energy_p_value")
    text = f"{fmt_value(ratio['value'])} p{fmt_value(None if p is None else p['value'])}"
    ci = interval([ratio])
    if ci is not None:
        text += f"\n[{fmt_value(ci[0])}, {fmt_value(ci[1])}]"
    return escape(text)


def energy_tables(energy: list[Row]) -> list[Table | None]:
    """Steps × frequency bins (bin 0 the rarest) of ``energy_ratio`` with its p-value and its
    bootstrap interval at the deepest layer, one table per site there (``resid_post`` and
    ``mlp_out`` of one block are two tables, each titled by its site) and per proxy method."""
    deepest = max((r["layer"] for r in energy if r["layer"] is not None), default=None)
    picked = [
        r
        for r in energy
        if r["layer"] == deepest and r["metric"] in ("energy_ratio", "energy_p_value")
    ]
    bins = sorted({r["freq_bin"] for r in picked}, key=_bin_order)
    tables: list[Table | None] = []
    for site in sorted({r["site"] for r in picked}):
        for method in sorted({r["method"] for r in picked if r["site"] == site}):
            cell = [r for r in picked if r["site"] == site and r["method"] == method]
            title = (
                f"energy ratio [95 % CI], p-value vs the exchangeable controls — {method}, {site}"
            )
            tables.append(
                pivot(
                    cell,
                    title,
                    lambda r: r["freq_bin"],
                    _ratio_and_p,
                    lambda b: bin_label(b, bins),
                    _bin_order,
                )
            )
    return tables


# ---------------------------------------------------------------------------- run's figure


def _energy_rows(rows: Iterable[Row]) -> list[Row]:
    return [r for r in rows if r["probe"] == NAME]


def _deepest_layer(energy: list[Row]) -> int | None:
    return max((r["layer"] for r in energy), key=depth)


def _method_colors(energy: list[Row]) -> dict[str, str]:
    """One colour per proxy method (sorted by name), the same in every energy figure."""
    return {method: f"C{i}" for i, method in enumerate(sorted({r["method"] for r in energy}))}


def _by_step(rows: list[Row], metric: str) -> dict[int, Point]:
    """``{step: point}`` of one site's and one method's ``metric`` rows."""
    return {r["step"]: point(r["step"], [r]) for r in rows if r["metric"] == metric}


def _energy_over_steps(ax: Axes, rows: list[Row], method: str, color: str) -> None:
    """One proxy method at one site: its energy fraction over steps with its bootstrap
    interval (a band), its own controls' band (min–max) and mean (ranks differ:
    mean_direction is rank 1)."""
    value = _by_step(rows, "energy_fraction")
    low, mean, high = (_by_step(rows, f"energy_control_{m}") for m in ("min", "mean", "max"))
    steps = sorted(value)
    draw_line(ax, [value[s] for s in steps], color=color, label=f"{method} proxy")
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
    draw_line(ax, [ratio[s] for s in steps], color=color, label=f"{method} proxy")
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
    """``tangent_energy.png`` (the module's docstring); False without the probe's rows."""
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
                steps_axis(ax)
        top[0].set_ylabel(_ENERGY_LABEL)
        bottom[0].set_ylabel("energy ratio (proxy / controls' exact mean)")
    axes[0][0].legend(fontsize=7)
    axes[1][0].legend(fontsize=7)
    fig.suptitle(f"Tangent energy vs matched-rank controls ({layer_name(deepest)})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# ------------------------------------------------------------------------ compare's figure


def _tokens_axis(ax: Axes, positive: list[int]) -> None:
    """Symmetric-log x: linear up to the decade of the first positive value (0, the
    initialisation, at the left edge, one decade wide), ticks at 0 and every decade above."""
    low = math.floor(math.log10(min(positive, default=1)))
    high = math.ceil(math.log10(max(positive, default=10)))
    ax.set_xscale("symlog", linthresh=10**low)
    ax.set_xlim(0, 10**high)
    ax.set_xticks(
        [0, *(10**k for k in range(low, high + 1))],
        ["0", *(f"$10^{{{k}}}$" for k in range(low, high + 1))],
    )


def energy_ratio_figure(comparison: Compared, path: Path) -> bool:
    """The energy ratio over training, one panel per method every run has, at the deepest
    (site kind, relative depth) every run has."""
    picked = [drawn(comparison, run, NAME, "energy_ratio") for run in comparison.runs]
    places = set.intersection(
        *({run.place(r) for r in rows} for run, rows in zip(comparison.runs, picked, strict=True))
    )
    places = {p for p in places if p[1] is not None}
    methods = sorted(set.intersection(*({r["method"] for r in rows} for rows in picked)))
    if not places or not methods:
        return False
    kind, at = max(places, key=lambda p: (p[1], p[0] == "resid_post"))
    tokens = all(r["tokens_seen"] is not None for rows in picked for r in rows)
    x_of: Callable[[Row], int] = (lambda r: r["tokens_seen"]) if tokens else (lambda r: r["step"])
    fig, axes = plt.subplots(1, len(methods), figsize=(4.2 * len(methods), 3.8), squeeze=False)
    positive = [x_of(r) for rows in picked for r in rows if x_of(r) > 0]
    for ax, method in zip(axes[0], methods, strict=True):
        for i, (run, rows) in enumerate(zip(comparison.runs, picked, strict=True)):
            points = sorted(
                (x_of(r), r["value"], r["ci_low"], r["ci_high"])
                for r in rows
                if r["method"] == method and run.place(r) == (kind, at)
            )
            if points:
                with_band(ax, points, color=f"C{i}", label=run.label)
        ax.axhline(1.0, color="0.3", linewidth=0.8, label="null (ratio 1)")
        ax.set_yscale("log")
        _tokens_axis(ax, positive)
        ax.set_xlabel("tokens seen (0 = initialisation)" if tokens else "training step")
        ax.set_title(f"{method} proxy")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("energy ratio (proxy / controls' exact mean)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"Tangent energy ratio over training ({kind}, relative depth {float(at):.2f})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# ------------------------------------------------------------------------- one step per bin


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
    ax.set_title(f"Tangent energy: {site} ({layer_name(layer)}), step {step}")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if path is not None:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    return fig
