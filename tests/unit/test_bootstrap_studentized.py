"""The studentized (bootstrap-t) interval of ``bootstrap_ratio``, pinned value for value against
an independent implementation written here from its definition.

For a pooled ratio r̂ = Σ num / Σ den over g groups, with the linearised standard error
se(r̂) = √Σ (numᵢ − r̂ denᵢ)² / Σ den, each replicate b (groups drawn with replacement) gives
r*_b and se*_b (the same formula on the drawn groups) and t*_b = (r*_b − r̂) / se*_b; the interval
at level 1 − 2α is [r̂ − q_{1−α}(t*) se, r̂ − q_α(t*) se]. The percentile interval is
[q_α(r*), q_{1−α}(r*)]. On the skewed planted groups below the two differ by far more than the
tolerance, so a studentized request that silently falls back to percentiles is caught.
"""

import numpy as np
import pytest

from tangentlens.metrics import bootstrap as bootstrap_module
from tangentlens.metrics.bootstrap import bootstrap_ratio

# few, unequal groups with a right-skewed per-group ratio (one group carries a large share)
DEN = np.array([5.0, 8.0, 3.0, 12.0, 7.0, 4.0, 9.0, 6.0, 15.0, 2.0, 10.0, 5.0])
NUM = np.array([1.0, 2.0, 0.5, 6.0, 1.0, 0.4, 3.0, 0.9, 7.5, 0.1, 2.5, 0.6])
REPLICATES, LEVEL, SEED = 400, 0.9, 7


def _record_draws(monkeypatch) -> list[np.ndarray]:
    """Let the library draw its resamples as it does, and keep a copy of them (the counts per
    replicate and group), so the reference below resamples exactly the same groups."""
    seen: list[np.ndarray] = []
    original = bootstrap_module._resample_counts

    def recording(rng, groups, replicates):
        counts = original(rng, groups, replicates)
        seen.append(counts.copy())
        return counts

    monkeypatch.setattr(bootstrap_module, "_resample_counts", recording)
    bootstrap_module._seeded_counts.cache_clear()  # drawn here, not by an earlier test
    return seen


def order_statistic(values, p: float) -> float:
    """The ``(B + 1)·p``-th smallest of B values (1-based, linear between neighbours, clipped to
    the extremes): Hall's rule for bootstrap quantiles, written out."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    h = min(max((len(x) + 1) * p, 1.0), float(len(x)))
    below = int(np.floor(h))
    if below >= len(x):
        return float(x[-1])
    return float(x[below - 1] + (h - below) * (x[below] - x[below - 1]))


def _reference(counts: np.ndarray, level: float) -> dict[str, tuple[float, float]]:
    """Both intervals, one replicate at a time, from the groups each replicate drew."""
    point = NUM.sum() / DEN.sum()
    se = np.sqrt(((NUM - point * DEN) ** 2).sum()) / DEN.sum()
    ratios, t = [], []
    for c in counts:
        drawn = np.repeat(np.arange(len(DEN)), c)  # the drawn groups, with repeats
        n, d = NUM[drawn], DEN[drawn]
        r = n.sum() / d.sum()
        se_r = np.sqrt(((n - r * d) ** 2).sum()) / d.sum()
        ratios.append(r)
        if se_r > 0:
            t.append((r - point) / se_r)
    alpha = (1 - level) / 2
    t_low, t_high = order_statistic(t, alpha), order_statistic(t, 1 - alpha)
    return {
        "studentized": (point - t_high * se, point - t_low * se),
        "percentile": (order_statistic(ratios, alpha), order_statistic(ratios, 1 - alpha)),
    }


def test_studentized_interval_values_are_the_bootstrap_t_and_not_the_percentile(monkeypatch):
    draws = _record_draws(monkeypatch)
    got = bootstrap_ratio(
        NUM, DEN, replicates=REPLICATES, level=LEVEL, seed=SEED, method="studentized"
    )
    percentile = bootstrap_ratio(
        NUM, DEN, replicates=REPLICATES, level=LEVEL, seed=SEED, method="percentile"
    )
    assert len(draws) == 1  # same seed, same resamples: drawn once, shared by both intervals
    counts = draws[0]
    assert counts.shape == (REPLICATES, len(DEN)) and (counts.sum(axis=1) == len(DEN)).all()
    want = _reference(counts, LEVEL)
    point = NUM.sum() / DEN.sum()
    assert got.value == pytest.approx(point, rel=1e-15) and got.method == "studentized"
    assert not got.widened  # the bootstrap-t interval contains r̂ here: nothing was stretched
    assert (got.ci_low, got.ci_high) == pytest.approx(want["studentized"], rel=1e-10)
    assert (percentile.ci_low, percentile.ci_high) == pytest.approx(want["percentile"], rel=1e-10)
    # the planted data tells the two intervals apart (a silent percentile fallback fails above)
    low_gap = abs(want["studentized"][0] - want["percentile"][0])
    high_gap = abs(want["studentized"][1] - want["percentile"][1])
    assert max(low_gap, high_gap) > 0.01
