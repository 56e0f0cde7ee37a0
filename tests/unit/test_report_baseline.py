"""The step-0 baseline in the console report and the reproduction summary: each headline
metric's value at initialisation beside the later steps, and one line when a run has no step 0."""

from __future__ import annotations

import doctest
import re
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console

from tangentlens.report import baseline
from tangentlens.report.reproduction import reproduction_summary
from tangentlens.report.sweep_report import render_report
from tangentlens.results import SCHEMA, row

STEPS = (0, 10, 100, 1000)
NO_BASELINE = (
    "no step-0 baseline in this run (first step 10): nothing is compared with initialisation"
)

#: energy_ratio (bin "all", deepest layer 2) per method and step: 2.3 at step 0, as mini-pythia
RATIOS = {
    "pca": (2.30, 2.10, 1.60, 1.20),
    "seminmf": (2.32, 2.36, 1.70, 1.00),
    "mean_direction": (5.00, 4.00, 2.00, 0.50),
}
#: centred anisotropy per step and layer 0, 1, 2 (a bell only at the last step)
CENTRED = {0: (0.05, 0.06, 0.07), 10: (0.1, 0.2, 0.3), 100: (0.1, 0.3, 0.3), 1000: (0.1, 0.3, 0.2)}
TWONN = {0: 10.0, 10: 20.0, 100: 16.0, 1000: 12.0}
SPEARMAN = {0: (0.04, 0.08), 10: (0.0, 0.0), 100: (-0.1, -0.2), 1000: (-0.3, -0.5)}


def _row(step: int, probe: str, metric: str, value: float, **cell: Any) -> dict[str, Any]:
    layer = cell.pop("layer", 2)
    site = f"blocks.{layer}.hook_resid_post"
    return row(
        "mini-pythia", step, step * 2048, probe, metric, value, site=site, layer=layer, **cell
    )


def _energy(step: int, i: int) -> list[dict[str, Any]]:
    """The energy rows, each ratio with the interval ± 0.05."""
    out = []
    for method, ratios in RATIOS.items():
        cell = {"method": method, "rank": 1 if method == "mean_direction" else 16}
        ci = (ratios[i] - 0.05, ratios[i] + 0.05)
        out += [
            _row(step, "tangent_energy", "energy_ratio", ratios[i], ci=ci, **cell),
            _row(step, "tangent_energy", "energy_p_value", 0.0099 if i == 0 else 0.5, **cell),
            # a metric the report does not know: ignored, not an error
            _row(step, "tangent_energy", "energy_complement_ratio", 9.0, **cell),
        ]
    return out


def _rows(steps: tuple[int, ...] = STEPS) -> list[dict[str, Any]]:
    out = []
    for i, step in enumerate(STEPS):
        if step not in steps:
            continue
        out += _energy(step, i)
        for layer in range(3):
            out.append(
                _row(
                    step,
                    "shape_of_learning",
                    "centred_anisotropy",
                    CENTRED[step][layer],
                    layer=layer,
                )
            )
            out.append(_row(step, "shape_of_learning", "twonn_dimension", TWONN[step], layer=layer))
        for layer in range(2):
            out.append(
                _row(
                    step,
                    "frequency_geometry",
                    "freq_distance_pearson",
                    SPEARMAN[step][layer],
                    layer=layer,
                )
            )
    # a model-free probe (step -1) is not a checkpoint
    out.append(_row(-1, "untrained_block", "norm_ratio", 1.0, method="N=0", layer=None))
    return out


def _report(tmp_path, rows: list[dict[str, Any]]) -> str:
    (tmp_path / "results").mkdir()
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), tmp_path / "results" / "part.parquet")
    console = Console(record=True, width=100)
    render_report(tmp_path, console)
    return console.export_text()


