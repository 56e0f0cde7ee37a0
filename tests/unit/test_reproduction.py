"""The reproduction summary (METHODS.md §1.9; issue 33, items 4 and 6): each verdict names its
metric, null and site kind; it needs ≥ 3 scored steps and a baseline (step 0, else the earliest
scored step), "early" is read by tokens seen, the frequency claim needs its effect beyond 2
shuffle-null sd; otherwise the finding is "not testable from this run", with the reason. Value
tests: the verdicts and their evidence strings, exactly."""

from __future__ import annotations

from typing import Any

from tangentlens.report.reproduction import NOT_TESTABLE, reproduction_summary
from tangentlens.results import row

TOKENS_PER_STEP = 1000


def _row(probe: str, metric: str, step: int, value: float, **cell: Any) -> dict[str, Any]:
    layer = cell.pop("layer", 0)
    site = cell.pop("site", f"blocks.{layer}.hook_resid_post")
    return row(
        "s", step, step * TOKENS_PER_STEP, probe, metric, value, site=site, layer=layer, **cell
    )


def _energy(values: dict[int, float], site: str = "blocks.0.hook_resid_post") -> list[dict]:
    return [
        _row("tangent_energy", "energy_ratio", s, v, site=site, method="pca", rank=4)
        for s, v in values.items()
    ]


def _frequency(step: int, pearson: float, null: tuple[float, float] | None) -> list[dict]:
    out = [_row("frequency_geometry", "freq_distance_pearson", step, pearson)]
    if null is not None:
        out += [
            _row("frequency_geometry", "freq_distance_pearson_null_mean", step, null[0]),
            _row("frequency_geometry", "freq_distance_pearson_null_std", step, null[1]),
        ]
    return out


def _planted() -> list[dict]:
    """Steps 0, 10, 20, 100 (tokens ∝ step): a bell grown from a flat profile, TwoNN rising
    then falling, an energy ratio high early and lower late, a frequency correlation far beyond
    its null."""
    rows = []
    profiles = {0: (0.1, 0.1, 0.1), 10: (0.1, 0.2, 0.1), 20: (0.1, 0.3, 0.2), 100: (0.1, 0.3, 0.2)}
    for step, profile in profiles.items():
        rows += [
            _row("shape_of_learning", "centred_anisotropy", step, v, layer=k)
            for k, v in enumerate(profile)
        ]
    twonn = {0: 10.0, 10: 20.0, 20: 18.0, 100: 12.0}
    rows += [_row("shape_of_learning", "twonn_dimension", s, v) for s, v in twonn.items()]
    rows += _energy({0: 2.0, 10: 3.0, 20: 3.4, 100: 1.2})
    for step, pearson in {0: -0.02, 10: -0.1, 20: -0.2, 100: -0.5}.items():
        rows += _frequency(step, pearson, (0.01, 0.03))
    return rows


def test_planted_findings_hold_and_name_their_metric_null_and_site():
    findings = reproduction_summary(_planted())
    assert [(f.verdict, f.claim.split(" (")[0]) for f in findings] == [
        ("holds", "bell-shaped anisotropy over depth"),
        ("holds", "intrinsic dimension rises early, then falls"),
        ("holds", "tangent energy ratio"),
        ("holds", "log-frequency correlates negatively with centroid spread"),
    ]
    assert all(f.claim.endswith(" at resid_post") for f in findings)
    bell, rise, energy, frequency = findings
    assert bell.evidence == (
        "at step 100: L0 0.100, L1 0.300, L2 0.200; peak at L1; baseline step 0 (init): "
        "L0 0.100, L1 0.100, L2 0.100"
    )
    assert rise.evidence == (
        "by step — 0 (init): 10.0, 10: 20.0, 20: 18.0, 100: 12.0; baseline step 0 (init); "
        "peak at step 10"
    )
    assert "energy_ratio: the proxy over the exchangeable controls' exact mean" in energy.claim
    # early = the steps after the baseline with ≤ 30 % of step 100's tokens: 10 and 20
    assert energy.evidence == (
        "mean over the early steps [10, 20] (≤ 30% of the 100,000 tokens seen by step 100): "
        "3.20; at step 100: 1.20; baseline step 0 (init): 2.00"
    )
    assert "freq_distance_pearson" in frequency.claim and "shuffle null" in frequency.claim
    assert frequency.evidence == (
        "Pearson at step 100, mean over 1 site: -0.500; shuffle null 0.010 ± 0.030 (effect "
        "-17.0 null sd); baseline step 0 (init): -0.020 (seeds: ≈ −0.5, for a statistic of "
        "their own)"
    )


