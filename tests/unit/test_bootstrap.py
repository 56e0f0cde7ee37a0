"""The ratio bootstrap: interval constructions, rescaling onto a reported value, and the
guarantee that every interval contains its own point value."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tangentlens.metrics.bootstrap import BOOTSTRAP_METHODS, bootstrap_ratio


def _sums(seed: int, n: int = 60) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    den = rng.gamma(2.0, 1.0, n)
    return 0.3 * den + rng.normal(0.0, 0.1, n) * den, den


def test_resampling_draws_sequences_with_replacement_like_bincount_per_replicate():
    """One bincount over all replicates gives the per-replicate counts of the drawn groups."""
    from tangentlens.metrics.bootstrap import _resample_counts

    counts = _resample_counts(np.random.default_rng(3), 7, 50)
    draws = np.random.default_rng(3).integers(0, 7, size=(50, 7))
    expected = np.stack([np.bincount(row, minlength=7) for row in draws])
    np.testing.assert_array_equal(counts, expected)


def test_a_seeds_resamples_are_drawn_once_and_are_the_seeds_own():
    """The counts a seed draws are kept (read-only) and reused by every interval over the same
    groups; they are the draws of that seed, whether cached or drawn afresh."""
    from tangentlens.metrics import bootstrap as module

    num, den = _sums(4)
    module._seeded_counts.cache_clear()
    first = bootstrap_ratio(num, den, replicates=300, seed=5)
    counts = module._seeded_counts(5, 60, 300)
    assert module._seeded_counts.cache_info().hits == 1 and not counts.flags.writeable
    fresh = module._resample_counts(
        np.random.default_rng(np.random.SeedSequence([5, 0xB007])), 60, 300
    )
    np.testing.assert_array_equal(counts, fresh)
    ratios = np.sort((fresh @ num) / (fresh @ den))
    assert first.ci_low == pytest.approx(np.quantile(ratios, 0.025, method="weibull"), rel=1e-12)
    again = bootstrap_ratio(num, den, replicates=300, seed=5)
    assert (again.ci_low, again.ci_high) == (first.ci_low, first.ci_high)
    other = bootstrap_ratio(num, den, replicates=300, seed=6)
    assert (other.ci_low, other.ci_high) != (first.ci_low, first.ci_high)


@pytest.mark.parametrize("method", BOOTSTRAP_METHODS)
def test_every_method_contains_its_point_and_is_seeded(method):
    num, den = _sums(1)
    r = bootstrap_ratio(num, den, replicates=500, seed=2, method=method)
    assert r.value == pytest.approx(num.sum() / den.sum(), rel=1e-15) == r.sample_value
    assert r.ci_low < r.value < r.ci_high and not r.widened
    assert r.method == method and r.groups == 60 and r.replicates == 500
    again = bootstrap_ratio(num, den, replicates=500, seed=2, method=method)
    assert (again.ci_low, again.ci_high) == (r.ci_low, r.ci_high)
    # the delta-method standard error of a ratio estimator as an independent reference width
    se = np.sqrt(((num - r.value * den) ** 2).sum()) / den.sum()
    assert (r.ci_high - r.ci_low) / (2 * 1.96 * se) == pytest.approx(1.0, abs=0.2)


def test_centre_rescales_the_sample_interval_onto_the_reported_value():
    num, den = _sums(4)
    sample = bootstrap_ratio(num, den, replicates=300, seed=1, method="percentile")
    moved = bootstrap_ratio(num, den, replicates=300, seed=1, method="percentile", centre=0.45)
    scale = 0.45 / sample.value
    assert moved.value == 0.45 and moved.sample_value == sample.value
    assert moved.ci_low == pytest.approx(sample.ci_low * scale, rel=1e-12)
    assert moved.ci_high == pytest.approx(sample.ci_high * scale, rel=1e-12)
    clipped = bootstrap_ratio(num, den, replicates=300, seed=1, centre=0.999, bounds=(0.0, 1.0))
    assert clipped.ci_high == 1.0 and clipped.ci_low <= 0.999
    # a centre the clipped interval cannot reach: the interval is widened to it, and says so
    widened = bootstrap_ratio(num, den, replicates=300, seed=1, centre=0.9, bounds=(0.0, 0.5))
    assert widened.widened and widened.ci_low == 0.5 and widened.ci_high == 0.9


def test_replicates_without_denominator_are_left_out():
    num = np.array([1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    den = np.array([2.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    for method in BOOTSTRAP_METHODS:
        r = bootstrap_ratio(num, den, replicates=200, seed=0, method=method)
        assert r.value == 0.5 and math.isfinite(r.ci_low) and math.isfinite(r.ci_high)
        assert r.ci_low <= 0.5 <= r.ci_high


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="g ≥ 2"):
        bootstrap_ratio([1.0], [1.0])
    with pytest.raises(ValueError, match="sum to zero"):
        bootstrap_ratio([1.0, 1.0], [0.0, 0.0])
    with pytest.raises(ValueError, match="method must be one of"):
        bootstrap_ratio([1.0, 2.0], [1.0, 1.0], method="normal")
    with pytest.raises(ValueError, match="centre must be a finite number"):
        bootstrap_ratio([1.0, 2.0], [1.0, 1.0], centre=math.nan)
