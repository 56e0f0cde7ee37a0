"""What ``compare`` prints (:mod:`tangentlens.report.compare_report`), cell by cell: the header's
lines (each run's folder, suite, step and tokens, the refused settings, the rows not shared, the
note on the differences' intervals), the recipe table, the held-out loss table and a probe's
side-by-side tables (columns, their alignment, the order of the rows, the values, their
intervals and the averaged methods). Value tests on hand-built run folders."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from rich.console import Console

from tangentlens.comparison import compare
from tangentlens.comparison.table import INTERVAL_NOTE
from tangentlens.report import compare_report
from tangentlens.reporting import Table
from tangentlens.results import row
from tangentlens.sweep.store import RunStore
from tests.unit.test_compare_probe_settings import _recipe
from tests.unit.test_compare_probe_settings import _run as _settings_run
from tests.unit.test_comparison import _write_run

SUITE = {"name": "micro-pythia", "family": "decoder"}


def _lines(renderable: Any, width: int = 100) -> list[str]:
    """``renderable`` printed on a recording console ``width`` wide, line by line, trailing
    spaces kept (they show a left-justified title)."""
    console = Console(record=True, width=width)
    console.print(renderable)
    return console.export_text().splitlines()


def _cell(step: int, tokens: int | None, metric: str, value: float, **where: Any) -> dict:
    """A row of the probe ``p`` (no installed probe has that name: it gets default tables)."""
    return row("s", step, tokens, "p", metric, value, **where)


def _at(layer: int, kind: str = "resid_post") -> dict[str, Any]:
    return {"site": f"blocks.{layer}.hook_{kind}", "layer": layer}


def _replicate(metric: str, values: list[float], **where: Any) -> dict[str, Any]:
    """A replicate record of ``p``'s ``metric`` at step 10 (method pca, rank 4)."""
    record = row("s", 10, None, "p", metric, 0.0, method="pca", rank=4, **where)
    for name in ("tokens_seen", "value", "ci_low", "ci_high", "n_tokens"):
        del record[name]
    return {**record, "replicates": values}


# ------------------------------------------------------------------------------------ header


def test_the_header_lines_name_each_run_the_refusals_the_unshared_rows_and_the_note(tmp_path):
    """One line per run (label, folder, suite, blocks, step and tokens seen), a red line per
    refused setting, the rows not shared per run joined by "; ", and the note that no
    difference carries an interval (the runs' own rows carry one, the differences none)."""
    a = _settings_run(tmp_path / "a", _recipe(lower=1), [0, 1200])
    b = _settings_run(tmp_path / "b", _recipe(lower=2), [0, 1200])
    for root in (a, b):
        store = RunStore(root)
        store.write_manifest({**store.read_manifest(), "suite": SUITE})
    comparison = compare([a, b])
    (refused,) = comparison.refused
    assert compare_report._header(comparison) == [
        "[bold]2 runs[/] (differences against a)",
        f"• a: {a} · micro-pythia (2 blocks, decoder) · step 1200, 12,000 tokens seen",
        f"• b: {b} · micro-pythia (2 blocks, decoder) · step 1200, 12,000 tokens seen",
        f"[red]refused: {refused.line}[/]",
        "[dim]rows not shared (refused or in one run only): a: site_grad 1; b: site_grad 1[/]",
        f"[dim]{INTERVAL_NOTE}[/]",
    ]


def test_a_run_without_tokens_seen_names_its_step_only_and_the_second_run_is_no_reference(
    tmp_path,
):
    """Rows that do not know their tokens seen: the run's line ends at its step; the
    differences are against the first run whatever the order of the folders' names."""
    rows = [_cell(10, None, "m", 1.0, **_at(0))]
    z = _write_run(tmp_path / "z", rows, {}, n_layers=2, suite=SUITE)
    y = _write_run(tmp_path / "y", rows, {}, n_layers=2, suite=SUITE)
    lines = compare_report._header(compare([z, y]))
    assert lines[:3] == [
        "[bold]2 runs[/] (differences against z)",
        f"• z: {z} · micro-pythia (2 blocks, decoder) · step 10",
        f"• y: {y} · micro-pythia (2 blocks, decoder) · step 10",
    ]