def test_a_correlation_within_two_null_sd_does_not_hold():
    """The audit's case: a Pearson of −0.01 is half a null sd, not an effect."""
    rows = []
    for step, pearson in {0: 0.0, 10: 0.0, 100: -0.01}.items():
        rows += _frequency(step, pearson, (0.0, 0.02))
    (frequency,) = reproduction_summary(rows)
    assert frequency.holds is False
    assert "(effect -0.5 null sd)" in frequency.evidence
    # beyond 2 null sd but not below the baseline: training did not make it
    rows = []
    for step, pearson in {0: -0.3, 10: -0.2, 100: -0.2}.items():
        rows += _frequency(step, pearson, (0.0, 0.02))
    assert reproduction_summary(rows)[0].holds is False


def test_the_baseline_is_step_0_where_the_run_has_it_else_the_earliest_step():
    """A ratio already high at initialisation is not credited to training; without step 0 the
    earliest scored step is the baseline (named as such) and not counted as early."""
    (energy,) = reproduction_summary(_energy({0: 9.0, 10: 3.0, 20: 3.0, 100: 1.2}))
    assert energy.holds is False
    assert energy.evidence.endswith("baseline step 0 (init): 9.00")
    (energy,) = reproduction_summary(_energy({10: 2.0, 20: 3.0, 30: 3.0, 100: 1.2}))
    assert energy.holds is True
    assert energy.evidence == (
        "mean over the early steps [20, 30] (≤ 30% of the 100,000 tokens seen by step 100): "
        "3.00; at step 100: 1.20; baseline step 10 (the earliest scored: no step 0): 2.00"
    )
    (energy,) = reproduction_summary(_energy({10: 3.5, 20: 3.0, 30: 3.0, 100: 1.2}))
    assert energy.holds is False  # the early steps stay below the earliest step's 3.5


def test_early_is_read_by_tokens_seen_not_by_the_count_of_steps():
    """Log-spaced steps (quickstart's): the early steps are those within 30 % of the last
    step's tokens, not the first 30 % of the steps."""
    steps = {0: 2.3, 2: 2.4, 8: 2.6, 16: 2.8, 64: 3.0, 200: 3.2, 400: 2.0, 1200: 1.5}
    (energy,) = reproduction_summary(_energy(steps))
    assert energy.evidence.startswith(
        "mean over the early steps [2, 8, 16, 64, 200] (≤ 30% of the 1,200,000 tokens seen by "
        "step 1200): 2.80"
    )


def test_findings_a_run_cannot_speak_to_are_not_testable_with_the_reason():
    one = [*_energy({100: 3.0}), *_frequency(100, -0.5, (0.0, 0.01))]
    one += [_row("shape_of_learning", "centred_anisotropy", 100, v, layer=k) for k in range(3)
            for v in [0.1 * (k + 1)]]  # fmt: skip
    findings = reproduction_summary(one)
    assert [f.verdict for f in findings] == [NOT_TESTABLE] * 3
    assert findings[0].evidence == (
        "1 scored step with this metric (100); a verdict needs ≥ 3: a baseline (step 0, else "
        "the earliest) and two later steps"
    )
    (energy,) = reproduction_summary(_energy({0: 2.0, 500: 3.0, 1000: 1.0}))
    assert energy.holds is None
    assert energy.evidence == (
        "no scored step between the baseline (step 0 (init)) and step 1000 within the first 30% "
        "of its 1,000,000 tokens seen"
    )
    rows = []
    for step in (0, 10, 100):
        rows += _frequency(step, -0.5, None)
    (frequency,) = reproduction_summary(rows)
    assert frequency.holds is None and frequency.evidence.startswith("no shuffle null at step 100")
    unknown = [{**r, "tokens_seen": None} for r in _energy({0: 1.0, 10: 3.0, 100: 1.0})]
    assert reproduction_summary(unknown)[0].evidence == (
        'tokens seen unknown at step 0: "early" cannot be defined'
    )
    assert reproduction_summary([]) == []


def test_two_sites_of_one_layer_get_a_verdict_each_never_their_average():
    """resid_post and mlp_out at every block: one energy verdict per site kind, with its own
    numbers (the mean of the two, 2.0 early, would hold; only resid_post does)."""
    resid = _energy({0: 1.0, 10: 3.0, 100: 1.0}, site="blocks.0.hook_resid_post")
    mlp = _energy({0: 1.0, 10: 1.0, 100: 1.0}, site="blocks.0.hook_mlp_out")
    findings = reproduction_summary(resid + mlp)
    assert [(f.claim.rsplit(" at ", 1)[1], f.holds) for f in findings] == [
        ("mlp_out", False),
        ("resid_post", True),
    ]
    assert findings[0].evidence.startswith("mean over the early steps [10] (≤ 30% of the ")
    assert ": 1.00; at step 100: 1.00" in findings[0].evidence
    assert ": 3.00; at step 100: 1.00" in findings[1].evidence
