"""``compare`` for a researcher's own probe (issue 42, item 6): its recipe keys must match (two
runs of ``site_grad`` with ``lower = 1`` and ``lower = 2`` were compared as a Δln, the
difference shown only among "settings that differ"), unless the probe declares that a key may
differ; rows that compare steps are compared only between the same transitions (64 → 1200
read against 0 → 1200 as a difference); and its figure is drawn in ``compare`` as in the
report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from matplotlib.collections import PolyCollection
from rich.console import Console

from tangentlens.comparison import compare
from tangentlens.report import compare_report
from tangentlens.results import row
from tangentlens.sweep.store import RunStore

KEY = "mypkg42.probes:SITE_GRAD"  # an import path this installation cannot resolve
SITE = "blocks.1.hook_resid_post"


def _recipe(lower: int = 1, bootstrap: int = 200) -> dict[str, Any]:
    return {
        "name": "r",
        "suite": {"name": "micro-pythia"},
        "data": {"n_bins": 3, "seq_len": 32, "max_tokens": 2048},
        "probes": {
            KEY: {"lower": lower, "upper": 9},
            "cosine_drift": {},
            "tangent_energy": {"bootstrap": bootstrap, "data_matched_m": None},
        },
    }


def _rows(step: int, value: float) -> list[dict[str, Any]]:
    cell = {"site": SITE, "layer": 1}
    return [
        row("s", step, 10 * step, "site_grad", "site_grad_ratio", value, method="pca", rank=4,
            ci=(value - 0.1, value + 0.1), **cell),
        row("s", step, 10 * step, "cosine_drift", "cosine_anisotropy", 0.3, **cell),
        row("s", step, 10 * step, "tangent_energy", "energy_fraction", 0.2, method="pca",
            rank=4, **cell),
    ]  # fmt: skip


def _run(root: Path, recipe: dict, steps: list[int], across: list[dict] = ()) -> Path:
    store = RunStore(root)
    store.write_part("step-all", [r for s in steps for r in _rows(s, 1.0 + s / 1000)])
    if across:
        store.write_part("across-steps", list(across))
    manifest = {
        "recipe": recipe,
        "finished": True,
        "n_layers": 2,
        "steps": steps,
        "probes": {KEY: {"name": "site_grad", "module": "mypkg42.probes"}},
    }
    store.write_manifest(manifest)
    return root


def test_a_probes_own_setting_that_differs_refuses_its_rows(tmp_path):
    a = _run(tmp_path / "a", _recipe(lower=1), [0, 1200])
    b = _run(tmp_path / "b", _recipe(lower=2), [0, 1200])
    comparison = compare([a, b])
    (refused,) = comparison.refused
    assert refused.line == (
        f"site_grad setting lower differs (probes.{KEY}.lower: a 1, b 2): site_grad rows not "
        "compared"
    )
    probes = {r["probe"] for r in comparison.to_pylist()}
    assert probes == {"cosine_drift", "tangent_energy"}  # the rest is compared
    assert (f"probes.{KEY}.lower", ["1", "2"]) in comparison.recipe_differences
    same = compare([a, _run(tmp_path / "c", _recipe(lower=1), [0, 1200])])
    assert not same.refused and "site_grad" in {r["probe"] for r in same.to_pylist()}


def test_a_key_the_probe_declares_may_differ_is_compared(tmp_path):
    """tangent_energy's bootstrap replicates change no value: it declares them ``may_differ``."""
    a = _run(tmp_path / "a", _recipe(bootstrap=200), [0, 1200])
    b = _run(tmp_path / "b", _recipe(bootstrap=50), [0, 1200])
    comparison = compare([a, b])
    assert not comparison.refused
    assert "tangent_energy" in {r["probe"] for r in comparison.to_pylist()}


def _update(step: int, value: float) -> dict[str, Any]:
    return row("s", step, 10 * step, "update_alignment", "centroid_update_energy_ratio", value,
               site=SITE, layer=1, method="pca", rank=4)  # fmt: skip


def test_rows_across_steps_are_compared_only_between_the_same_transitions(tmp_path):
    a = _run(tmp_path / "a", _recipe(), [64, 1200], [_update(1200, 2.0)])
    b = _run(tmp_path / "b", _recipe(), [0, 1200], [_update(1200, 3.0)])
    comparison = compare([a, b])
    (refused,) = comparison.refused
    assert refused.line == (
        "transitions differ (a 64 → 1200, b 0 → 1200): across-steps rows (update_alignment) "
        "not compared"
    )
    assert "update_alignment" not in {r["probe"] for r in comparison.to_pylist()}
    assert "cosine_drift" in {r["probe"] for r in comparison.to_pylist()}
    c = _run(tmp_path / "c", _recipe(), [0, 64, 1200], [_update(64, 1.0), _update(1200, 2.5)])
    same = compare([a, c])  # 64 → 1200 in both
    assert not same.refused
    (difference,) = [
        r for r in same.to_pylist() if r["probe"] == "update_alignment" and r["difference"]
    ]
    assert difference["value"] == pytest.approx(0.22314355131420976)  # ln 2.5 − ln 2


def test_compare_draws_a_figure_for_a_researchers_probe(tmp_path, monkeypatch):
    a = _run(tmp_path / "a", _recipe(), [0, 1200])
    b = _run(tmp_path / "b", _recipe(), [0, 1200])
    closed = []
    monkeypatch.setattr(compare_report.plt, "close", closed.append)
    written = compare_report.write_comparison(compare([a, b]), tmp_path / "out")
    assert tmp_path / "out" / "site_grad.png" in written
    (fig,) = [f for f in closed if f.get_suptitle() == "site_grad over training"]
    (ax,) = fig.axes
    lines = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}
    assert lines == {
        "a resid_post 1.00 pca (rank 4)": pytest.approx([1.0, 2.2]),
        "b resid_post 1.00 pca (rank 4)": pytest.approx([1.0, 2.2]),
    }
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 2  # each run's interval


def test_compare_tables_show_each_runs_interval(tmp_path):
    a = _run(tmp_path / "a", _recipe(), [0, 1200])
    b = _run(tmp_path / "b", _recipe(), [0, 1200])
    console = Console(record=True, width=120)
    compare_report.render_comparison(compare([a, b]), console)
    text = console.export_text()
    start = text.index("site_grad: site_grad_ratio")
    table = text[start : text.index("\n\n", start)]
    assert "2.200 [2.100, 2.300]" in table  # each run's value with its interval
