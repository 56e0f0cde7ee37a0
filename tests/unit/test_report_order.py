"""The order in which a report shows its probes, tables, columns and rows (issue: mutants that
reversed or dropped an ordering survived): rows given in a non-sorted registration order, read
back in the order the report and the comparison print them."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rich.console import Console

from tangentlens.report.declared import reported_probes
from tangentlens.report.reproduction import reproduction_summary
from tangentlens.report.sweep_report import render_report
from tangentlens.results import SCHEMA, row
from tangentlens.sweep.store import RunStore

USER_SOURCE = """
from dataclasses import dataclass

from tangentlens.findings import Finding
from tangentlens.registry import Probe
from tangentlens.reporting import Reporting, Table


@dataclass(frozen=True)
class Config:
    pass


def findings(rows):
    return [Finding("user claim", True, "e")]


PROBE = Probe(name="zz_resolved", config=Config, scope="model_free", metrics={"m": "m", "avg": "a"},
              rows=lambda inputs, config: [],
              reporting=Reporting(tables=(Table("m", "zz resolved table"),
                                          Table("avg", "averaged", per_method=False)),
                                  findings=(findings,)))
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch) -> str:
    """A researcher's resolvable probe ``zz_resolved`` (scope model_free), by import path."""
    (tmp_path / "order_user_probe.py").write_text(USER_SOURCE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "order_user_probe", raising=False)
    return "order_user_probe:PROBE"


def _r(probe: str, metric: str, step: int = 0, **cell: Any) -> dict[str, Any]:
    layer = cell.pop("layer", 0)
    site = cell.pop("site", f"blocks.{layer}.hook_resid_post")
    value = cell.pop("value", 1.0)
    return row("s", step, step, probe, metric, value, site=site, layer=layer, **cell)


# ------------------------------------------------------------------- report/declared.py


def test_probes_are_reported_built_in_first_by_scope_then_name(user_module):
    """Registration order scrambled: built-in probes by scope (step, tangent, across,
    model_free) and name, then the researcher's (resolved by scope, then the unresolved ones),
    the core's rows (capture, proxy_fit) never."""
    rows = [
        _r("untrained_block", "m"),
        _r("update_alignment", "m"),
        _r("zz_user", "m"),
        _r("cosine_drift", "cosine_anisotropy"),
        _r("capture", "mean_loss"),
        _r("proxy_fit", "explained_variance"),
        _r("zz_resolved", "m"),
        _r("tangent_energy", "energy_ratio"),
        _r("shape_of_learning", "centred_anisotropy"),
        _r("aa_user", "m"),
    ]
    manifest = {"probes": {user_module: {"name": "zz_resolved"}}}
    assert [p.name for p in reported_probes(rows, [manifest])] == [
        "cosine_drift",
        "shape_of_learning",
        "tangent_energy",
        "update_alignment",
        "untrained_block",
        "zz_resolved",  # a researcher's probe the registry finds: its scope, model_free (3)
        "aa_user",  # not found: after every scope
        "zz_user",
    ]


def test_an_unresolved_probe_gets_a_default_table_per_metric_sorted():
    rows = [_r("aa_user", "b_metric"), _r("aa_user", "a_metric"), _r("aa_user", "b_metric")]
    (probe,) = reported_probes(rows, [])
    assert [t.title for t in probe.tables] == ["aa_user: a_metric", "aa_user: b_metric"]
    assert [f.metric for f in probe.figures] == ["a_metric", "b_metric"]
    assert probe.findings == ()


def test_the_first_manifest_that_names_a_probe_says_which_key_found_it(user_module):
    rows = [_r("zz_resolved", "m")]
    found = {"probes": {user_module: {"name": "zz_resolved"}}}
    gone = {"probes": {"gone_pkg_order:PROBE": {"name": "zz_resolved"}}}
    (probe,) = reported_probes(rows, [found, gone])
    assert [t.title for t in probe.tables] == ["zz resolved table", "averaged"]
    assert len(probe.findings) == 1
    (probe,) = reported_probes(rows, [gone, found])
    assert [t.title for t in probe.tables] == ["zz_resolved: m"]  # the default