def test_a_step_a_run_has_no_row_at_names_no_tokens(tmp_path):
    """A comparison whose step for a run is one it holds no row at (a hand-made one): the
    run's line names the step and no tokens seen."""
    rows = [_cell(10, 100, "m", 1.0, **_at(0))]
    a = _write_run(tmp_path / "a", rows, {}, n_layers=2, suite=SUITE)
    b = _write_run(tmp_path / "b", rows, {}, n_layers=2, suite=SUITE)
    comparison = dataclasses.replace(compare([a, b]), steps=(10, 99))
    assert compare_report._header(comparison)[1:3] == [
        f"• a: {a} · micro-pythia (2 blocks, decoder) · step 10, 100 tokens seen",
        f"• b: {b} · micro-pythia (2 blocks, decoder) · step 99",
    ]


@pytest.mark.parametrize("part", ["steps", "unshared"])
def test_a_comparison_that_does_not_name_every_runs_step_is_refused(tmp_path, part):
    """A comparison with fewer steps (or counts of rows not shared) than runs is an error, not
    a header that leaves a run out."""
    rows = [_cell(10, 100, "m", 1.0, **_at(0))]
    a = _write_run(tmp_path / "a", rows, {}, n_layers=2, suite=SUITE)
    b = _write_run(tmp_path / "b", rows, {}, n_layers=2, suite=SUITE)
    comparison = compare([a, b])
    short = dataclasses.replace(comparison, **{part: getattr(comparison, part)[:1]})
    with pytest.raises(ValueError, match="zip"):
        compare_report._header(short)


def _with_replicates(tmp_path: Path) -> list[Path]:
    """Runs a and b at step 10 (2 blocks) whose ``p`` rows ``m`` and ``n`` at block 0 kept
    their replicates (a: 1, 2, 3, 4; b: twice those), and ``o`` with an interval but none."""
    roots = []
    for name, scale in (("a", 1.0), ("b", 2.0)):
        where = {**_at(0), "method": "pca", "rank": 4}
        rows = [
            _cell(10, 100, "n", 2.5 * scale, ci=(scale, 4 * scale), **where),
            _cell(10, 100, "m", 2.5 * scale, ci=(scale, 4 * scale), **where),
            _cell(10, 100, "o", 0.5 * scale, ci=(0.1, 0.9), **where),
        ]
        root = _write_run(tmp_path / name, rows, {}, n_layers=2, suite=SUITE)
        replicates = [scale * v for v in (1.0, 2.0, 3.0, 4.0)]
        RunStore(root).write_replicates(
            "step-all", [_replicate(m, replicates, **_at(0)) for m in ("n", "m")]
        )
        roots.append(root)
    return roots


def test_the_note_names_the_metrics_whose_differences_carry_an_interval(tmp_path):
    """Where both runs kept the replicates, the note names those metrics, sorted, instead of
    saying that no difference carries an interval."""
    lines = compare_report._header(compare(_with_replicates(tmp_path)))
    assert lines[-1] == (
        "[dim]\\[lo, hi] after a difference: 95 % percentile interval of the runs' paired "
        "bootstrap replicate differences (m, n); other differences have none[/]"
    )


# ------------------------------------------------------------------------------------ tables