def _table(text: str, title: str) -> list[str]:
    """The lines of the table titled ``title`` (header line first), blanks stripped."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    end = lines.index("", start)
    return [re.sub(r"\s+", " ", line.strip()) for line in lines[start + 1 : end]]


def test_findings_give_the_step_0_value_beside_the_later_steps():
    bell, rise, energy, frequency = (f.evidence for f in reproduction_summary(_rows()))
    assert bell == (
        "at step 1000: L0 0.100, L1 0.300, L2 0.200; peak at L1; "
        "baseline step 0 (init): L0 0.050, L1 0.060, L2 0.070"
    )
    assert rise == (
        "by step — 0 (init): 10.0, 10: 20.0, 100: 16.0, 1000: 12.0; baseline step 0 (init); "
        "peak at step 10"
    )
    assert energy == (
        "early steps (≤ 30% of the 2,048,000 tokens seen by step 1000) 10: 2.23 [2.18, 2.28], "
        "100: 1.65 [1.60, 1.70], mean 1.94 [1.89, 1.99]; at step 1000: 1.10 [1.05, 1.15]; "
        "baseline step 0 (init): 2.31 [2.26, 2.36]; early − baseline -10.3 sd, early − late "
        "+23.3 sd; mean over the same 2 (method, layer, site) at every compared step "
        "(mean direction m̂, rank 1: 5.00 at step 0 (init), 0.50 at step 1000)"
    )
    assert frequency == (
        "no shuffle null at step 1000 (freq_distance_pearson_null_mean/_std: "
        "frequency_geometry.null_draws = 0, no reservoir, or too few sampled rows)"
    )


def test_findings_without_step_0_read_the_earliest_step_as_their_baseline():
    rows = _rows(steps=(10, 100, 1000))
    bell, rise, energy, _ = (f.evidence for f in reproduction_summary(rows))
    earliest = "baseline step 10 (the earliest scored: no step 0)"
    assert bell == (
        f"at step 1000: L0 0.100, L1 0.300, L2 0.200; peak at L1; {earliest}: L0 0.100, "
        "L1 0.200, L2 0.300"
    )
    assert rise == f"by step — 10: 20.0, 100: 16.0, 1000: 12.0; {earliest}; peak at step 100"
    assert energy.startswith(
        "early steps (≤ 30% of the 2,048,000 tokens seen by step 1000) 100: 1.65 [1.60, 1.70], "
        f"mean 1.65 [1.60, 1.70]; at step 1000: 1.10 [1.05, 1.15]; {earliest}: 2.23 [2.18, 2.28]"
    )
    assert energy.endswith("(mean direction m̂, rank 1: 4.00 at step 10, 0.50 at step 1000)")
    assert baseline.baseline_notice(rows) == NO_BASELINE
    assert baseline.baseline_notice(_rows()) is None
    assert baseline.baseline_notice([]) is None


def test_a_run_of_step_0_alone_is_not_testable():
    (bell, *_) = reproduction_summary(_rows(steps=(0,)))
    assert bell.holds is None and bell.evidence.startswith("1 scored step with this metric (0)")


def test_report_tables_label_the_step_0_row_init_above_the_later_steps(tmp_path):
    text = _report(tmp_path, _rows())
    assert "no step-0 baseline" not in text
    title = "energy ratio [95 % CI], p-value vs the exchangeable controls — pca, "
    assert _table(text, title + "blocks.2.hook_resid_post") == [
        "step all",
        "0 (init) 2.300 p0.010",
        "[2.250, 2.350]",
        "10 2.100 p0.500",
        "[2.050, 2.150]",
        "100 1.600 p0.500",
        "[1.550, 1.650]",
        "1000 1.200 p0.500",
        "[1.150, 1.250]",
    ]
    assert _table(text, "centred anisotropy")[:3] == [
        "step L0 L1 L2",
        "0 (init) 0.050 0.060 0.070",
        "10 0.100 0.200 0.300",
    ]
    assert "baseline step 0 (init): 2.31 [2.26, 2.36]" in text.replace("\n", " ")


def test_report_without_step_0_says_so_in_one_line(tmp_path):
    text = _report(tmp_path, _rows(steps=(10, 100, 1000)))
    assert text.splitlines()[0] == NO_BASELINE
    assert text.count("no step-0 baseline") == 1
    assert "(init)" not in text
    assert _table(text, "TwoNN intrinsic dimension")[1] == "10 20.000 20.000 20.000"


def test_baseline_doctests():
    assert doctest.testmod(baseline).failed == 0


def test_two_sites_at_the_deepest_layer_get_a_table_each_titled_by_site(tmp_path):
    """resid_post and mlp_out captured at every block: the energy tables name their site and
    show its own ratio and p (one table used to show one site's under a title naming none)."""
    rows = []
    for step, (resid, mlp) in {0: (2.0, 0.9), 10: (3.0, 1.1)}.items():
        for site, ratio, p in (
            ("blocks.2.hook_resid_post", resid, 0.01),
            ("blocks.2.hook_mlp_out", mlp, 0.4),
        ):
            cell = {"site": site, "layer": 2, "method": "pca", "rank": 16}
            rows += [
                row("s", step, step, "tangent_energy", "energy_ratio", ratio, **cell),
                row("s", step, step, "tangent_energy", "energy_p_value", p, **cell),
            ]
    text = _report(tmp_path, rows)
    title = "energy ratio [95 % CI], p-value vs the exchangeable controls — pca, "
    assert _table(text, title + "blocks.2.hook_resid_post") == [
        "step all",
        "0 (init) 2.000 p0.010",
        "10 3.000 p0.010",
    ]
    assert _table(text, title + "blocks.2.hook_mlp_out") == [
        "step all",
        "0 (init) 0.900 p0.400",
        "10 1.100 p0.400",
    ]
