"""The tangent_energy probe's figures (``tangentlens.probes.render.tangent_energy``):
``energy_by_bin``, the tangent energy of one step per frequency bin, and the run's figure, read
back from the figure's artists (bar heights, error-bar segments, control markers, ticks,
legend)."""

from __future__ import annotations

import random
from typing import Any

import matplotlib.pyplot as plt
import pyarrow as pa
import pytest
from matplotlib.axes import Axes
from matplotlib.colors import to_rgba
from matplotlib.container import BarContainer, ErrorbarContainer

from tangentlens.probes.render import tangent_energy as render
from tangentlens.probes.render.tangent_energy import energy_by_bin
from tangentlens.results import SCHEMA, row

BINS = [str(i) for i in range(12)] + ["all"]  # 12 bins: string order would put "10" after "1"
METHODS = {"pca": 4, "mean_direction": 1}  # listed out of name order on purpose
DEEP = "blocks.2.hook_resid_post"


def _fraction(method: str, b: str, layer: int | None = 2, step: int = 40) -> float:
    """Distinct per method, bin, layer and step, so any swap changes the figure."""
    index = 12 if b == "all" else int(b)
    shift = 0.3 if method == "pca" else 0.0
    return 0.05 + 0.01 * index + shift + 0.001 * (layer if layer is not None else -1) + step * 1e-5


def _controls(method: str, b: str) -> tuple[float, float, float]:
    """(min, mean, max) of the method's controls in bin ``b``."""
    index = 12 if b == "all" else int(b)
    mean = (0.002 if method == "pca" else 0.001) * (1 + index)
    return 0.5 * mean, mean, 1.5 * mean


def _ratio(method: str, b: str, step: int = 40) -> float:
    """The energy ratio: the fraction over the controls' mean."""
    return _fraction(method, b, step=step) / _controls(method, b)[1]


def _rows(
    site: str = DEEP, layer: int | None = 2, step: int = 40, *, ci: bool = True
) -> list[dict[str, Any]]:
    out = []
    for method, rank in METHODS.items():
        for b in BINS:
            cell = {"site": site, "layer": layer, "method": method, "rank": rank, "freq_bin": b}
            value = _fraction(method, b, layer, step)
            interval = (value - 0.004, value + 0.006) if ci else None
            out.append(
                row(
                    "pythia-14m",
                    step,
                    step * 2048,
                    "tangent_energy",
                    "energy_fraction",
                    value,
                    ci=interval,
                    n_tokens=100,
                    **cell,
                )
            )
            low, mean, high = _controls(method, b)
            for metric, v in (
                ("energy_control_min", low),
                ("energy_control_mean", mean),
                ("energy_control_max", high),
                ("energy_ratio", _ratio(method, b, step)),
            ):
                out.append(
                    row("pythia-14m", step, step * 2048, "tangent_energy", metric, v, **cell)
                )
    out.append(row("pythia-14m", step, step * 2048, "capture", "mean_loss", 3.2, site=site))
    random.Random(0).shuffle(out)  # the figure must not depend on row order
    return out


def _bars(ax: Axes) -> dict[str, BarContainer]:
    """Bar containers by method (the legend label without its rank)."""
    return {c.get_label().split(" ")[0]: c for c in ax.containers if isinstance(c, BarContainer)}


def _centres(bars: BarContainer) -> list[float]:
    return [p.get_x() + p.get_width() / 2 for p in bars.patches]


def _heights(bars: BarContainer) -> list[float]:
    return [p.get_height() for p in bars.patches]


def _controls_drawn(ax: Axes) -> list[ErrorbarContainer]:
    """Error-bar containers with markers: the controls (a bar's error bars have none)."""
    return [c for c in ax.containers if isinstance(c, ErrorbarContainer) and c.lines[0] is not None]


def _ranges(container: ErrorbarContainer) -> list[tuple[float, float, float]]:
    """``(x, low, high)`` of each vertical error bar."""
    return [
        (float(seg[0][0]), float(seg[0][1]), float(seg[1][1]))
        for seg in container.lines[2][0].get_segments()
    ]


def _figure_data(fig: Any) -> tuple[Any, ...]:
    ax = fig.axes[0]
    bars = _bars(ax)
    return (
        [t.get_text() for t in ax.get_xticklabels()],
        {m: (_centres(b), _heights(b), _ranges(b.errorbar)) for m, b in bars.items()},
        [(list(c.lines[0].get_xdata()), list(c.lines[0].get_ydata())) for c in _controls_drawn(ax)],
        ax.get_title(),
    )


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_bars_are_energy_fractions_per_bin_in_numeric_order_with_all_last():
    ax = energy_by_bin(_rows()).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == BINS
    assert list(ax.get_xticks()) == list(range(len(BINS)))
    bars = _bars(ax)
    assert set(bars) == set(METHODS)
    for method, container in bars.items():
        centres = _centres(container)
        assert centres == sorted(centres)
        assert [round(c) for c in centres] == list(range(len(BINS)))  # each bar at its bin's tick
        assert _heights(container) == pytest.approx([_fraction(method, b) for b in BINS])
    assert ax.get_ylabel() == "gradient energy fraction"