def test_a_difference_shows_its_interval_after_the_value(tmp_path):
    """The Δ column shows the difference (5.0 − 2.5) with the 95 % percentile interval of the
    paired replicate differences 1, 2, 3, 4 (numpy's linear quantiles: 1.075 and 3.925); a
    metric without replicates shows its difference alone."""
    comparison = compare(_with_replicates(tmp_path))
    table = compare_report._headline(comparison, "p", Table("m", "p: m"))
    assert _lines(table)[2:] == [
        "pca     resid_post 0.50  2.500 [1.000, 4.000]  5.000 [2.000, 8.000]  2.500 [1.075, 3.925]"
    ]
    table = compare_report._headline(comparison, "p", Table("o", "p: o"))
    assert _lines(table)[2:] == [
        "pca     resid_post 0.50  0.500 [0.100, 0.900]  1.000 [0.100, 0.900]  0.500"
    ]


def _two_runs(tmp_path: Path) -> Any:
    """Runs a and b (2 blocks, step 10; b's values twice a's) of ``p``: metric ``m`` at block
    1's attention output and residual stream, block 0's residual stream, a site ``foo``
    without a layer and at block 0, for methods pca (rank 4) and ica; ``m`` in bin 0 and
    metric ``m2`` besides."""
    roots = []
    for name, scale in (("a", 1.0), ("b", 2.0)):
        pca = {"method": "pca", "rank": 4}
        rows = [
            _cell(10, 100, "m", 0.1 * scale, **_at(1), **pca),
            _cell(10, 100, "m", 0.2 * scale, **_at(1, "attn_out"), **pca),
            _cell(10, 100, "m", 0.3 * scale, **_at(0), **pca),
            _cell(10, 100, "m", 0.4 * scale, site="foo", **pca),
            _cell(10, 100, "m", 0.5 * scale, site="foo", layer=0, **pca),
            _cell(10, 100, "m", 0.6 * scale, **_at(0), method="ica"),
            _cell(10, 100, "m", 9.0, **_at(0), freq_bin="0", **pca),
            _cell(10, 100, "m2", 7.0, **_at(0), **pca),
        ]
        roots.append(_write_run(tmp_path / name, rows, {}, n_layers=2, suite=SUITE))
    return compare(roots)


def test_a_per_method_table_lists_each_method_kind_and_depth_right_justified(tmp_path):
    """One row per (method, site kind, depth) of the metric at bin "all" (no other metric or
    bin mixed in): by method, then site kind (attention output before the residual stream
    whatever the depth), then depth with a site without a layer first; the runs' and the
    difference's columns right-justified; the title left-justified over the table."""
    table = compare_report._headline(_two_runs(tmp_path), "p", Table("m", "p: m", "m compared"))
    lines = _lines(table)
    assert lines[0] == "m compared".ljust(len(lines[1]))
    assert lines[1:] == [
        "method  site, depth          a      b    Δ b",
        "ica     resid_post 0.50  0.600  1.200  0.600",
        "pca     attn_out 1.00    0.200  0.400  0.200",
        "pca     foo              0.400  0.800  0.400",
        "pca     foo 0.50         0.500  1.000  0.500",
        "pca     resid_post 0.50  0.300  0.600  0.300",
        "pca     resid_post 1.00  0.100  0.200  0.100",
    ]


def test_a_cell_missing_from_the_table_is_a_dash(tmp_path):
    """A comparison table without b's row (and b − a's) for a cell, as a caller may filter it:
    "–" in those cells, the other cells as before."""
    comparison = _two_runs(tmp_path)
    runs, kinds = comparison.table["run"], comparison.table["site_kind"]
    dropped = pc.and_(pc.is_in(runs, pa.array(["b", "b − a"])), pc.equal(kinds, "attn_out"))
    comparison = dataclasses.replace(comparison, table=comparison.table.filter(pc.invert(dropped)))
    lines = _lines(compare_report._headline(comparison, "p", Table("m", "p: m")))
    assert lines[2:4] == [
        "ica     resid_post 0.50  0.600  1.200  0.600",
        "pca     attn_out 1.00    0.200      –      –",
    ]


