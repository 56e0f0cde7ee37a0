"""The values, labels, order and layout the run's figures draw (``tangentlens.report.figures``;
mutmut survivors): read back from the artists of the figure (lines' data, labels, colours and
markers, ticks, titles, legend) and from the PNG's size in pixels."""

from __future__ import annotations

import struct
import sys
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pytest

from tangentlens.report import figures
from tangentlens.reporting import Figure
from tangentlens.sweep.store import RunStore
from tests.unit.test_report_keys import _run
from tests.unit.test_report_order import _r

EMBED = {"site": "hook_embed", "layer": None}
MLP = {"site": "blocks.0.hook_mlp_out", "layer": 0}


@pytest.fixture
def drawn(monkeypatch) -> list[Any]:
    """The figures drawn (kept open: ``plt.close`` records them instead), closed after."""
    closed: list[Any] = []
    close = plt.close
    monkeypatch.setattr(figures.plt, "close", closed.append)
    yield closed
    for fig in closed:
        close(fig)


def _png_size(path: Path) -> tuple[int, int]:
    """(width, height) in pixels, from the PNG's header."""
    return struct.unpack(">II", path.read_bytes()[16:24])


def _lines(ax) -> list[tuple[str, list[float], list[float]]]:
    """(label, x, y) of each line, in drawing order."""
    return [(ln.get_label(), list(ln.get_xdata()), list(ln.get_ydata())) for ln in ax.get_lines()]


# ------------------------------------------------------------------------- over depth


def _depth_rows() -> list[dict[str, Any]]:
    """Probe p: metric a per (method, rank) pca / pca rank 8 at the embedding, L0 and L1 over
    three steps, each value distinct; metric b one method; a second probe q's row at L5."""
    rows = []
    for step in (0, 10, 100):
        for rank in (None, 8):
            shift = 0.5 if rank else 0.0
            for cell, depth in ((EMBED, -1), ({"layer": 0}, 0), ({"layer": 1}, 1)):
                value = shift + depth / 10 + step / 1000
                rows.append(_r("p", "a", step, method="pca", rank=rank, value=value, **cell))
        rows.append(_r("p", "b", step, value=1.0 + step / 1000))
    rows.append(_r("q", "a", 0, site="blocks.5.hook_mlp_out", layer=5, value=9.0))
    return rows


DEPTH = [
    ("p", Figure("d.png", "a", "a label", "Depth title", over="depth")),
    ("p", Figure("d.png", "b", "b label", "Depth title", over="depth")),
    ("p", Figure("d.png", "absent", "absent label", "Depth title", over="depth")),
]


def test_over_depth_draws_a_line_per_step_a_row_per_method_and_a_column_per_panel(tmp_path, drawn):
    """Two present panels (the third has no rows) → two columns; panel a's two (method, rank)
    groups → two rows, each titled by its proxy; a line per step through emb, L0, L1 with the
    group's values, in viridis from the first step to the last, dots joined by lines."""
    path = tmp_path / "d.png"
    assert figures._over_depth(_depth_rows(), path, DEPTH, "Depth title") is True
    (fig,) = drawn
    assert len(fig.axes) == 4
    assert tuple(fig.get_size_inches()) == pytest.approx((11.0, 7.6))
    assert _png_size(path) == (1320, 912)  # 120 dpi
    assert fig.get_suptitle() == "Depth title"
    a0, b0, a1, _ = fig.axes
    assert [ax.get_visible() for ax in fig.axes] == [True, True, True, False]
    assert [ax.get_title() for ax in (a0, a1, b0)] == ["pca (rank 8)", "pca", ""]
    assert a0.title.get_fontsize() == 9
    viridis = plt.get_cmap("viridis")
    for ax, shift in ((a0, 0.5), (a1, 0.0)):
        assert [(label, x) for label, x, _ in _lines(ax)] == [
            ("0", [-1, 0, 1]),
            ("10", [-1, 0, 1]),
            ("100", [-1, 0, 1]),
        ]
        for (_, _, y), step in zip(_lines(ax), (0, 10, 100), strict=True):
            assert y == pytest.approx(
                [shift - 0.1 + step / 1000, shift + step / 1000, shift + 0.1 + step / 1000]
            )
        assert [ln.get_color() for ln in ax.get_lines()] == [
            viridis(0.0),
            viridis(0.5),
            viridis(1.0),
        ]
        assert {(ln.get_marker(), ln.get_linestyle()) for ln in ax.get_lines()} == {("o", "-")}
        assert list(ax.get_xticks()) == [-1, 0, 1]  # probe q's L5 is not p's depth
        assert [t.get_text() for t in ax.get_xticklabels()] == ["emb", "L0", "L1"]
        assert (ax.get_xlabel(), ax.get_ylabel()) == ("depth", "a label")
        assert ax.xaxis.get_gridlines()[0].get_alpha() == 0.3
    assert _lines(b0)[2][2] == pytest.approx([1.1])
    assert b0.get_ylabel() == "b label"
    assert a0.get_legend() is None and a1.get_legend() is None
    legend = b0.get_legend()  # the first row's last column
    assert legend.get_title().get_text() == "step"
    assert [t.get_text() for t in legend.get_texts()] == ["0", "10", "100"]
    assert {t.get_fontsize() for t in legend.get_texts()} == {7}
    assert legend._ncols == 2


