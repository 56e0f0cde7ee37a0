"""Matplotlib pieces: a line over steps with its interval as a band (:func:`draw_line`,
:func:`with_band`), the symmetric-log steps axis (step 0 and Pythia's log-spaced early steps
both show) and the names and order of layers (the embedding, ``None``, the shallowest)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from matplotlib.axes import Axes

from tangentlens.drawing.tables import Row

__all__ = ["Point", "depth", "draw_line", "layer_name", "point", "steps_axis", "with_band"]


@dataclass(frozen=True)
class Point:
    """One step of a line: the value and its interval (NaN where the rows carry none)."""

    step: int
    value: float
    low: float
    high: float


def point(step: int, rows: list[Row]) -> Point:
    """The rows' mean value at ``step``, with the means of their interval's ends (NaN when a row
    carries none)."""
    value = statistics.fmean(r["value"] for r in rows)
    if any(r.get("ci_low") is None or r.get("ci_high") is None for r in rows):
        return Point(step, value, math.nan, math.nan)
    low = statistics.fmean(r["ci_low"] for r in rows)
    return Point(step, value, low, statistics.fmean(r["ci_high"] for r in rows))


def draw_line(ax: Axes, points: list[Point], fmt: str = "o-", **style: Any) -> None:
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


def with_band(
    ax: Axes, points: list[tuple[float, float, float | None, float | None]], **style: Any
) -> None:
    """A line through ``(x, value)`` with the interval ``[low, high]`` as a band where every
    point carries one."""
    xs = [p[0] for p in points]
    ax.plot(xs, [p[1] for p in points], "o-", markersize=4, **style)
    if all(p[2] is not None and p[3] is not None for p in points):
        ax.fill_between(
            xs, [p[2] for p in points], [p[3] for p in points], color=style.get("color"),
            alpha=0.2, linewidth=0,
        )  # fmt: skip


def steps_axis(ax: Axes) -> None:
    """Training steps on a symmetric-log x axis from 0, with a grid."""
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlim(left=0)
    ax.set_xlabel("training step")
    ax.grid(alpha=0.3)


def layer_name(layer: Any) -> str:
    """``"embed"`` for the embedding (``None``), ``"layer <l>"`` for a block."""
    return "embed" if layer is None else f"layer {layer}"


def depth(layer: int | None) -> int:
    """Sort key of a layer: the embedding (``None``) is the shallowest."""
    return -1 if layer is None else layer
