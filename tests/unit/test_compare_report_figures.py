"""The figures ``compare`` draws (:func:`tangentlens.report.compare_report.write_comparison`),
read back from the figures: which file each declared figure goes to (over training, over depth,
a probe's own renderer, none when nothing is drawable), their titles, size and resolution, and
per panel the lines' data, labels, colours, transparency and styles, the axes' scale and
labels, the grid and the legend. A researcher's probe declares the figures; its rows are
hand-built."""

from __future__ import annotations

import dataclasses
import struct
import sys
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pyarrow.parquet as pq
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure as MplFigure
from pytest import approx

from tangentlens.comparison import compare
from tangentlens.report import compare_report
from tangentlens.results import row
from tests.unit.test_comparison import _write_run
from tests.unit.test_registry import _module

# a panel with nothing drawn gets an empty legend (matplotlib warns of it)
pytestmark = pytest.mark.filterwarnings("ignore:No artists with labels found:UserWarning")

MODULE = "compare_figures_probe"
SOURCE = f"""
    from dataclasses import dataclass

    from tangentlens.registry import Probe
    from tangentlens.reporting import Figure, Reporting

    CALLS = []


    def draw(comparison, path):
        CALLS.append((comparison, path))
        path.write_bytes(b"drawn by the probe")
        return True


    @dataclass(frozen=True)
    class Config:
        pass


    FIGURES = (
        Figure("train.png", "m", "m per method", "m over training", in_compare=True,
               compare_title="m compared"),
        Figure("train.png", "m2", "m2 averaged", "not the title", in_compare=True,
               per_method=False),
        Figure("depth.png", "d", "d label", "d over depth", over="depth", in_compare=True),
        Figure("depth.png", "e", "e label", "not the title", over="depth", in_compare=True,
               compare_title="not the title either"),
        Figure("own.png", "m", "m", "own", in_report=False, in_compare=True,
               render="{MODULE}:draw"),
        Figure("report_only.png", "m", "m", "in the run's report only"),
        Figure("empty.png", "nothing", "nothing", "nothing to draw", in_compare=True),
    )
    PROBE = Probe(name="fig_probe", config=Config, scope="step",
                  metrics={{name: name for name in ("m", "m2", "d", "e", "nothing")}},
                  rows=lambda inputs, config: [], reporting=Reporting(figures=FIGURES))
"""
KEY = f"{MODULE}:PROBE"


def _rows(step: int, scale: float, tokens: bool) -> list[dict[str, Any]]:
    """``fig_probe``'s rows at ``step`` (2 blocks; tokens seen 10 per step, or unknown):
    ``m`` per method (pca at ranks 4 and 16 at block 1, ica without a rank at block 0, with
    intervals), ``m2`` for two methods at block 1 and about the whole model, ``d`` at the
    embedding and each block's residual stream and attention output, ``e`` at the attention
    output only."""
    seen = 10 * step if tokens else None
    x = scale * (1 + step / 1000)

    def at(metric: str, value: float, layer: int | None, kind: str = "resid_post", **more):
        site = "hook_embed" if kind == "embed" else f"blocks.{layer}.hook_{kind}"
        where = {"site": "-"} if kind == "-" else {"site": site, "layer": layer}
        return row("s", step, seen, "fig_probe", metric, value, **where, **more)

    ci = {"ci": (x - 0.5, x + 0.5)}
    return [
        at("m", x, 1, method="pca", rank=4, **ci),
        at("m", 2 * x, 1, method="pca", rank=16, **ci),
        at("m", 3 * x, 0, method="ica", **ci),
        at("m2", x, 1, method="pca", rank=4),
        at("m2", 3 * x, 1, method="ica"),
        at("m2", 5 * x, None, "-"),
        at("d", x, None, "embed"),
        at("d", 2 * x, 0),
        at("d", 3 * x, 1),
        at("d", 9.0, 1, "attn_out"),
        at("e", 9.0, 1, "attn_out"),
    ]