def test_over_depth_without_a_present_panel_draws_nothing(tmp_path, drawn):
    path = tmp_path / "none.png"
    assert figures._over_depth(_depth_rows(), path, DEPTH[2:], "t") is False
    assert not path.exists() and drawn == []


def test_over_depth_names_site_kind_and_method_where_both_vary(tmp_path, drawn):
    """Two block site kinds × two methods → four rows of panels titled "kind, method"; over two
    steps the lines are viridis's two ends, whatever the default colour map."""
    rows = [
        _r("p", "a", step, method=method, value=v + step, **cell)
        for step in (0, 1)
        for method, v in (("pca", 0.1), ("seminmf", 0.2))
        for cell in ({"layer": 0}, MLP)
    ]
    with plt.rc_context({"image.cmap": "magma"}):
        assert figures._over_depth(rows, tmp_path / "d.png", DEPTH[:1], "t")
    (fig,) = drawn
    assert [ax.get_title() for ax in fig.axes] == [
        "mlp_out, pca",
        "mlp_out, seminmf",
        "resid_post, pca",
        "resid_post, seminmf",
    ]
    viridis = plt.get_cmap("viridis")
    assert [ln.get_color() for ln in fig.axes[0].get_lines()] == [viridis(0.0), viridis(1.0)]


def test_over_depth_averages_the_methods_where_the_figure_says_so(tmp_path, drawn):
    """``per_method=False``: one row of panels, the methods' mean at each depth, no title."""
    rows = [
        _r("p", "a", 0, method=method, value=v, **cell)
        for method, v in (("h0", 0.2), ("h1", 0.4))
        for cell in (EMBED, {"layer": 0})
    ]
    panel = ("p", Figure("d.png", "a", "a, mean over heads", "t", over="depth", per_method=False))
    assert figures._over_depth(rows, tmp_path / "d.png", [panel], "t")
    (fig,) = drawn
    (ax,) = fig.axes
    assert ax.get_title() == ""
    assert _lines(ax) == [("0", [-1, 0], pytest.approx([0.3, 0.3]))]


# ------------------------------------------------------------------------ over steps


def _steps_rows() -> list[dict[str, Any]]:
    """Probe p: metric a per site kind and layer at steps 10 and 2 (10 first, and "10" < "2"
    as text); metric b two heads with intervals; metric m five proxies at L0; probe q's row of
    metric a."""
    rows = []
    for step in (10, 2):
        for layer in (1, 0):
            for kind, v in (("resid_post", 0.1), ("mlp_out", 0.2)):
                site = f"blocks.{layer}.hook_{kind}"
                rows.append(_r("p", "a", step, site=site, layer=layer, value=v + layer + step))
        rows.append(_r("p", "a", step, value=0.5 + step, **EMBED))
        for method, v in (("h0", 0.2), ("h1", 0.4)):
            rows.append(_r("p", "b", step, method=method, value=v, ci=(v - 0.1, v + 0.1)))
    for method, rank, v, cell in (
        ("seminmf", 4, 0.1, {"layer": 0}),
        ("pca", 8, 0.2, {"layer": 0}),
        ("pca", 1, 0.3, {"layer": 0}),
        ("pca", None, 0.4, {"layer": 0}),
        ("seminmf", 8, 0.5, MLP),
    ):
        rows.append(_r("p", "m", 0, method=method, rank=rank, value=v, **cell))
    rows.append(_r("q", "a", 2, value=7.0))
    rows.append({**_r("p", "c", 2), "value": None})  # a metric no panel draws, with no value
    return rows


STEPS = [
    ("p", Figure("s.png", "a", "a label", "Steps title")),
    ("p", Figure("s.png", "absent", "absent label", "Steps title")),
    ("p", Figure("s.png", "b", "b, mean over heads", "Steps title", per_method=False)),
    ("p", Figure("s.png", "m", "m label", "Steps title")),
]


