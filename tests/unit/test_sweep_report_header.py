"""The lines above a run's report tables (``tangentlens.report.sweep_report``; mutmut
survivors): exactly what the manifest records — the fit window's last checkpoint, the memory
budgets in GiB, the run's time against its prediction (resumed or not) — and nothing for a run
with step 0 and an empty manifest; a header line is never wrapped."""

from __future__ import annotations

from rich.console import Console

from tangentlens.report.sweep_report import render_report
from tests.unit.test_report_order import _r, _report

GIB = 1024**3
#: a run's time as :func:`tangentlens.sweep.timing.time_line` reads it
TIME = {
    "units": {"fixed": 12.0, "seconds": {"step": 2.5}, "counts": {}},
    "predicted_seconds": 30.0,
    "steps": 4,
    "wall_seconds": 33.0,
    "parallel": 2,
}


def _header(text: str) -> list[str]:
    """The report's lines before its first blank line."""
    lines = [line.strip() for line in text.splitlines()]
    return lines[: lines.index("")]


def test_a_run_with_step_0_and_an_empty_manifest_has_no_header(tmp_path):
    text = _report(tmp_path, [_r("cosine_drift", "cosine_anisotropy", 0)])
    assert text.splitlines()[0].strip() == "cosine anisotropy (mean pairwise cosine)"


def test_the_header_reads_the_window_budgets_and_time(tmp_path):
    """A three-checkpoint window ends at its last; both budgets are shown, in GiB to 0.1; the
    time line measures a run not resumed (the manifest says nothing of resuming)."""
    manifest = {
        "fit_window": [0, 10, 20],
        "memory_plan": {"summary": "plan", "budgets": {"accelerator": 24 * GIB, "host": 64 * GIB}},
        "time": TIME,
    }
    text = _report(tmp_path, [_r("cosine_drift", "cosine_anisotropy", 0)], **manifest)
    assert _header(text) == [
        "frozen-early proxies fitted on checkpoints 0, 10, 20; update alignment of transitions "
        "starting before step 20 is reported as *_in_window_*",
        "plan; checked against accelerator 24.0 GiB, host 64.0 GiB",
        "time (2 unit(s) at once): fixed 12 s; a step 2.5 s; predicted 30 s for 4 step(s), "
        "measured 33 s",
    ]


def test_a_resumed_runs_time_is_not_compared_and_a_plan_without_budgets_not_checked(tmp_path):
    manifest = {"memory_plan": {"summary": "plan"}, "time": TIME, "resumed": True}
    text = _report(tmp_path, [_r("cosine_drift", "cosine_anisotropy", 0)], **manifest)
    assert _header(text) == [
        "plan; not checked",
        "time (2 unit(s) at once): fixed 12 s; a step 2.5 s; predicted 30 s for 4 step(s), "
        "resumed: not comparable",
    ]


def test_a_header_line_is_not_wrapped_on_a_narrow_console(tmp_path):
    manifest = {"fit_window": [0, 10]}
    _report(tmp_path, [_r("cosine_drift", "cosine_anisotropy", 0)], **manifest)  # the run
    console = Console(record=True, width=60)
    render_report(tmp_path, console)
    assert console.export_text().splitlines()[0] == (
        "frozen-early proxies fitted on checkpoints 0, 10; update alignment of transitions "
        "starting before step 10 is reported as *_in_window_*"
    )