def test_error_bars_are_the_bootstrap_intervals():
    bars = _bars(energy_by_bin(_rows()).axes[0])
    for method, container in bars.items():
        ranges = _ranges(container.errorbar)
        assert [x for x, _, _ in ranges] == pytest.approx(_centres(container))
        assert [lo for _, lo, _ in ranges] == pytest.approx(
            [_fraction(method, b) - 0.004 for b in BINS]
        )
        assert [hi for _, _, hi in ranges] == pytest.approx(
            [_fraction(method, b) + 0.006 for b in BINS]
        )


def test_bars_without_intervals_have_no_error_bars():
    bars = _bars(energy_by_bin(_rows(ci=False)).axes[0])
    assert all(b.errorbar is None for b in bars.values())
    assert _heights(bars["pca"]) == pytest.approx([_fraction("pca", b) for b in BINS])


def test_controls_are_marked_at_their_mean_with_the_min_max_range_on_each_bar():
    ax = energy_by_bin(_rows()).axes[0]
    bars = _bars(ax)
    drawn = _controls_drawn(ax)
    assert len(drawn) == len(METHODS)
    for method, container in bars.items():
        # the method's markers are the ones that sit on its bars
        patches = container.patches
        (controls,) = [
            c
            for c in drawn
            if all(
                p.get_x() < x < p.get_x() + p.get_width()
                for p, x in zip(patches, c.lines[0].get_xdata(), strict=True)
            )
        ]
        assert list(controls.lines[0].get_ydata()) == pytest.approx(
            [_controls(method, b)[1] for b in BINS]
        )
        ranges = _ranges(controls)
        assert [lo for _, lo, _ in ranges] == pytest.approx([_controls(method, b)[0] for b in BINS])
        assert [hi for _, _, hi in ranges] == pytest.approx([_controls(method, b)[2] for b in BINS])


def test_methods_are_dodged_with_one_colour_each_and_named_in_the_legend():
    ax = energy_by_bin(_rows()).axes[0]
    bars = _bars(ax)
    colours = {m: {p.get_facecolor() for p in b.patches} for m, b in bars.items()}
    assert all(len(c) == 1 for c in colours.values())
    assert colours["pca"] != colours["mean_direction"]
    for j in range(len(BINS)):  # side by side, not overlapping
        left, right = bars["mean_direction"].patches[j], bars["pca"].patches[j]
        assert left.get_x() + left.get_width() <= right.get_x()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[:2] == ["mean_direction (rank 1)", "pca (rank 4)"]
    assert "controls" in labels[2]


def test_default_site_is_the_deepest_layer_and_the_embedding_the_shallowest():
    rows = _rows("hook_embed", None) + _rows() + _rows("blocks.0.hook_resid_post", 0)
    ax = energy_by_bin(rows).axes[0]
    assert _heights(_bars(ax)["pca"]) == pytest.approx([_fraction("pca", b, 2) for b in BINS])
    assert DEEP in ax.get_title() and "step 40" in ax.get_title()
    shallow = _rows("hook_embed", None) + _rows("blocks.0.hook_resid_post", 0)
    ax = energy_by_bin(shallow).axes[0]
    assert _heights(_bars(ax)["pca"]) == pytest.approx([_fraction("pca", b, 0) for b in BINS])
    ax = energy_by_bin(rows, site="hook_embed").axes[0]
    assert _heights(_bars(ax)["pca"]) == pytest.approx([_fraction("pca", b, None) for b in BINS])
    assert "hook_embed" in ax.get_title()


def test_several_steps_need_a_step_and_an_absent_step_is_an_error():
    rows = _rows(step=0) + _rows(step=40)
    with pytest.raises(ValueError, match=r"several steps \[0, 40\]"):
        energy_by_bin(rows)
    ax = energy_by_bin(rows, step=0).axes[0]
    assert _heights(_bars(ax)["pca"]) == pytest.approx([_fraction("pca", b, step=0) for b in BINS])
    assert "step 0" in ax.get_title()
    with pytest.raises(ValueError, match=r"step 7.*\[0, 40\]"):
        energy_by_bin(rows, step=7)


def test_rows_without_tangent_energy_are_an_error():
    for rows in ([], [r for r in _rows() if r["probe"] != "tangent_energy"]):
        with pytest.raises(ValueError, match="tangent_energy probe"):
            energy_by_bin(rows)


def test_an_unknown_site_is_an_error_listing_the_present_sites():
    rows = _rows() + _rows("hook_embed", None)
    with pytest.raises(
        ValueError, match=r"'blocks.9.hook_resid_post'.*present.*blocks.2.*hook_embed"
    ):
        energy_by_bin(rows, site="blocks.9.hook_resid_post")


def test_rows_of_two_runs_are_an_error_not_an_average():
    with pytest.raises(ValueError, match=r"several energy_\w+ rows for method"):
        energy_by_bin(_rows() + _rows())