@pytest.fixture(scope="module")
def steps_figure(tmp_path_factory):
    """(what ``_per_layer_over_steps`` returned, the figure, its PNG) for STEPS, drawn once."""
    path = tmp_path_factory.mktemp("steps") / "s.png"
    closed: list[Any] = []
    close = plt.close
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(figures.plt, "close", closed.append)
        drew = figures._per_layer_over_steps(_steps_rows(), path, STEPS, "Steps title")
    (fig,) = closed
    yield drew, fig, path
    close(fig)


def test_over_steps_draws_a_panel_per_metric_and_a_line_per_key_in_depth_order(steps_figure):
    """Three present panels side by side; panel a: the embedding first, then per layer each
    site kind (named: two vary), steps ascending, probe q's rows apart."""
    drew, fig, path = steps_figure
    assert drew is True
    assert len(fig.axes) == 3
    assert tuple(fig.get_size_inches()) == pytest.approx((16.5, 3.8))
    assert _png_size(path) == (1980, 456)  # 120 dpi
    assert fig.get_suptitle() == "Steps title"
    a, b, m = fig.axes
    assert a.get_position().x1 < b.get_position().x0 < b.get_position().x1 < m.get_position().x0
    assert [ax.get_ylabel() for ax in fig.axes] == ["a label", "b, mean over heads", "m label"]
    assert _lines(a) == [
        ("embed", [2, 10], pytest.approx([2.5, 10.5])),
        ("layer 0 mlp_out", [2, 10], pytest.approx([2.2, 10.2])),
        ("layer 0 resid_post", [2, 10], pytest.approx([2.1, 10.1])),
        ("layer 1 mlp_out", [2, 10], pytest.approx([3.2, 11.2])),
        ("layer 1 resid_post", [2, 10], pytest.approx([3.1, 11.1])),
    ]
    legend = m.get_legend()
    assert a.get_legend() is None and legend is not None
    assert {t.get_fontsize() for t in legend.get_texts()} == {7}


def test_over_steps_averages_the_heads_where_the_figure_says_so(steps_figure):
    """``per_method=False``: one line, the heads' mean, its band the means of their ends."""
    b = steps_figure[1].axes[1]
    assert _lines(b) == [("layer 0", [2, 10], pytest.approx([0.3, 0.3]))]
    (band,) = b.collections
    assert band.get_paths()[0].vertices[:, 1].min() == pytest.approx(0.2)


def test_over_steps_orders_proxies_by_kind_method_then_rank(steps_figure):
    """Panel m: the site kind first, then the method by name, then the rank (none first)."""
    m = steps_figure[1].axes[2]
    assert [(label, y) for label, _, y in _lines(m)] == [
        ("layer 0 mlp_out seminmf (rank 8)", [0.5]),
        ("layer 0 resid_post pca", [0.4]),
        ("layer 0 resid_post pca (rank 1)", [0.3]),
        ("layer 0 resid_post pca (rank 8)", [0.2]),
        ("layer 0 resid_post seminmf (rank 4)", [0.1]),
    ]


def test_over_steps_draws_one_panel_or_two(tmp_path, drawn):
    assert figures._per_layer_over_steps(_steps_rows(), tmp_path / "1.png", STEPS[:1], "t")
    assert figures._per_layer_over_steps(_steps_rows(), tmp_path / "2.png", STEPS[:3], "t")
    one, two = drawn
    assert len(one.axes) == 1 and one.axes[0].get_legend() is not None
    assert tuple(one.get_size_inches()) == pytest.approx((5.5, 3.8))
    assert [ax.get_ylabel() for ax in two.axes] == ["a label", "b, mean over heads"]


def test_over_steps_without_a_present_panel_draws_nothing(tmp_path, drawn):
    path = tmp_path / "none.png"
    assert figures._per_layer_over_steps(_steps_rows(), path, STEPS[1:2], "t") is False
    assert not path.exists() and drawn == []


def test_lines_keep_the_methods_apart_unless_told():
    rows = [r for r in _steps_rows() if r["metric"] == "b"]
    assert sorted(figures._lines(rows, "p", "b")) == [
        ("resid_post", 0, "h0", None),
        ("resid_post", 0, "h1", None),
    ]
    assert list(figures._lines(rows, "p", "b", per_method=False)) == [("resid_post", 0, None, None)]


