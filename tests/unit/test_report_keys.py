"""The run's report and figures never average rows that differ in a key that varies (issue 42,
items 3 and 4): a recipe capturing ``resid_post`` and ``mlp_out`` gets a table (and lines) per
site kind — resid_post 0.176 and mlp_out 0.123 at L0 printed 0.150 under "L0" —, a probe's rows
of two methods a table (and a line) per method; and every table and figure whose rows carry an
interval shows it (``value [low, high]``, a band). Read back from the rendered text and from
the figures' artists."""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from matplotlib.collections import PolyCollection
from rich.console import Console

from tangentlens.probes.render.tangent_energy import tangent_energy_figure
from tangentlens.report import figures
from tangentlens.report.sweep_report import render_report
from tangentlens.results import SCHEMA, row

#: cosine anisotropy at L0 per site kind and step (the issue's step-64 values at 64)
COSINE = {"resid_post": {0: 0.101, 64: 0.176}, "mlp_out": {0: 0.087, 64: 0.123}}
#: a researcher's probe (not registered: default table and figure) with two methods
SHARES = {"pca": {0: 0.512, 64: 0.563}, "seminmf": {0: 0.530, 64: 0.602}}


def _rows() -> list[dict[str, Any]]:
    out = []
    for kind, by_step in COSINE.items():
        for step, value in by_step.items():
            site = f"blocks.0.hook_{kind}"
            out.append(
                row("s", step, step, "cosine_drift", "cosine_anisotropy", value, site=site, layer=0)
            )
    for method, by_step in SHARES.items():
        for step, value in by_step.items():
            out.append(
                row(
                    "s", step, step, "top_sv", "top_sv_share", value,
                    site="blocks.0.hook_resid_post", layer=0, method=method, rank=8,
                    ci=(value - 0.02, value + 0.03),
                )
            )  # fmt: skip
    return out


def _run(tmp_path, rows: list[dict[str, Any]]):
    (tmp_path / "results").mkdir()
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), tmp_path / "results" / "p.parquet")
    return tmp_path


def _report(run) -> str:
    console = Console(record=True, width=100)
    render_report(run, console)
    return console.export_text()


def _table(text: str, title: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index(next(line for line in lines if line.strip() == title))
    end = lines.index("", start)
    return [re.sub(r"\s+", " ", line.strip()) for line in lines[start + 1 : end]]


def test_a_two_site_recipe_gets_a_table_per_site_kind(tmp_path):
    text = _report(_run(tmp_path, _rows()))
    title = "cosine anisotropy (mean pairwise cosine)"
    assert _table(text, f"{title} — mlp_out") == ["step L0", "0 (init) 0.087", "64 0.123"]
    assert _table(text, f"{title} — resid_post") == ["step L0", "0 (init) 0.101", "64 0.176"]
    assert "0.150" not in text  # their mean, under "L0"


def test_a_probes_methods_get_a_table_each_with_the_interval(tmp_path):
    text = _report(_run(tmp_path, _rows()))
    assert _table(text, "top_sv: top_sv_share — pca (rank 8)") == [
        "step L0",
        "0 (init) 0.512 [0.492, 0.542]",
        "64 0.563 [0.543, 0.593]",
    ]
    assert _table(text, "top_sv: top_sv_share — seminmf (rank 8)")[2] == "64 0.602 [0.582, 0.632]"
    assert "0.583" not in text  # the methods' mean


def _figure(run, monkeypatch, name: str):
    closed = []
    monkeypatch.setattr(figures.plt, "close", closed.append)
    written = figures.write_figures(run)
    assert run / "figures" / name in written
    return {fig.axes[0].get_title() or fig.get_suptitle(): fig for fig in closed}


def _lines(ax) -> dict[str, list[float]]:
    return {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}


def test_a_two_site_recipe_draws_each_site_kind_and_each_method(tmp_path, monkeypatch):
    run = _run(tmp_path, _rows())
    drawn = _figure(run, monkeypatch, "top_sv.png")
    (share,) = [f for f in drawn.values() if f.get_suptitle() == "top_sv over training"]
    lines = _lines(share.axes[0])
    assert lines == {
        "layer 0 pca (rank 8)": pytest.approx([0.512, 0.563]),
        "layer 0 seminmf (rank 8)": pytest.approx([0.530, 0.602]),
    }
    # each line's interval is a band
    bands = [c for c in share.axes[0].collections if isinstance(c, PolyCollection)]
    assert len(bands) == 2
    assert bands[0].get_paths()[0].vertices[:, 1].min() == pytest.approx(0.492)


def test_anisotropy_over_depth_draws_a_row_of_panels_per_site_kind(tmp_path, monkeypatch):
    rows = [r for r in _rows() if r["probe"] == "cosine_drift"]
    for r in list(rows):  # a second block, so that depth has two points
        rows.append({**r, "site": r["site"].replace(".0.", ".1."), "layer": 1, "value": 0.2})
    run = _run(tmp_path, rows)
    closed = []
    monkeypatch.setattr(figures.plt, "close", closed.append)
    assert run / "figures" / "anisotropy_depth.png" in figures.write_figures(run)
    (fig,) = closed
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in visible] == ["mlp_out", "resid_post"]
    mlp, resid = (_lines(ax) for ax in visible)
    assert mlp["64"] == pytest.approx([0.123, 0.2]) and resid["64"] == pytest.approx([0.176, 0.2])


def test_the_energy_figure_draws_the_proxys_interval_per_site(tmp_path, monkeypatch):
    rows = []
    for kind, value in (("resid_post", 0.3), ("mlp_out", 0.1)):
        cell = {"site": f"blocks.0.hook_{kind}", "layer": 0, "method": "pca", "rank": 4}
        for step in (0, 64):
            for metric, v, ci in (
                ("energy_fraction", value, (value - 0.05, value + 0.05)),
                ("energy_ratio", 10 * value, (10 * value - 0.5, 10 * value + 0.5)),
                ("energy_control_min", 0.01, None),
                ("energy_control_mean", 0.02, None),
                ("energy_control_max", 0.03, None),
            ):
                rows.append(row("s", step, step, "tangent_energy", metric, v, ci=ci, **cell))
    run = _run(tmp_path, rows)
    closed = []
    monkeypatch.setattr(figures.plt, "close", closed.append)
    assert tangent_energy_figure(rows, run / "te.png")
    (fig,) = closed
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == [
        "all tokens — blocks.0.hook_mlp_out",
        "",
        "all tokens — blocks.0.hook_resid_post",
        "",
    ]
    mlp_fraction, mlp_ratio, resid_fraction, _ = fig.axes
    assert _lines(mlp_fraction)["pca proxy"] == pytest.approx([0.1, 0.1])
    assert _lines(resid_fraction)["pca proxy"] == pytest.approx([0.3, 0.3])
    bands = [c for c in mlp_ratio.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 1  # the ratio's interval
    assert bands[0].get_paths()[0].vertices[:, 1].min() == pytest.approx(0.5)
    fraction_bands = [c for c in mlp_fraction.collections if isinstance(c, PolyCollection)]
    assert len(fraction_bands) == 2  # the proxy's interval and the controls' min–max
