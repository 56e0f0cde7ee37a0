"""The sweep's cost model: unit timings, their medians, and the predicted wall time."""

import dataclasses
import json
import math

import pytest

from tangentlens.core.recipe import load_recipe
from tangentlens.core.resolve import resolve
from tangentlens.models.facts import suite_facts
from tangentlens.sweep.plan import make_plan
from tangentlens.sweep.timing import (
    TIMINGS_DIR,
    SweepCost,
    plan_counts,
    plan_time_line,
    predicted_seconds,
    read_unit_times,
    sweep_cost,
    time_line,
    timing_record,
)

#: data 1 s, windows 2 s, fit 3 s, steps 10 s, across 0.5 s, the model-free unit 4 s.
COST = SweepCost(
    {"data": 1.0, "window": 2.0, "fit": 3.0, "step": 10.0, "across": 0.5, "model_free": 4.0},
    {"data": 1, "window": 8, "fit": 1, "step": 1, "across": 1, "model_free": 1},
)
PLAN = {"data": 1, "window": 8, "fit": 1, "step": 5, "across": 1, "model_free": 1}


def test_predicted_seconds_is_the_critical_path_at_each_parallelism():
    assert predicted_seconds(COST, PLAN, 1) == 1 + 8 * 2 + 3 + 5 * 10 + 0.5 + 4  # 74.5
    assert predicted_seconds(COST, PLAN, 2) == 1 + 4 * 2 + 3 + 3 * 10 + 0.5  # 42.5
    assert predicted_seconds(COST, PLAN, 3) == 1 + 3 * 2 + 3 + 2 * 10 + 0.5  # 30.5
    assert predicted_seconds(COST, PLAN, None) == 1 + 2 + 3 + 10 + 0.5  # 16.5
    # a plan without a fit window (per-checkpoint proxies) pays no window or fit
    assert predicted_seconds(COST, {"data": 1, "step": 5, "across": 1}, 1) == 51.5
    assert COST.fixed == 1 + 16 + 3 + 4


def test_a_kind_never_timed_gives_no_prediction_and_bad_counts_are_refused():
    no_window = SweepCost({"data": 1.0, "step": 10.0}, {"data": 1, "step": 1})
    assert predicted_seconds(no_window, PLAN, 1) is None
    assert predicted_seconds(no_window, {"data": 1, "step": 3}, 1) == 31.0
    with pytest.raises(ValueError, match="parallel must be ≥ 1 or None, got 0"):
        predicted_seconds(COST, PLAN, 0)
    with pytest.raises(ValueError, match="unit counts must be ≥ 0"):
        predicted_seconds(COST, {"step": -1}, 1)


def test_sweep_cost_takes_each_kinds_median_from_the_records(tmp_path):
    folder = tmp_path / TIMINGS_DIR
    folder.mkdir()
    for name, kind, seconds in [
        ("data", "data", 1.0),
        ("window-0", "window", 2.0),
        ("window-1", "window", 3.0),
        ("window-2", "window", 10.0),
        ("step-1", "step", 5.0),
        ("step-2", "step", 7.0),
    ]:
        (folder / f"{name}.json").write_text(timing_record(kind, None, seconds, "host"))
    (folder / "broken.json").write_text("{not json")
    (folder / "no-seconds.json").write_text(json.dumps({"kind": "step"}))
    times = read_unit_times(tmp_path)
    assert set(times) == {"data", "window-0", "window-1", "window-2", "step-1", "step-2"}
    cost = sweep_cost(times)
    assert cost.seconds == {"data": 1.0, "window": 3.0, "step": 6.0}
    assert cost.counts == {"data": 1, "window": 3, "step": 2}
    assert cost.fixed == 1.0 + 3 * 3.0 and cost.step == 6.0
    assert read_unit_times(tmp_path / "missing") == {}


def test_the_report_line_and_the_plan_line(tmp_path):
    time = {
        "units": COST.to_dict(),
        "parallel": 1,
        "steps": 5,
        "suite_steps": 20,
        "predicted_seconds": 74.5,
        "predicted_suite_seconds": predicted_seconds(COST, {**PLAN, "step": 20}, 1),
        "wall_seconds": 80.2,
    }
    line = time_line(time, resumed=False)
    assert line == (
        "time (1 unit(s) at once): fixed 24 s (8 window captures of 2.0 s); a step 10.0 s; "
        "predicted 74 s for 5 step(s), measured 80 s; all 20 checkpoints: predicted 224 s"
    )
    assert "resumed: not comparable" in time_line(time, resumed=True)

    recipe = load_recipe("quickstart", ['suite.steps="0,100,1200"'])
    steps = (0, 1, 2, 4, 8, 16, 32, 64, 100, 200, 300, 400, 1200)
    facts = dataclasses.replace(suite_facts("mini-pythia"), steps=steps)
    plan = make_plan(resolve(recipe, facts))
    counts = plan_counts(plan)
    assert counts["step"] == 3 and counts["window"] >= 1
    timed = tmp_path / "one-step"
    (timed / TIMINGS_DIR).mkdir(parents=True)
    for kind, seconds in COST.seconds.items():
        (timed / TIMINGS_DIR / f"{kind}.json").write_text(timing_record(kind, 0, seconds, "h"))
    expected = predicted_seconds(COST, counts, 1)
    assert math.isfinite(expected)
    line = plan_time_line(plan, recipe, timed, None)
    assert line.endswith(f"predicted {expected:.0f} s for 3 step(s)")
    assert "fixed 10 s, a step 10.0 s" in line  # one timed unit of each kind here
    assert "no finished step unit" in plan_time_line(plan, recipe, tmp_path / "empty", None)


def test_an_earlier_runs_model_free_timing_is_read_under_its_current_kind():
    """Runs written before the model-free units were named by their probes timed one unit of
    kind ``untrained``: read as ``model_free``, so their timings still predict a sweep."""
    cost = sweep_cost({"untrained-block": {"kind": "untrained", "seconds": 4.0}})
    assert cost.seconds == {"model_free": 4.0} and cost.counts == {"model_free": 1}
