"""Stored bootstrap replicates and the intervals they give ``compare``'s differences: the kept
replicates are the ones the interval came from (their percentiles are its bounds), the records
round-trip through a run directory, identical runs give a zero-width interval around 0 (null),
and a planted log-ratio shift is recovered with the closed-form spread (planted)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from tangentlens.comparison import compare
from tangentlens.comparison.table import _difference_interval
from tangentlens.metrics import bootstrap_ratio
from tangentlens.probes.tangent_energy import TangentEnergyConfig
from tangentlens.results import REPLICATE_FIELDS, replicate_record, row
from tangentlens.sweep.store import RunStore, read_replicates
from tests.unit.test_bootstrap_studentized import order_statistic

R = 400


def _sums(seed: int, groups: int = 60) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    den = rng.uniform(1.0, 2.0, groups)
    return 0.3 * den + rng.normal(0, 0.05, groups), den


def test_kept_replicates_are_the_ones_the_percentile_interval_came_from():
    num, den = _sums(0)
    result = bootstrap_ratio(num, den, replicates=R, keep_replicates=True)
    kept = result.replicate_values
    assert kept.shape == (R,) and np.isfinite(kept).all()
    low, high = order_statistic(kept, 0.025), order_statistic(kept, 0.975)
    assert (result.ci_low, result.ci_high) == pytest.approx((low, high), rel=1e-12)
    # the same seed gives the same replicates, with or without keeping them
    again = bootstrap_ratio(num, den, replicates=R)
    assert again.replicate_values is None and again.ci_low == result.ci_low


def test_kept_replicates_are_rescaled_onto_the_reported_value_and_clipped():
    num, den = _sums(1)
    raw = bootstrap_ratio(num, den, replicates=R, keep_replicates=True).replicate_values
    point = float(num.sum() / den.sum())
    moved = bootstrap_ratio(num, den, replicates=R, centre=2 * point, keep_replicates=True)
    np.testing.assert_allclose(moved.replicate_values, 2 * raw, rtol=1e-12)
    clipped = bootstrap_ratio(
        num, den, replicates=R, centre=0.999, bounds=(0.0, 1.0), keep_replicates=True
    )
    assert clipped.replicate_values.max() == 1.0  # rescaled past 1, then clipped


def test_a_replicate_without_a_denominator_is_nan_and_keeps_its_index():
    num = np.array([1.0, 0.0, 0.0])
    den = np.array([1.0, 0.0, 0.0])  # a replicate drawing only groups 2 and 3 has no ratio
    kept = bootstrap_ratio(num, den, replicates=R, keep_replicates=True).replicate_values
    assert kept.shape == (R,) and np.isnan(kept).any() and np.nanmax(kept) == 1.0


def test_identical_replicates_give_a_zero_interval_around_zero():
    values = np.exp(np.random.default_rng(2).normal(0, 0.1, R))
    assert _difference_interval(True, 0.0, values, values.copy()) == (0.0, 0.0)
    assert _difference_interval(False, 0.0, values, values.copy()) == (0.0, 0.0)


def test_a_planted_log_ratio_shift_is_recovered_with_its_closed_form_spread():
    rng = np.random.default_rng(3)
    n, sigma, shift = 20_000, 0.1, 0.3
    first = np.exp(rng.normal(0, sigma, n))
    later = np.exp(rng.normal(shift, sigma, n))  # independent runs
    low, high = _difference_interval(True, shift, first, later)
    half = 1.959964 * sigma * math.sqrt(2)
    assert low == pytest.approx(shift - half, abs=0.01)
    assert high == pytest.approx(shift + half, abs=0.01)
    # a plain difference for a non-ratio metric, shifted by 0.05
    low, high = _difference_interval(False, 0.05, first, first + 0.05)
    assert (low, high) == pytest.approx((0.05, 0.05), abs=1e-12)


def test_replicates_are_paired_by_index_before_undefined_ones_are_dropped():
    """Replicate i of one run goes with replicate i of the other; a replicate undefined in
    either run (NaN: its denominators summed to zero) drops the pair. Every defined pair below
    moves by exactly ln e = 1; dropping each run's NaNs first would pair replicates across
    indices (differences 1, 0, 0, 1)."""
    e = math.e
    first = np.array([1.0, np.nan, e, e**2, e**3])
    later = np.array([e, e, e**2, np.nan, e**4])
    assert _difference_interval(True, 1.0, first, later) == (1.0, 1.0)
    assert _difference_interval(False, 0.5, first, first + 0.5) == (0.5, 0.5)


def test_the_interval_contains_the_difference_and_needs_both_runs_replicates():
    values = np.full(R, 2.0)
    low, high = _difference_interval(True, 0.4, values, values)  # replicates say 0
    assert (low, high) == (0.0, 0.4)
    assert _difference_interval(True, 0.4, values, None) == (None, None)
    assert _difference_interval(True, math.nan, values, values) == (None, None)


def test_keep_replicates_is_a_checked_opt_in():
    assert TangentEnergyConfig().keep_replicates is False
    assert TangentEnergyConfig(keep_replicates=True).to_table()["keep_replicates"] is True
    with pytest.raises(ValueError, match="keep_replicates must be true or false"):
        TangentEnergyConfig(keep_replicates="yes")
    with pytest.raises(ValueError, match="set bootstrap > 0"):
        TangentEnergyConfig(keep_replicates=True, bootstrap=0)


def _run(root: Path, ratios: list[float], replicates: list[np.ndarray] | None) -> Path:
    rows = [
        row("m", 8, 80, "tangent_energy", "energy_ratio", value, site=f"blocks.{layer}."
            "hook_resid_post", layer=layer, method="pca", rank=4)
        for layer, value in enumerate(ratios)
    ]  # fmt: skip
    store = RunStore(root)
    if replicates is not None:
        store.write_replicates(
            "step-00000008", [replicate_record(r, v) for r, v in zip(rows, replicates, strict=True)]
        )
    store.write_part("step-00000008", rows)
    recipe = {"name": "r", "suite": {"name": "micro-pythia"}, "probes": {"tangent_energy": {}}}
    store.write_manifest({"recipe": recipe, "finished": True, "n_layers": 2, "steps": [8]})
    return root


def test_compare_gives_differences_intervals_from_stored_replicates(tmp_path):
    rng = np.random.default_rng(4)
    base = [np.exp(rng.normal(math.log(v), 0.05, R)) for v in (2.0, 4.0)]
    a = _run(tmp_path / "a", [2.0, 4.0], base)
    b = _run(tmp_path / "b", [2.0 * math.e**0.5, 4.0], [base[0] * math.e**0.5, base[1]])
    c = _run(tmp_path / "c", [3.0, 5.0], None)
    records = read_replicates(a).to_pylist()
    assert list(records[0]) == [*REPLICATE_FIELDS, "replicates"]
    np.testing.assert_array_equal(records[1]["replicates"], base[1])

    rows = compare([a, b]).to_pylist()
    differences = {r["relative_depth"]: r for r in rows if r["difference"] == "log_ratio"}
    assert differences[0.5]["value"] == pytest.approx(0.5)
    assert (differences[0.5]["ci_low"], differences[0.5]["ci_high"]) == pytest.approx((0.5, 0.5))
    assert (differences[1.0]["ci_low"], differences[1.0]["ci_high"]) == pytest.approx((0.0, 0.0))

    without = [r for r in compare([a, c]).to_pylist() if r["difference"] is not None]
    assert without and all(r["ci_low"] is None and r["ci_high"] is None for r in without)


def test_the_recipe_identity_names_keep_replicates_only_when_on():
    """A run made before the key existed resumes (its manifest's recipe has no such key); the
    table round-trips to the same config either way."""
    from tangentlens.core.recipe import load_recipe

    off = load_recipe("quickstart")
    assert "keep_replicates" not in off.to_dict()["probes"]["tangent_energy"]
    on = load_recipe("quickstart", ["probes.tangent_energy.keep_replicates=true"])
    assert on.to_dict()["probes"]["tangent_energy"]["keep_replicates"] is True
    for recipe in (off, on):
        config = recipe.config("tangent_energy")
        assert TangentEnergyConfig(**config.to_table()) == config