def test_line_labels_name_a_site_without_a_block_and_a_site_of_no_known_kind(tmp_path, drawn):
    """A block row of no known site kind is drawn as kind "-" beside resid_post's; a key with a
    site kind but no block is named by its kind."""
    rows = [_r("p", "a", 0, value=0.1), _r("p", "a", 0, site="blocks.0.mine", value=0.2)]
    assert figures._per_layer_over_steps(rows, tmp_path / "s.png", STEPS[:1], "t")
    assert [label for label, _, _ in _lines(drawn[0].axes[0])] == [
        "layer 0 -",
        "layer 0 resid_post",
    ]
    key = ("resid_post", None, "-", None)
    assert figures._line_label(key, [key, ("resid_post", 0, "-", None)]) == "resid_post"


WHOLE = {"site": "-", "layer": None}


def test_rows_about_the_whole_model_are_their_own_line_over_steps_and_absent_over_depth(
    tmp_path, drawn
):
    """A row about the whole model (site "-", no block) beside the embedding's and a block's:
    over steps it is the line "whole model", not a second "embed"; over depth it has no place,
    so the embedding's point (the left end) holds the embedding's value alone."""
    rows = [
        _r("p", "a", step, value=value + step, **cell)
        for step in (0, 1)
        for cell, value in ((EMBED, 0.1), (WHOLE, 5.0), ({"layer": 0}, 0.3))
    ]
    assert figures._per_layer_over_steps(rows, tmp_path / "s.png", STEPS[:1], "t")
    labels = {label: y for label, _, y in _lines(drawn[0].axes[0])}
    assert labels == {
        "embed": pytest.approx([0.1, 1.1]),
        "layer 0": pytest.approx([0.3, 1.3]),
        "whole model": pytest.approx([5.0, 6.0]),
    }
    assert figures._over_depth(rows, tmp_path / "d.png", DEPTH[:1], "t")
    (ax,) = drawn[1].axes
    assert [(x, y) for _, x, y in _lines(ax)] == [([-1, 0], [0.1, 0.3]), ([-1, 0], [1.1, 1.3])]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["emb", "L0"]


def test_over_depth_has_no_embedding_tick_for_rows_about_the_whole_model(tmp_path, drawn):
    """Blocks and a whole-model row, no embedding: the depth axis starts at L0."""
    rows = [_r("p", "a", 0, value=1.0, **WHOLE), _r("p", "a", 0, value=0.3)]
    assert figures._over_depth(rows, tmp_path / "d.png", DEPTH[:1], "t")
    (ax,) = drawn[0].axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["L0"]
    assert _lines(ax) == [("0", [0], [0.3])]


# ---------------------------------------------------------------- declared, rendered

FIGURE_PROBE = """
from dataclasses import dataclass
from pathlib import Path

from tangentlens.registry import Probe
from tangentlens.reporting import Figure, Reporting

CALLS = []


@dataclass(frozen=True)
class Config:
    pass


def draw(rows, path):
    CALLS.append((len(rows), path))
    Path(path).write_bytes(b"png")
    return True


PROBE = Probe(name="zz_figures", config=Config, scope="model_free", metrics={"m": "m"},
              rows=lambda inputs, config: [],
              reporting=Reporting(figures=(Figure("custom.png", "m", "m", "t",
                                                  render="figure_values_probe:draw"),
                                           Figure("declared.png", "m", "m label", "Declared"))))
"""


@pytest.fixture
def figure_probe(tmp_path, monkeypatch):
    """A researcher's probe ``zz_figures`` with a custom figure and a declared one."""
    folder = tmp_path / "module"
    folder.mkdir()
    (folder / "figure_values_probe.py").write_text(FIGURE_PROBE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "figure_values_probe", raising=False)
    import figure_values_probe

    return figure_values_probe


def test_the_manifest_finds_a_probes_declared_and_custom_figures(tmp_path, figure_probe, drawn):
    """The manifest's key finds the probe: its custom renderer gets every row and its path;
    its declared figure is drawn; ``figures/`` already there is reused."""
    run = _run(tmp_path, [_r("zz_figures", "m", s, value=0.1 * s) for s in (0, 1, 2)])
    RunStore(run).write_manifest({"probes": {"figure_values_probe:PROBE": {"name": "zz_figures"}}})
    folder = run / "figures"
    expected = [folder / "custom.png", folder / "declared.png"]
    assert figures.write_figures(run) == expected
    calls = figure_probe.CALLS
    assert calls == [(3, folder / "custom.png")]
    assert [ax.get_ylabel() for fig in drawn for ax in fig.axes] == ["m label"]
    assert figures.write_figures(run) == expected  # a second time, into the same folder