def _run(root: Path, steps: list[int], scale: float, tokens: bool = True) -> Path:
    rows = [r for step in steps for r in _rows(step, scale, tokens)]
    recipe = {"probes": {KEY: {}}}
    probes = {KEY: {"name": "fig_probe", "module": MODULE}}
    return _write_run(root, rows, recipe, n_layers=2, steps=steps, probes=probes)


def _recording(monkeypatch: pytest.MonkeyPatch) -> list[MplFigure]:
    """The figures ``compare_report`` closes from now on, in order (closed all the same)."""
    closed: list[MplFigure] = []
    close = plt.close

    def record(fig: Any = None) -> None:
        closed.append(fig)
        close(fig)

    monkeypatch.setattr(compare_report.plt, "close", record)
    return closed


@pytest.fixture(scope="module")
def drawn(tmp_path_factory) -> Any:
    """``compare`` of run a (steps 0, 100, 1000) and b (100, 1000; values twice a's) written
    once: ``(comparison, folder, paths written, figures closed in order)``; then of a and c
    (steps 0 and 1000, c's rows without tokens seen) at step 0 the same way."""
    tmp = tmp_path_factory.mktemp("compare_figures")
    with pytest.MonkeyPatch.context() as monkeypatch:
        _module(tmp, monkeypatch, MODULE, SOURCE)
        closed = _recording(monkeypatch)
        a = _run(tmp / "a", [0, 100, 1000], 1.0)
        b = _run(tmp / "b", [100, 1000], 2.0)
        comparison = compare([a, b])
        written = compare_report.write_comparison(comparison, tmp / "deep" / "out")
        first = (comparison, tmp / "deep" / "out", written, list(closed))
        closed.clear()
        c = _run(tmp / "c", [0, 1000], 2.0, tokens=False)
        (tmp / "at0").mkdir()  # a folder that exists is written into
        compare_report.write_comparison(compare([a, c], step=0), tmp / "at0")
        yield {"ab": first, "ac": list(closed), "module": sys.modules[MODULE]}


@pytest.fixture
def figures(drawn, monkeypatch) -> list[MplFigure]:
    """The figures ``compare_report`` closes in a test, in order."""
    return _recording(monkeypatch)


def _titled(figures: list[MplFigure], title: str) -> MplFigure:
    (fig,) = [f for f in figures if f.get_suptitle() == title]
    return fig


def _png_size(path: Path) -> tuple[int, int]:
    """A PNG's width and height in pixels (from its IHDR chunk)."""
    return struct.unpack(">II", path.read_bytes()[16:24])


def _lines(ax: Any) -> dict[str, dict[str, Any]]:
    """Each line of ``ax`` by label: its data, colour, alpha and (marker, style, size)."""
    return {
        line.get_label(): {
            "x": [float(v) for v in line.get_xdata()],
            "y": [float(v) for v in line.get_ydata()],
            "color": line.get_color(),
            "alpha": line.get_alpha(),
            "style": (line.get_marker(), line.get_linestyle(), line.get_markersize()),
        }
        for line in ax.get_lines()
    }


def test_each_declared_figure_goes_to_its_file_and_the_table_to_compare_parquet(drawn):
    """The table first, then one file per declared file name in declaration order: over
    training, over depth, the probe's own renderer (given the comparison and the path); none
    for a figure with nothing to draw or one declared for the run's report only. The folder
    is created with its parents."""
    comparison, out, written, figures = drawn["ab"]
    names = ["compare.parquet", "train.png", "depth.png", "own.png"]
    assert written == [out / name for name in names]
    assert pq.read_table(out / "compare.parquet").equals(comparison.table)
    assert (out / "own.png").read_bytes() == b"drawn by the probe"
    assert drawn["module"].CALLS[0] == (comparison, out / "own.png")
    assert not (out / "empty.png").exists() and not (out / "report_only.png").exists()
    assert [f.get_suptitle() for f in figures] == [
        "m compared",  # the first panel's compare_title
        "d over depth",  # the first panel's title: it has no compare_title
        "",  # nothing to draw: closed unsaved
    ]
    for name in ("train.png", "depth.png"):
        assert _png_size(out / name) == (1320, 456)  # two panels of 5.5 × 3.8 in at 120 dpi
    for fig in figures[:2]:
        assert tuple(fig.get_size_inches()) == approx((11.0, 3.8))
        assert len(fig.axes) == 2


