"""The GPU benchmark in parts: their order, the time budget that skips what does not fit (and
says so), and rows written to the JSON-lines file the moment they are reported."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

# the repository's benchmarks/ (not in `make mutate`'s staging copy, which holds src and tests)
pytest.importorskip("benchmarks._parts")
from benchmarks._parts import H100_SECONDS, Budget, Part, ordered_parts
from benchmarks._rows import RowSink, describe, skipped_row


def test_parts_run_model_by_model_capture_at_160m_first():
    parts = ordered_parts(None, None, "cuda")
    assert [(p.name, p.model) for p in parts[:2]] == [
        ("capture", "pythia-160m"),
        ("step", "pythia-160m"),
    ]
    assert [p.name for p in parts] == ["capture", "step", "memory", "suite"] * 2
    assert {p.shape for p in parts} == {"pythia-160m", "pythia-1b"}
    chosen = ordered_parts(("suite", "capture"), ("pythia-1b",), "cuda")
    assert [(p.name, p.model) for p in chosen] == [("capture", "pythia-1b"), ("suite", "pythia-1b")]


def test_on_the_cpu_the_smallest_shape_runs_once_and_names_itself():
    parts = ordered_parts(None, None, "cpu")
    assert [p.label for p in parts] == [
        "capture pythia-14m",
        "step pythia-14m",
        "memory pythia-14m",
        "suite pythia-14m",
    ]


def test_unknown_parts_and_models_name_the_allowed_ones():
    with pytest.raises(ValueError, match=r"unknown part\(s\) \['steps'\]; allowed: \['capture'"):
        ordered_parts(("steps",), None, "cuda")
    with pytest.raises(ValueError, match=r"allowed: \['pythia-160m', 'pythia-1b'\]"):
        ordered_parts(None, ("pythia-70m",), "cuda")


def test_the_budget_scales_the_estimates_by_the_first_part_and_skips_what_does_not_fit():
    capture, step = Part("capture", "pythia-160m", "x"), Part("step", "pythia-160m", "x")
    budget = Budget(100.0)
    assert budget.refusal(capture, reused=False) is None  # 45 s estimated, 100 s left
    budget.record(capture, reused=False, seconds=22.5)  # twice as fast as estimated
    assert budget.estimate(step, reused=False) == H100_SECONDS[("step", "pythia-160m")] / 2
    refusal = budget.refusal(step, reused=False)  # 100 s estimated, 77.5 s left
    assert refusal == "estimated 100 s, 78 s of --budget-s left"
    memory = Part("memory", "pythia-160m", "x")
    assert budget.refusal(memory, reused=True) is None  # reads the step's sweep: free
    assert Budget(None).refusal(step, reused=False) is None


def test_each_row_is_appended_to_the_file_as_it_is_reported(tmp_path):
    path = tmp_path / "rows.jsonl"
    sink = RowSink(Console(file=io.StringIO()), path, "cpu")
    row = {
        "benchmark": "capture 2 sites",
        "shape": "pythia-14m 2×8×256 cpu fp32",
        "reference_name": "training fwd+bwd",
        "ours_s": 1.5,
        "reference_s": 3.0,
        "goal": "≤ 0.85×",
    }
    sink(row)
    first = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(first) == 1 and first[0]["ours_s"] == 1.5 and first[0]["device"] == "cpu"
    sink(skipped_row("part step pythia-1b", "estimated 300 s, 10 s of --budget-s left"))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["benchmark"] for r in lines] == ["capture 2 sites", "part step pythia-1b"]
    assert describe(row).endswith("= 0.5 ×; goal ≤ 0.85×")
    assert describe(lines[1]).endswith("skipped — estimated 300 s, 10 s of --budget-s left")
