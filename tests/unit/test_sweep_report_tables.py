"""What a run's report tables hold and in what order (``tangentlens.report.sweep_report``;
mutmut survivors): the held-out loss, a table's values over every token only, titles naming
both keys that vary, the methods a table averages, a probe's tables after one left out of the
report or drawn by its own renderer, and the reproduction summary of a probe the manifest
finds."""

from __future__ import annotations

import sys

import pytest

from tests.unit.test_report_order import _lines, _r, _report, _titled

USER_SOURCE = """
from dataclasses import dataclass

from rich.table import Table as RichTable

from tangentlens.findings import Finding
from tangentlens.registry import Probe
from tangentlens.reporting import Reporting, Table


@dataclass(frozen=True)
class Config:
    pass


def custom(rows):
    table = RichTable(title=f"custom table of {len(rows)} rows", min_width=30)
    table.add_column("x")
    return [table]


def findings(rows):
    return [Finding("tables claim", True, "tables evidence")]


PROBE = Probe(name="zz_tables", config=Config, scope="model_free", metrics={"m": "m"},
              rows=lambda inputs, config: [],
              reporting=Reporting(tables=(Table("m", "left out", in_report=False),
                                          Table("m", "custom", render="report_tables_probe:custom",
                                                in_compare=False),
                                          Table("m", "averaged", per_method=False),
                                          Table("m", "last")),
                                  findings=(findings,)))
"""


@pytest.fixture
def manifest(tmp_path, monkeypatch) -> dict:
    """A manifest whose probes find the researcher's probe ``zz_tables``: a table left out of
    the report, a custom one, one averaging the methods, and a plain one; one finding."""
    folder = tmp_path / "module"
    folder.mkdir()
    (folder / "report_tables_probe.py").write_text(USER_SOURCE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "report_tables_probe", raising=False)
    return {"probes": {"report_tables_probe:PROBE": {"name": "zz_tables"}}}


def test_the_held_out_loss_is_a_loss_column_of_the_capture_rows(tmp_path):
    rows = [
        _r("capture", "mean_loss", s, site="-", layer=None, value=v) for s, v in ((0, 3), (10, 2.5))
    ]
    rows.append(_r("cosine_drift", "cosine_anisotropy", 0))
    assert _lines(_report(tmp_path, rows), "held-out loss") == [
        "step loss",
        "0 (init) 3.000",
        "10 2.500",
    ]


def test_a_table_reads_the_rows_over_every_token_only(tmp_path):
    rows = [_r("cosine_drift", "cosine_anisotropy", 0, value=0.25)]
    rows.append(_r("cosine_drift", "cosine_anisotropy", 0, value=0.75, freq_bin="0"))
    text = _report(tmp_path, rows)
    assert _lines(text, "cosine anisotropy (mean pairwise cosine)") == ["step L0", "0 (init) 0.250"]


def test_a_table_per_site_kind_and_method_names_both(tmp_path):
    rows = [
        _r("zz_user", "share", 0, method=method, value=v, **cell)
        for method, v in (("pca", 0.1), ("seminmf", 0.2))
        for cell in ({}, {"site": "blocks.0.hook_mlp_out"})
    ]
    titles = [
        f"zz_user: share — {kind}, {method}"
        for kind in ("mlp_out", "resid_post")
        for method in ("pca", "seminmf")
    ]
    text = _report(tmp_path, rows)
    assert _titled(text, titles) == sorted(_titled(text, titles))
    assert _lines(text, titles[1]) == ["step L0", "0 (init) 0.200"]


def test_a_probes_tables_follow_one_left_out_and_a_custom_one(tmp_path, manifest):
    """The table left out of the report is not printed, the custom renderer's table gets the
    probe's rows, the tables after both are printed; two methods averaged are said to be."""
    rows = [_r("zz_tables", "m", 0, method=m, value=v) for m, v in (("h0", 0.2), ("h1", 0.4))]
    text = _report(tmp_path, rows, **manifest)
    titles = ["custom table of 2 rows", "averaged (mean over 2 methods)", "last — h0", "last — h1"]
    assert _titled(text, titles) == sorted(_titled(text, titles))
    assert "left out" not in text
    assert _lines(text, "averaged (mean over 2 methods)") == ["step L0", "0 (init) 0.300"]


def test_the_reproduction_summary_holds_the_findings_of_a_probe_the_manifest_finds(
    tmp_path, manifest
):
    text = _report(tmp_path, [_r("zz_tables", "m", 0)], **manifest)
    lines = [line.strip() for line in text.splitlines()]
    start = lines.index("Reproduction summary (the seed papers' qualitative findings)")
    assert lines[start + 1 :] == ["• tables claim: holds — tables evidence"]


def test_a_proxy_without_a_rank_comes_before_its_rank_1(tmp_path):
    rows = [
        _r("zz_user", "share", 0, method="pca", rank=k, value=v) for k, v in ((1, 0.1), (None, 0.2))
    ]
    text = _report(tmp_path, rows)
    titles = ["zz_user: share — pca", "zz_user: share — pca (rank 1)"]
    assert _titled(text, titles) == sorted(_titled(text, titles))
