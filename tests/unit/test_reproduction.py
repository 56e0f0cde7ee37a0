"""The reproduction summary (METHODS.md §1.9; issue 33, items 4 and 6; issue 42, item 2): each
verdict names its metric, null and site kind; it needs ≥ 3 scored steps and a baseline (step 0,
else the earliest scored step), "early" is read by tokens seen, the frequency claim needs its
effect beyond 2 shuffle-null sd; otherwise the finding is "not testable from this run", with the
reason. A verdict reads the rows' intervals ("above 1" = the lower end above 1; "above" and
"smaller" = 2 sd of the difference apart) and averages the same (method, layer, site) set at every
step it compares. Value tests on synthetic tables whose truth is known: the verdicts and their
evidence strings, exactly."""

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


def _energy(
    values: dict[int, float],
    site: str = "blocks.0.hook_resid_post",
    method: str = "pca",
    half: float = 0.1,
) -> list[dict]:
    """``energy_ratio`` rows with the interval value ± ``half`` (None: no interval)."""
    return [
        _row(
            "tangent_energy", "energy_ratio", s, v, site=site, method=method, rank=4,
            ci=None if half is None else (v - half, v + half),
        )
        for s, v in values.items()
    ]  # fmt: skip


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
    # early = the steps after the baseline with ≤ 30 % of step 100's tokens: 10 and 20; the
    # early mean's sd facing the baseline 0.1/1.96, the baseline's 0.1/1.96: 1.2/0.0722
    assert energy.evidence == (
        "early steps (≤ 30% of the 100,000 tokens seen by step 100) 10: 3.00 [2.90, 3.10], "
        "20: 3.40 [3.30, 3.50], mean 3.20 [3.10, 3.30]; at step 100: 1.20 [1.10, 1.30]; "
        "baseline step 0 (init): 2.00 [1.90, 2.10]; early − baseline +16.6 sd, early − late "
        "+27.7 sd; mean over the same 1 (method, layer, site) at every compared step"
    )
    assert "freq_distance_pearson" in frequency.claim and "shuffle null" in frequency.claim
    assert frequency.evidence == (
        "Pearson at step 100, mean over 1 site: -0.500; shuffle null 0.010 ± 0.030 (effect "
        "-17.0 null sd); baseline step 0 (init): -0.020 ± 0.030 (change -11.3 null sd; seeds: "
        "≈ −0.5, for a statistic of their own)"
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
    assert "baseline step 0 (init): 9.00 [8.90, 9.10]; early − baseline -83.2 sd" in energy.evidence
    (energy,) = reproduction_summary(_energy({10: 2.0, 20: 3.0, 30: 3.0, 100: 1.2}))
    assert energy.holds is True
    assert energy.evidence.startswith(
        "early steps (≤ 30% of the 100,000 tokens seen by step 100) 20: 3.00 [2.90, 3.10], "
        "30: 3.00 [2.90, 3.10], mean 3.00 [2.90, 3.10]; at step 100: 1.20 [1.10, 1.30]; "
        "baseline step 10 (the earliest scored: no step 0): 2.00 [1.90, 2.10]"
    )
    (energy,) = reproduction_summary(_energy({10: 3.5, 20: 3.0, 30: 3.0, 100: 1.2}))
    assert energy.holds is False  # the early steps stay below the earliest step's 3.5


def test_early_is_read_by_tokens_seen_not_by_the_count_of_steps():
    """Log-spaced steps (quickstart's): the early steps are those within 30 % of the last
    step's tokens, not the first 30 % of the steps."""
    steps = {0: 2.3, 2: 2.4, 8: 2.6, 16: 2.8, 64: 3.0, 200: 3.2, 400: 2.0, 1200: 1.5}
    (energy,) = reproduction_summary(_energy(steps))
    assert energy.evidence.startswith(
        "early steps (≤ 30% of the 1,200,000 tokens seen by step 1200) 2: 2.40 [2.30, 2.50], "
        "8: 2.60 [2.50, 2.70], 16: 2.80 [2.70, 2.90], 64: 3.00 [2.90, 3.10], "
        "200: 3.20 [3.10, 3.30], mean 2.80 [2.70, 2.90]"
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
    assert "10: 1.00 [0.90, 1.10], mean 1.00 [0.90, 1.10]; at step 100: 1.00" in (
        findings[0].evidence
    )
    assert "10: 3.00 [2.90, 3.10], mean 3.00 [2.90, 3.10]; at step 100: 1.00" in (
        findings[1].evidence
    )


# ------------------------------------------------------------ issue 42, item 2: the edges


def _energy_verdict(rows: list[dict]) -> tuple[bool | None, str]:
    (energy,) = reproduction_summary(rows)
    return energy.holds, energy.evidence


def test_a_step_whose_interval_contains_1_is_not_above_1():
    """(a): baseline 1.1, early 1.6 with the interval [0.7, 2.5], late 1.4 held before (1.6 >
    1.5, above 1.1, above 1.4); its interval contains 1."""
    rows = [
        *_energy({0: 1.1, 100: 1.4}, half=0.05),
        _row("tangent_energy", "energy_ratio", 10, 1.6, method="pca", rank=4, ci=(0.7, 2.5)),
    ]
    holds, evidence = _energy_verdict(rows)
    assert holds is False
    assert "10: 1.60 [0.70, 2.50]" in evidence
    # the same numbers with an interval above 1, and far enough from both ends, hold
    tight = _energy({0: 1.1, 10: 1.6, 100: 1.4}, half=0.05)
    assert _energy_verdict(tight)[0] is True


def test_smaller_late_needs_the_difference_beyond_its_uncertainty():
    """(b): early 2.00, late 1.99 read "smaller late" before; 0.01 is 0.07 sd of the
    difference (sds 0.1/1.96 each)."""
    holds, evidence = _energy_verdict(_energy({0: 1.0, 10: 2.00, 100: 1.99}))
    assert holds is False
    assert "early − late +0.1 sd" in evidence
    # the difference's sd: √2 · 0.1/1.96 = 0.072
    assert _energy_verdict(_energy({0: 1.0, 10: 2.00, 100: 1.85}))[0] is True  # 2.1 sd
    assert _energy_verdict(_energy({0: 1.0, 10: 2.00, 100: 1.87}))[0] is False  # 1.8 sd
    # above the baseline likewise: 2.0 against 1.9 is 0.7 sd
    assert _energy_verdict(_energy({0: 1.9, 10: 2.00, 100: 1.0}))[0] is False


def test_means_compared_across_steps_average_the_same_methods():
    """(c): pca 3.0 at every step after a 1.2 baseline, seminmf only at the last step at 1.0:
    the late mean over both methods (2.0) read as a decline before; no method declined."""
    rows = [
        *_energy({0: 1.2, 10: 3.0, 100: 3.0}, method="pca"),
        *_energy({100: 1.0}, method="seminmf"),
    ]
    holds, evidence = _energy_verdict(rows)
    assert holds is False
    assert "at step 100: 3.00 [2.90, 3.10]" in evidence
    assert evidence.endswith(
        "mean over the same 1 (method, layer, site) at every compared step; left out (not "
        "scored at every compared step): seminmf L0"
    )
    # a method present at every step counts: seminmf declining with pca makes it hold
    declining = [*rows[:3], *_energy({0: 1.2, 10: 3.0}, method="seminmf")]
    declining += _energy({100: 1.0}, method="seminmf")
    declining = [r for r in declining if not (r["method"] == "pca" and r["step"] == 100)]
    declining += _energy({100: 1.0}, method="pca")
    assert _energy_verdict(declining)[0] is True


def test_energy_rows_without_intervals_are_not_testable():
    holds, evidence = _energy_verdict(_energy({0: 1.0, 10: 3.0, 100: 1.0}, half=None))
    assert holds is None
    assert evidence == (
        "the energy_ratio rows carry no interval (probes.tangent_energy.bootstrap = 0): the "
        "verdict reads the intervals"
    )


def test_a_frequency_effect_between_1_and_2_null_sd_does_not_hold():
    """Below its null by 1.5 sd: not beyond it; 2.5 sd: beyond."""
    rows = []
    for step, pearson in {0: 0.2, 10: 0.0, 100: -0.15}.items():
        rows += _frequency(step, pearson, (0.0, 0.1))
    (frequency,) = reproduction_summary(rows)
    assert frequency.holds is False and "(effect -1.5 null sd)" in frequency.evidence
    rows = []
    for step, pearson in {0: 0.2, 10: 0.0, 100: -0.25}.items():
        rows += _frequency(step, pearson, (0.0, 0.1))
    assert reproduction_summary(rows)[0].holds is True


def test_below_the_baseline_needs_2_sd_of_the_change():
    """−0.30 against a baseline of −0.25 is below it, by 0.05 = 0.35 sd (null sds 0.1, 0.1):
    not a change training made; against −0.02 it is 2.0 sd."""
    rows = []
    for step, pearson in {0: -0.25, 10: -0.2, 100: -0.30}.items():
        rows += _frequency(step, pearson, (0.0, 0.1))
    (frequency,) = reproduction_summary(rows)
    assert frequency.holds is False and "(change -0.4 null sd;" in frequency.evidence
    rows = []
    for step, pearson in {0: 0.0, 10: -0.2, 100: -0.30}.items():
        rows += _frequency(step, pearson, (0.0, 0.1))
    assert reproduction_summary(rows)[0].holds is True


def test_the_frequency_means_read_the_sites_with_a_null_at_both_steps():
    """A second site without a null at the last step is left out of the observed mean too
    (before: the observed mean took it, the null's did not)."""
    rows = []
    for step, pearson in {0: 0.0, 10: -0.2, 100: -0.5}.items():
        rows += _frequency(step, pearson, (0.0, 0.1))
    other = "blocks.1.hook_resid_post"
    for step in (0, 10, 100):
        rows.append(
            _row("frequency_geometry", "freq_distance_pearson", step, 0.4, layer=1, site=other)
        )
    (frequency,) = reproduction_summary(rows)
    assert frequency.holds is True
    assert frequency.evidence.startswith("Pearson at step 100, mean over 1 site: -0.500")
    assert frequency.evidence.endswith(
        "left out (no shuffle null, or not scored at both compared steps): L1"
    )


def _bell_rows(profiles: dict[int, tuple[float, ...]]) -> list[dict]:
    return [
        _row("shape_of_learning", "centred_anisotropy", step, v, layer=k)
        for step, profile in profiles.items()
        for k, v in enumerate(profile)
    ]


def test_a_bell_that_shrank_from_its_baseline_does_not_hold():
    """An interior peak at the last step, lower above its ends than at initialisation."""
    rows = _bell_rows({0: (0.1, 0.4, 0.1), 10: (0.1, 0.3, 0.1), 100: (0.1, 0.2, 0.1)})
    (bell,) = reproduction_summary(rows)
    assert bell.holds is False and "peak at L1" in bell.evidence


def test_a_bell_is_read_against_the_baseline_over_the_same_layers():
    """The baseline scored at the end layers only (no interior: a bump of −inf) made any
    interior peak "grow" before; over the same layers L0 and L2 there is no bell to read."""
    rows = _bell_rows({0: (0.1, 0.5, 0.1), 10: (0.1, 0.3, 0.1), 100: (0.1, 0.3, 0.1)})
    rows = [r for r in rows if not (r["step"] == 0 and r["layer"] == 1)]
    (bell,) = reproduction_summary(rows)
    assert bell.holds is None
    assert bell.evidence == ("2 layers scored at both step 100 and the baseline (a bell needs ≥ 3)")


def test_twonn_means_hold_the_layers_fixed():
    """A layer scored at the peak step only lifted the peak's mean before."""
    rows = [
        _row("shape_of_learning", "twonn_dimension", s, v)
        for s, v in {0: 10.0, 10: 10.2, 20: 10.1, 100: 10.0}.items()
    ]
    rows.append(_row("shape_of_learning", "twonn_dimension", 10, 40.0, layer=1))
    (rise,) = reproduction_summary(rows)
    assert rise.holds is False
    assert rise.evidence.endswith("left out (not scored at every compared step): L1")