def test_over_training_a_line_per_run_and_shared_place_over_tokens_seen(drawn):
    """Panel ``m`` (per method): a line per run and (site kind, depth, method, rank) both runs
    have, over tokens seen, the run's colour, fainter for each later place (ordered as text:
    rank 16 before rank 4), with its interval as a band; panel ``m2`` (methods averaged): the
    methods' mean, a line per place, the whole model's named "model". Symmetric-log x axis
    from 1, axis labels, grid and a small legend."""
    left, right = _titled(drawn["ab"][3], "m compared").axes
    xa, xb = [0.0, 1000.0, 10000.0], [1000.0, 10000.0]
    ya, yb = [1.0, 1.1, 2.0], [2.2, 4.0]
    solid = ("o", "-", 4.0)

    def line(x: list[float], y: list[float], color: str, j: int) -> dict[str, Any]:
        """The j-th place of 3: alpha 1 − 0.5 j / 3."""
        return {"x": x, "y": approx(y), "color": color, "alpha": approx(1 - 0.5 * j / 3),
                "style": solid}  # fmt: skip

    assert _lines(left) == {
        "a resid_post 1.00 pca (rank 16)": line(xa, [2 * v for v in ya], "C0", 0),
        "a resid_post 1.00 pca (rank 4)": line(xa, ya, "C0", 1),
        "a resid_post 0.50 ica": line(xa, [3 * v for v in ya], "C0", 2),
        "b resid_post 1.00 pca (rank 16)": line(xb, [2 * v for v in yb], "C1", 0),
        "b resid_post 1.00 pca (rank 4)": line(xb, yb, "C1", 1),
        "b resid_post 0.50 ica": line(xb, [3 * v for v in yb], "C1", 2),
    }
    bands = [c for c in left.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 6  # every m row carries an interval
    band = bands[0].get_paths()[0].vertices  # a's rank 16 line, from x - 0.5 to x + 0.5
    ends = sorted(float(y) for x, y in band if x == 1000.0)  # a's at 1000 tokens: x = 1.1
    assert ends == approx([0.6, 1.6])
    assert {label: line["y"] for label, line in _lines(right).items()} == {
        "a model": approx([5 * v for v in ya]),
        "a resid_post 1.00": approx([2 * v for v in ya]),  # (x + 3x) / 2
        "b model": approx([5 * v for v in yb]),
        "b resid_post 1.00": approx([2 * v for v in yb]),
    }
    assert not [c for c in right.collections if isinstance(c, PolyCollection)]
    for ax, label in ((left, "m per method"), (right, "m2 averaged")):
        assert ax.get_xscale() == "symlog"
        assert ax.xaxis.get_transform().linthresh == 1
        assert ax.get_xlabel() == "tokens seen (0 = initialisation)"
        assert ax.get_ylabel() == label
        assert ax.xaxis.get_gridlines()[0].get_alpha() == 0.3
        assert ax.get_legend().get_texts()[0].get_fontsize() == 6


def test_over_training_over_steps_where_a_row_does_not_know_its_tokens(drawn):
    """c's rows do not know their tokens seen: every line over training steps instead."""
    left, _ = _titled(drawn["ac"], "m compared").axes
    assert left.get_xlabel() == "training step"
    assert {k: v["x"] for k, v in _lines(left).items() if "rank 4" in k} == {
        "a resid_post 1.00 pca (rank 4)": [0.0, 100.0, 1000.0],
        "c resid_post 1.00 pca (rank 4)": [0.0, 1000.0],
    }


def test_over_training_draws_nothing_without_a_shared_place(drawn, figures, tmp_path):
    """No place every run has: nothing drawn, no file, the figure closed."""
    figure = compare_report.Figure("x.png", "nothing", "nothing", "nothing", in_compare=True)
    path = tmp_path / "x.png"
    done = compare_report._over_training(
        drawn["ab"][0], path, panels=[("fig_probe", figure)], title="t"
    )
    assert done is False and not path.exists()
    assert len(figures) == 1 and figures[0].get_suptitle() == ""


def test_over_depth_each_run_at_its_step_and_at_initialisation(drawn):
    """Panel ``d``: a line per run over relative depth (embedding 0, blocks 0.5 and 1; the
    attention output left out) at its compared step, solid, and dashed and fainter at step 0
    where the run has it (b has not); panel ``e`` (attention output only) draws nothing and
    has no legend. The x axis from -0.03 to 1.03, labelled, with a grid."""
    left, right = _titled(drawn["ab"][3], "d over depth").axes
    depths = [0.0, 0.5, 1.0]
    assert _lines(left) == {
        "a": {"x": depths, "y": approx([2.0, 4.0, 6.0]), "color": "C0", "alpha": 1.0,
              "style": ("o", "-", 4.0)},
        "a at init": {"x": depths, "y": approx([1.0, 2.0, 3.0]), "color": "C0", "alpha": 0.6,
                      "style": ("o", "--", 4.0)},
        "b": {"x": depths, "y": approx([4.0, 8.0, 12.0]), "color": "C1", "alpha": 1.0,
              "style": ("o", "-", 4.0)},
    }  # fmt: skip
    assert [t.get_text() for t in left.get_legend().get_texts()] == ["a", "a at init", "b"]
    assert left.get_legend().get_texts()[0].get_fontsize() == 7
    assert not right.get_lines() and right.get_legend() is None
    for ax, label in ((left, "d label"), (right, "e label")):
        assert ax.get_xlim() == approx((-0.03, 1.03))
        assert ax.get_xlabel() == "relative depth (0 = embedding, 1 = last block)"
        assert ax.get_ylabel() == label
        assert ax.xaxis.get_gridlines()[0].get_alpha() == 0.3


def test_over_depth_at_step_0_draws_no_second_line_at_initialisation(drawn):
    """Runs compared at step 0: one solid line each, no dashed copy."""
    left, _ = _titled(drawn["ac"], "d over depth").axes
    assert {k: (v["y"], v["style"][1]) for k, v in _lines(left).items()} == {
        "a": (approx([1.0, 2.0, 3.0]), "-"),
        "c": (approx([2.0, 4.0, 6.0]), "-"),
    }


def test_over_depth_draws_nothing_without_embedding_or_residual_rows(drawn, figures, tmp_path):
    """Only attention outputs: no file, the figure closed unsaved."""
    path = tmp_path / "e.png"
    panels = [("fig_probe", "e", "e label")]
    done = compare_report._profiles(drawn["ab"][0], path, panels=panels, title="e")
    assert done is False and not path.exists()
    (fig,) = figures  # the figure begun, closed untitled
    assert isinstance(fig, MplFigure) and fig.get_suptitle() == ""


def test_over_depth_refuses_a_comparison_without_a_step_per_run(drawn, figures, tmp_path):
    """A comparison with fewer steps than runs is an error, not a figure without a run."""
    comparison = dataclasses.replace(drawn["ab"][0], steps=(1000,))
    panels = [("fig_probe", "d", "d label")]
    with pytest.raises(ValueError, match="zip"):
        compare_report._profiles(comparison, tmp_path / "d.png", panels=panels, title="d")
    plt.close("all")  # the figure begun