def test_path_saves_a_png(tmp_path):
    path = tmp_path / "energy.png"
    energy_by_bin(_rows(), path=path)
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_draws_into_the_given_axes():
    fig, (left, right) = plt.subplots(1, 2)
    assert energy_by_bin(_rows(), ax=right) is fig
    assert not _bars(left)
    assert _heights(_bars(right)["pca"]) == pytest.approx([_fraction("pca", b) for b in BINS])


def test_a_pyarrow_table_or_to_arrow_object_gives_the_same_figure():
    rows = _rows()
    table = pa.Table.from_pylist(rows, schema=SCHEMA)

    class Result:
        def to_arrow(self) -> pa.Table:
            return table

    expected = _figure_data(energy_by_bin(rows))
    assert _figure_data(energy_by_bin(table)) == expected
    assert _figure_data(energy_by_bin(Result())) == expected
    assert _figure_data(energy_by_bin(iter(rows))) == expected


def test_the_run_figure_orders_bin_panels_numerically(tmp_path, monkeypatch):
    closed = []
    monkeypatch.setattr(render.plt, "close", closed.append)
    rows = _rows(step=0) + _rows(step=40) + _rows("hook_embed", None)
    assert render.tangent_energy_figure(rows, tmp_path / "te.png")
    (fig,) = closed
    titles = [ax.get_title() for ax in fig.axes]  # fractions above, ratios below
    site = " — blocks.2.hook_resid_post"  # the deepest layer's one site
    named = [f"frequency bin {b}" for b in BINS[:-1]] + ["all tokens"]
    named[0] += " (rarest)"
    named[-2] += " (most frequent)"
    assert titles == [t + site for t in named] + [""] * len(BINS)
    assert "layer 2" in fig.get_suptitle()  # the deepest layer, not the embedding
    assert not render.tangent_energy_figure(rows[:0], tmp_path / "none.png")
    # a method has the same colour in both energy figures
    lines = {line.get_label(): line.get_color() for line in fig.axes[0].get_lines()}
    for method, bars in _bars(energy_by_bin(rows, step=40).axes[0]).items():
        assert to_rgba(lines[f"{method} proxy"]) == bars.patches[0].get_facecolor()


FEW_BINS = ["0", "all"]  # two panels: a 13-panel figure takes seconds to lay out


def _run_figure(rows: list[dict[str, Any]], tmp_path, monkeypatch) -> Any:
    """The run figure ``_tangent_energy`` draws from the ``FEW_BINS`` rows (kept open)."""
    closed = []
    monkeypatch.setattr(render.plt, "close", closed.append)
    rows = [r for r in rows if r["freq_bin"] in FEW_BINS]
    assert render.tangent_energy_figure(rows, tmp_path / "te.png")
    (fig,) = closed
    return fig


def _init_lines(ax: Axes) -> dict[str, Any]:
    """The step-0 baseline lines by method."""
    suffix = " at step 0 (init)"
    return {
        line.get_label().removesuffix(suffix): line
        for line in ax.get_lines()
        if line.get_label().endswith(suffix)
    }


def _line(ax: Axes, label: str) -> Any:
    (line,) = [x for x in ax.get_lines() if x.get_label() == label]
    return line


def test_the_run_figure_draws_the_energy_ratio_with_each_proxys_step_0_ratio_marked(
    tmp_path, monkeypatch
):
    fig = _run_figure(_rows(step=0) + _rows(step=40) + _rows(step=400), tmp_path, monkeypatch)
    fractions, ratios = fig.axes[: len(FEW_BINS)], fig.axes[len(FEW_BINS) :]
    for top, bottom, b in zip(fractions, ratios, FEW_BINS, strict=True):
        assert not _init_lines(top)
        lines = _init_lines(bottom)
        assert set(lines) == set(METHODS)
        for method, line in lines.items():
            proxy = _line(bottom, f"{method} proxy")
            assert list(proxy.get_xdata()) == [0, 40, 400]
            assert list(proxy.get_ydata()) == pytest.approx(
                [_ratio(method, b, s) for s in (0, 40, 400)]
            )
            # a dotted horizontal line across the panel at the step-0 ratio, in the method's colour
            assert list(line.get_ydata()) == pytest.approx([_ratio(method, b, step=0)] * 2)
            assert list(line.get_xdata()) == [0, 1]
            assert line.get_linestyle() == ":"
            assert (
                line.get_color() == proxy.get_color() == _line(top, f"{method} proxy").get_color()
            )
        assert list(_line(bottom, "null (ratio 1)").get_ydata()) == [1.0, 1.0]
    assert bottom.get_yscale() == "log" and bottom.get_xscale() == "symlog"
    legend = [t.get_text() for t in ratios[0].get_legend().get_texts()]
    assert "pca at step 0 (init)" in legend and "null (ratio 1)" in legend
    assert "ratio" in ratios[0].get_ylabel()


def test_the_run_figure_draws_no_baseline_without_step_0_or_with_step_0_alone(
    tmp_path, monkeypatch
):
    for rows in (_rows(step=40) + _rows(step=400), _rows(step=0)):
        fig = _run_figure(rows, tmp_path, monkeypatch)
        assert all(not _init_lines(ax) for ax in fig.axes)
        monkeypatch.undo()