def test_an_averaged_table_has_no_method_column_and_no_interval(tmp_path):
    """``per_method=False``: the methods averaged into one row per site kind and depth (block 0:
    (0.3 + 0.6) / 2), no method column, rows by depth although ica's rows come first, and no
    interval although the rows carry one (an average has none)."""
    roots = []
    for name, scale in (("a", 1.0), ("b", 2.0)):
        rows = [
            _cell(10, 100, "m", 0.6 * scale, **_at(0), method="ica", ci=(0.0, 9.0)),
            _cell(10, 100, "m", 0.8 * scale, **_at(1), method="ica", ci=(0.0, 9.0)),
            _cell(10, 100, "m", 0.3 * scale, **_at(0), method="pca", rank=4, ci=(0.0, 9.0)),
        ]
        roots.append(_write_run(tmp_path / name, rows, {}, n_layers=2, suite=SUITE))
    table = compare_report._headline(compare(roots), "p", Table("m", "p: m", per_method=False))
    lines = _lines(table)
    assert lines[0] == "p: m".ljust(len(lines[1]))
    assert lines[1:] == [
        "site, depth          a      b    Δ b",
        "resid_post 0.50  0.450  0.900  0.450",
        "resid_post 1.00  0.800  1.600  0.800",
    ]


def test_the_recipe_table_lists_each_differing_key_with_each_runs_value(tmp_path):
    """A key column, then a column per run; none when the recipes agree."""
    a = _settings_run(tmp_path / "a", _recipe(bootstrap=200), [0, 1200])
    b = _settings_run(tmp_path / "b", _recipe(bootstrap=50), [0, 1200])
    table = compare_report._recipe_table(compare([a, b]))
    lines = _lines(table)
    assert lines == [
        "recipe settings that differ".ljust(len(lines[1])),
        "key                              a    b ",
        "probes.tangent_energy.bootstrap  200  50",
    ]
    c = _settings_run(tmp_path / "c", _recipe(bootstrap=200), [0, 1200])
    assert compare_report._recipe_table(compare([a, c])) is None


def test_the_report_prints_the_header_unwrapped_then_recipe_loss_and_probe_tables(tmp_path):
    """A header line wider than the console stays one line; the recipe table, the held-out loss
    (a row about the whole model: "model") and the probe's table follow, in that order."""
    roots = []
    for name, scale in (("a", 1.0), ("b", 2.0)):
        rows = [
            row("s", 10, 100, "capture", "mean_loss", 3.0 * scale),
            _cell(10, 100, "m", 0.1 * scale, **_at(1)),
        ]
        recipe = {"name": name}
        roots.append(_write_run(tmp_path / name, rows, recipe, n_layers=2, suite=SUITE))
    console = Console(record=True, width=60)
    compare_report.render_comparison(compare(roots), console)
    lines = console.export_text().splitlines()
    assert lines[:3] == [
        "2 runs (differences against a)",
        f"• a: {roots[0]} · micro-pythia (2 blocks, decoder) · step 10, 100 tokens seen",
        f"• b: {roots[1]} · micro-pythia (2 blocks, decoder) · step 10, 100 tokens seen",
    ]
    assert lines[3] == INTERVAL_NOTE  # longer than 60 characters, on one line
    assert [line.rstrip() for line in lines[4:]] == [
        "",
        "recipe",
        "settings",
        "that",
        "differ",
        "key   a  b",
        "name  a  b",
        "",
        "held-out loss (each suite's own",
        "loss)",
        "site, depth      a      b    Δ b",
        "model        3.000  6.000  3.000",
        "",
        "p: m",
        "site, depth          a      b    Δ b",
        "resid_post 1.00  0.100  0.200  0.100",
        "",
    ]


def test_the_mean_interval_of_rows_needs_both_ends_of_every_row():
    """A row with one end of its interval missing has no interval: no mean interval."""
    rows = [{"ci_low": 0.1, "ci_high": 0.3}, {"ci_low": 0.2, "ci_high": None}]
    assert compare_report._mean_interval(rows) == (None, None)
    assert compare_report._mean_interval(rows[:1]) == (0.1, 0.3)