def test_a_key_that_finds_a_probe_of_another_name_is_not_that_probe():
    """Rows of ``renamed`` whose recipe key resolves to cosine_drift: the defaults, last."""
    rows = [_r("renamed", "cosine_anisotropy"), _r("shape_of_learning", "centred_anisotropy")]
    manifest = {"probes": {"cosine_drift": {"name": "renamed"}}}
    renamed = reported_probes(rows, [manifest])
    assert [p.name for p in renamed] == ["shape_of_learning", "renamed"]
    assert [t.title for t in renamed[1].tables] == ["renamed: cosine_anisotropy"]
    # a manifest entry that is not a table names the probe by its key
    plain = reported_probes([_r("cosine_drift", "cosine_anisotropy")], [{"probes": {"x": 1}}])
    assert plain[0].tables[0].title == "cosine anisotropy (mean pairwise cosine)"


def test_the_reproduction_summary_follows_the_report_order(user_module):
    rows = [_r("zz_resolved", "m")]
    rows += [
        _r("shape_of_learning", "twonn_dimension", s, value=v)
        for s, v in {0: 10.0, 10: 20.0, 100: 12.0}.items()
    ]
    manifest = {"probes": {user_module: {"name": "zz_resolved"}}}
    assert [f.claim.split(" (")[0] for f in reproduction_summary(rows, [manifest])] == [
        "intrinsic dimension rises early, then falls",
        "user claim",
    ]


# --------------------------------------------------------------- report/sweep_report.py


def _report(tmp_path: Path, rows: list[dict[str, Any]], **manifest: Any) -> str:
    (tmp_path / "results").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), tmp_path / "results" / "p.parquet")
    if manifest:
        RunStore(tmp_path).write_manifest(manifest)
    console = Console(record=True, width=160)
    render_report(tmp_path, console)
    return console.export_text()


def _titled(text: str, titles: list[str]) -> list[int]:
    """The line number of each title (each must be there once)."""
    lines = [line.strip() for line in text.splitlines()]
    assert all(lines.count(t) == 1 for t in titles), titles
    return [lines.index(t) for t in titles]


def _lines(text: str, title: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index(next(line for line in lines if line.strip() == title))
    end = lines.index("", start)
    return [re.sub(r"\s+", " ", line.strip()) for line in lines[start + 1 : end]]


def test_report_tables_follow_the_probe_order_and_columns_the_depth(tmp_path):
    rows = [
        _r("zz_user", "m", value=0.5),
        _r("aa_user", "m", value=0.25),
        *[
            _r("cosine_drift", "cosine_anisotropy", s, layer=k, value=0.1 * k + s / 100)
            for s in (10, 0)
            for k in (2, 0, 1)
        ],
        _r("cosine_drift", "cosine_anisotropy", 10, site="hook_embed", layer=None, value=0.05),
        _r("cosine_drift", "cosine_anisotropy", 10, site="-", layer=None, value=0.75),
        _r("capture", "mean_loss", 10, site="-", layer=None, value=3.0),
    ]
    text = _report(tmp_path, rows)
    titles = ["held-out loss", "cosine anisotropy (mean pairwise cosine)", "aa_user: m"]
    titles.append("zz_user: m")
    assert _titled(text, titles) == sorted(_titled(text, titles))
    assert _lines(text, titles[1]) == [
        "step emb - L0 L1 L2",  # the embedding, the model's rows, then the blocks in order
        "0 (init) – – 0.000 0.100 0.200",
        "10 0.050 0.750 0.100 0.200 0.300",
    ]


def test_a_per_method_table_splits_by_method_and_rank_in_order(tmp_path):
    rows = [
        _r("top_sv", "share", method=m, rank=k, value=v)
        for m, k, v in [("seminmf", 8, 0.3), ("pca", 8, 0.2), ("pca", None, 0.1)]
    ]
    text = _report(tmp_path, rows)
    titles = ["top_sv: share — pca", "top_sv: share — pca (rank 8)", "top_sv: share — seminmf"]
    titles[2] += " (rank 8)"
    assert _titled(text, titles) == sorted(_titled(text, titles))
    assert _lines(text, titles[0]) == ["step L0", "0 (init) 0.100"]
    # one method: no split, no "mean over"
    one = _report(tmp_path / "one", [_r("top_sv", "share", method="pca", rank=8)])
    assert _titled(one, ["top_sv: share"]) and "mean over" not in one


def test_a_table_that_averages_the_methods_says_how_many(tmp_path, user_module):
    manifest = {"probes": {user_module: {"name": "zz_resolved"}}}
    rows = [
        _r("zz_resolved", "avg", method=m, value=v)
        for m, v in (("h0", 0.2), ("h1", 0.4), ("h2", 0.6))
    ]
    text = _report(tmp_path, rows, **manifest)
    assert _lines(text, "averaged (mean over 3 methods)") == ["step L0", "0 (init) 0.400"]
    one = _report(tmp_path / "one", rows[:1], **manifest)
    assert _lines(one, "averaged") == ["step L0", "0 (init) 0.200"]
    # a title that says so already is not told twice
    heads = [_r("qk_drift", "qk_cosine", method=m) for m in ("h0", "h1")]
    said = _report(tmp_path / "qk", heads)
    assert "cos(m_Q, m_K), mean over heads" in said and "methods)" not in said


def test_the_report_header_says_what_the_manifest_records(tmp_path):
    rows = [_r("cosine_drift", "cosine_anisotropy", s) for s in (10, 20)]
    manifest = {
        "fit_window": [10, 15],
        "integrity": {"duplicates": [[10, 20]], "not_checked": [30, 40]},
        "memory_plan": {"summary": "plan", "budgets": {"accelerator": 2 * 1024**3, "host": 0}},
    }
    text = _report(tmp_path, rows, **manifest)
    lines = [line.strip() for line in text.splitlines()]
    assert lines[:5] == [
        "no step-0 baseline in this run (first step 10): nothing is compared with initialisation",
        "frozen-early proxies fitted on checkpoints 10, 15; update alignment of transitions "
        "starting before step 15 is reported as *_in_window_*",
        "identical checkpoints: steps 10 and 20 have the same weights (the suite served one "
        "checkpoint twice); their rows measure the same model",
        "weights not on this machine, not checked for duplicates: 30, 40",
        "plan; checked against accelerator 2.0 GiB",
    ]
    unchecked = _report(
        tmp_path / "b", rows, memory_plan={"summary": "plan", "budgets": {"host": 0}}
    )
    assert "plan; not checked" in unchecked


def test_each_site_kinds_table_carries_the_embedding_and_skips_unknown_values(tmp_path):
    rows = [
        _r("cosine_drift", "cosine_anisotropy", site="hook_embed", layer=None, value=0.05),
        _r("cosine_drift", "cosine_anisotropy", site="blocks.0.hook_mlp_out", value=0.5),
        _r("cosine_drift", "cosine_anisotropy", value=0.25),
        _r("cosine_drift", "cosine_anisotropy", value=float("nan")),  # a second L0 row
        _r("cosine_drift", "cosine_anisotropy", layer=1, value=float("nan")),
    ]
    text = _report(tmp_path, rows)
    title = "cosine anisotropy (mean pairwise cosine)"
    assert _lines(text, f"{title} — mlp_out") == ["step emb L0", "0 (init) 0.050 0.500"]
    assert _lines(text, f"{title} — resid_post") == ["step emb L0 L1", "0 (init) 0.050 0.250 –"]
