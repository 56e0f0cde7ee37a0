"""Every verdict rule at its edge: the shared rules of :mod:`tangentlens.findings` and the
verdicts the built-in probes declare (tangent_energy, frequency_geometry, shape_of_learning),
each with an input exactly on its threshold and one just past it, so that a ``<`` read as
``<=`` (or a constant moved) flips a verdict. Value tests on synthetic rows whose truth is known
by hand."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tangentlens.findings import (
    NOT_TESTABLE,
    Z_95,
    Estimate,
    Finding,
    Steps,
    left_out,
    mean_by,
    per_kind,
    pick,
    same_cells,
    sds_apart,
    steps_of,
)
from tangentlens.probes import frequency_geometry, shape_of_learning, tangent_energy
from tests.unit.test_reproduction import _row

# ------------------------------------------------------------------ findings: shared rules


def test_sds_apart_reads_the_facing_halves_and_its_degenerate_cases():
    # the larger's lower half (0.4) and the smaller's upper half (0.3): √(0.4² + 0.3²) = 0.5 sd
    larger = Estimate(3.0, 3.0 - 0.4 * Z_95, 3.0 + 9.0)  # its upper half is not read
    smaller = Estimate(2.0, 2.0 - 9.0, 2.0 + 0.3 * Z_95)  # nor its lower half
    assert sds_apart(larger, smaller) == pytest.approx(1.0 / 0.5)
    assert sds_apart(smaller, larger) == pytest.approx(-1.0 / math.hypot(9.0, 9.0) * Z_95)
    # an interval that does not contain its value counts as a point on that side
    assert sds_apart(Estimate(3.0, 3.5, 4.0), Estimate(2.0, 1.0, 2.0 + 0.5 * Z_95)) == (
        pytest.approx(2.0)
    )
    point = Estimate(2.0, 2.0, 2.0)
    assert sds_apart(Estimate(3.0, 3.0, 3.0), point) == math.inf
    assert sds_apart(point, Estimate(3.0, 3.0, 3.0)) == -math.inf
    assert sds_apart(point, point) == 0.0


def test_an_estimate_is_the_mean_of_its_rows_ends():
    rows = [
        {"value": 1.0, "ci_low": 0.5, "ci_high": 2.0},
        {"value": 3.0, "ci_low": 1.5, "ci_high": 4.0},
    ]
    assert Estimate.of(rows) == Estimate(2.0, 1.0, 3.0)
    assert Estimate.mean([Estimate(1.0, 0.0, 2.0), Estimate(2.0, 1.0, 5.0)]) == (
        Estimate(1.5, 0.5, 3.5)
    )
    assert str(Estimate(1.0, 0.5, 2.25)) == "1.00 [0.50, 2.25]"


def test_a_verdict_needs_three_steps_two_are_too_few():
    assert Steps([0, 10, 20]).too_few() is None
    assert Steps([0, 10]).too_few() == (
        "2 scored steps with this metric (0, 10); a verdict needs ≥ 3: a baseline (step 0, "
        "else the earliest) and two later steps"
    )
    assert Steps([]).too_few().startswith("0 scored steps with this metric (none);")
    assert Steps([5, 10, 20]).baseline == 5 and Steps([0, 10, 20]).baseline == 0
    assert Steps([5, 10, 20]).last == 20
    assert Steps([0, 10]).baseline_label() == "step 0 (init)"
    assert Steps([5, 10]).baseline_label() == "step 5 (the earliest scored: no step 0)"
    assert steps_of([{"step": 20}, {"step": 0}, {"step": 20}]) == Steps([0, 20])


def test_the_verdict_words():
    assert Finding("c", True, "e").verdict == "holds"
    assert Finding("c", False, "e").verdict == "does not hold"
    assert Finding("c", None, "e").verdict == NOT_TESTABLE


def test_left_out_lists_six_cells_then_counts_the_rest():
    cells = [("pca", k, f"blocks.{k}.hook_resid_post") for k in range(7)]
    assert left_out([]) == ""
    six = left_out(cells[:6])
    assert six == (
        "; left out (not scored at every compared step): pca L0, pca L1, pca L2, pca L3, "
        "pca L4, pca L5"
    )
    assert left_out(cells) == six + ", … 1 more"
    # a cell without a layer is named by its site; one without a method by its place alone
    assert left_out([(None, None, "hook_embed"), ("-", 2, "x")], "why") == (
        "; left out (why): hook_embed, L2"
    )


def test_pick_keeps_bin_all_known_values_at_checkpoints_by_site_kind():
    keep = _row("p", "m", 0, 1.0)
    rows = [
        keep,
        _row("p", "m", 10, 2.0, site="blocks.0.hook_mlp_out"),
        _row("p", "m", 10, 3.0, freq_bin="0"),  # a bin
        _row("p", "m", 10, math.nan),  # no value
        _row("p", "m", -1, 4.0),  # model-free
        _row("p", "other", 10, 5.0),
        _row("q", "m", 10, 6.0),
        _row("p", "m", 10, 7.0, site="hook_embed", layer=None),
    ]
    picked = pick(rows, "p", "m")
    assert list(picked) == ["embed", "mlp_out", "resid_post"]  # kinds sorted
    assert [r["value"] for r in picked["resid_post"]] == [1.0]
    assert [r["value"] for r in picked["mlp_out"]] == [2.0]
    assert "embed" not in pick(rows, "p", "m", layered=True)


def test_a_row_without_a_bin_or_a_site_is_picked_as_bin_all_of_its_own_kind():
    whole = {"probe": "p", "metric": "m", "step": 10, "value": 1.0, "layer": None, "site": None}
    binned = {**whole, "freq_bin": "2", "value": 2.0}
    assert pick([whole, binned], "p", "m") == {"-": [whole]}


def test_per_kind_checks_each_kind_and_passes_layered_on():
    rows = [_row("p", "m", 0, 1.0), _row("p", "m", 0, 2.0, site="hook_embed", layer=None)]

    def count(kind, picked):
        return Finding(kind, True, str(len(picked)))

    assert [(f.claim, f.evidence) for f in per_kind(rows, "p", "m", count)] == [
        ("embed", "1"), ("resid_post", "1"),
    ]  # fmt: skip
    assert [f.claim for f in per_kind(rows, "p", "m", count, layered=True)] == ["resid_post"]


def test_same_cells_of_no_steps_is_nothing():
    assert same_cells([{"step": 0, "method": "m", "layer": 0, "site": "a"}], []) == ([], [])


def test_same_cells_keeps_the_cells_of_every_step_and_lists_the_others_sorted():
    rows = [
        {"step": 0, "method": "pca", "layer": 1, "site": "a", "value": 1.0},
        {"step": 10, "method": "pca", "layer": 1, "site": "a", "value": 2.0},
        {"step": 10, "method": "pca", "layer": 0, "site": "a", "value": 3.0},
        {"step": 0, "method": "ica", "layer": 0, "site": "a", "value": 4.0},
        {"step": 20, "method": "nmf", "layer": 0, "site": "a", "value": 5.0},
    ]
    kept, dropped = same_cells(rows, [0, 10])
    assert [r["value"] for r in kept] == [1.0, 2.0]
    assert dropped == [("ica", 0, "a"), ("pca", 0, "a")]
    # the left-out cells sorted as text (a layer None among numbers): L1, L10, L2, …
    ragged = [{"step": 0, "method": "m", "layer": k, "site": "a"} for k in (2, 10, 1, 4, 3, None)]
    _, dropped = same_cells(
        [*ragged, {"step": 10, "method": "x", "layer": 0, "site": "a"}], [0, 10]
    )
    assert [c[1] for c in dropped] == [1, 10, 2, 3, 4, None, 0]
    assert mean_by([*kept, {**rows[0], "value": 3.0}], "step") == {0: 2.0, 10: 2.0}
    assert list(mean_by([{"k": 2, "value": 1.0}, {"k": 1, "value": 1.0}], "k")) == [1, 2]


# -------------------------------------------------------------------- tangent_energy verdict


def _energy(at: dict[int, tuple[float, float, float]]) -> list[dict[str, Any]]:
    """``energy_ratio`` rows: step → (value, low, high)."""
    return [
        _row("tangent_energy", "energy_ratio", s, v, method="pca", rank=4, ci=(lo, hi))
        for s, (v, lo, hi) in at.items()
    ]


def _energy_holds(at: dict[int, tuple[float, float, float]]) -> bool | None:
    (finding,) = tangent_energy.findings(_energy(at))
    return finding.holds


def _point(v: float) -> tuple[float, float, float]:
    return (v, v, v)


def test_early_is_within_30_percent_of_the_last_steps_tokens_inclusive():
    good = (3.0, 2.9, 3.1)
    assert _energy_holds({0: _point(1.0), 30: good, 100: _point(1.0)}) is True  # 30 % exactly
    (late,) = tangent_energy.findings(_energy({0: _point(1.0), 31: good, 100: _point(1.0)}))
    assert late.holds is None and late.evidence.startswith("no scored step between")


def test_an_early_interval_whose_lower_end_is_1_is_not_above_1():
    at = {0: _point(0.5), 10: (3.0, 1.0, 3.1), 100: _point(0.5)}
    assert _energy_holds(at) is False
    at[10] = (3.0, 1.0 + 1e-9, 3.1)
    assert _energy_holds(at) is True


def test_an_early_mean_of_exactly_1_5_is_not_well_above_1():
    at = {0: _point(1.0), 10: (1.5, 1.45, 1.55), 100: _point(1.0)}
    assert _energy_holds(at) is False
    at[10] = (1.5 + 1e-9, 1.45, 1.55)
    assert _energy_holds(at) is True


def _two_sd_below(value: float, low: float) -> float:
    """The value that lies exactly 2.0 sd (of the difference) below ``value`` with ``low``
    when its own interval is a point."""
    return value - 2 * ((value - low) / Z_95)


def test_early_above_the_baseline_by_exactly_2_sd_holds():
    early = (3.0, 2.75, 3.25)
    base = _two_sd_below(3.0, 2.75)
    assert sds_apart(Estimate(*early), Estimate(base, base, base)) == 2.0  # exactly on the edge
    assert _energy_holds({0: _point(base), 10: early, 100: _point(1.0)}) is True
    assert _energy_holds({0: _point(base + 1e-9), 10: early, 100: _point(1.0)}) is False


def test_early_above_the_last_step_by_exactly_2_sd_holds():
    early = (3.0, 2.75, 3.25)
    late = _two_sd_below(3.0, 2.75)
    assert _energy_holds({0: _point(1.0), 10: early, 100: _point(late)}) is True
    assert _energy_holds({0: _point(1.0), 10: early, 100: _point(late + 1e-9)}) is False


def test_an_energy_row_missing_either_end_of_its_interval_is_not_testable():
    for ci_low, ci_high in ((None, 3.1), (2.9, None)):
        rows = _energy({0: (1.0, 0.9, 1.1), 10: (3.0, 2.9, 3.1), 100: (1.0, 0.9, 1.1)})
        rows[1] = {**rows[1], "ci_low": ci_low, "ci_high": ci_high}
        (finding,) = tangent_energy.findings(rows)
        assert finding.holds is None and "carry no interval" in finding.evidence


def test_the_mean_direction_is_reported_beside_the_verdict_not_in_it():
    rows = _energy({0: (1.0, 0.9, 1.1), 10: (3.0, 2.9, 3.1), 100: (1.0, 0.9, 1.1)})
    # m̂ at 1.0 early and 5.0 late would break "smaller late" if it were averaged in
    rows += [
        _row("tangent_energy", "energy_ratio", s, v, method="mean_direction", rank=1,
             ci=(v - 0.1, v + 0.1))
        for s, v in {0: 1.2, 10: 1.0, 100: 5.0}.items()
    ]  # fmt: skip
    (finding,) = tangent_energy.findings(rows)
    assert finding.holds is True
    assert finding.evidence.endswith(
        "mean over the same 1 (method, layer, site) at every compared step (mean direction m̂, "
        "rank 1: 1.20 at step 0 (init), 5.00 at step 100)"
    )
    # two steps of the proxy (m̂ aside) are too few, whatever m̂ has
    only = [r for r in rows if r["method"] == "mean_direction" or r["step"] != 10]
    (finding,) = tangent_energy.findings(only)
    assert finding.holds is None and finding.evidence.startswith("2 scored steps")


def test_unknown_tokens_name_the_first_step_without_them():
    rows = _energy({0: (1.0, 0.9, 1.1), 10: (3.0, 2.9, 3.1), 100: (1.0, 0.9, 1.1)})
    rows = [{**r, "tokens_seen": None} if r["step"] in (10, 100) else r for r in rows]
    (finding,) = tangent_energy.findings(rows)
    assert finding.evidence == 'tokens seen unknown at step 10: "early" cannot be defined'


# ---------------------------------------------------------------- frequency_geometry verdict


def _frequency(
    at: dict[int, float], null: dict[int, tuple[float, float]], **cell: Any
) -> list[dict[str, Any]]:
    """Pearson rows (step → value) and their shuffle nulls (step → (mean, sd))."""
    name = "frequency_geometry"
    out = [_row(name, "freq_distance_pearson", s, v, **dict(cell)) for s, v in at.items()]
    for s, (mean, sd) in null.items():
        out += [
            _row(name, "freq_distance_pearson_null_mean", s, mean, **dict(cell)),
            _row(name, "freq_distance_pearson_null_std", s, sd, **dict(cell)),
        ]
    return out


def _frequency_finding(rows: list[dict[str, Any]]) -> Finding:
    (finding,) = frequency_geometry.findings(rows)
    return finding


def test_a_correlation_of_exactly_0_is_not_negative():
    null = {0: (0.5, 0.1), 100: (0.5, 0.1)}
    assert _frequency_finding(_frequency({0: 0.9, 10: 0.5, 100: 0.0}, null)).holds is False
    assert _frequency_finding(_frequency({0: 0.9, 10: 0.5, 100: -1e-9}, null)).holds is True


def test_a_correlation_exactly_2_null_sd_below_its_null_is_not_beyond_it():
    null = {0: (0.0, 0.25), 100: (0.0, 0.25)}
    edge = _frequency_finding(_frequency({0: 0.5, 10: 0.0, 100: -0.5}, null))
    assert edge.holds is False and "(effect -2.0 null sd)" in edge.evidence
    past = _frequency({0: 0.5, 10: 0.0, 100: -0.5 - 1e-9}, null)
    assert _frequency_finding(past).holds is True


def test_a_change_of_exactly_2_sd_from_the_baseline_holds():
    # the baseline's null sd 0: the change's sd is the last step's, 0.25; −0.5 → −1.0 is 2.0
    null = {0: (0.0, 0.0), 100: (0.0, 0.25)}
    edge = _frequency_finding(_frequency({0: -0.5, 10: -0.6, 100: -1.0}, null))
    assert edge.holds is True and "(change -2.0 null sd;" in edge.evidence
    short = _frequency_finding(_frequency({0: -0.5 - 1e-9, 10: -0.6, 100: -1.0}, null))
    assert short.holds is False


def test_null_sds_of_0_read_any_change_as_infinitely_many_sd():
    null = {0: (0.0, 0.0), 100: (0.0, 0.0)}
    moved = _frequency_finding(_frequency({0: 0.0, 10: -0.1, 100: -0.5}, null))
    assert moved.holds is True
    assert "(effect -0.500, null sd 0)" in moved.evidence
    assert "(change -0.500, null sd 0;" in moved.evidence
    still = _frequency_finding(_frequency({0: -0.5, 10: -0.1, 100: -0.5}, null))
    assert still.holds is False


def test_a_shuffle_null_needs_its_mean_and_its_sd_at_both_steps():
    rows = _frequency({0: 0.0, 10: -0.2, 100: -0.5}, {0: (0.0, 0.1), 100: (0.0, 0.1)})
    no_sd = [r for r in rows if r["metric"] != "freq_distance_pearson_null_std"]
    assert _frequency_finding(no_sd).evidence.startswith("no shuffle null at step 100")
    no_mean = [r for r in rows if r["metric"] != "freq_distance_pearson_null_mean"]
    assert _frequency_finding(no_mean).evidence.startswith("no shuffle null at step 100")
    no_base = [r for r in rows if not (r["step"] == 0 and "null" in r["metric"])]
    assert _frequency_finding(no_base).evidence.startswith("no shuffle null at step 0 ")
    # a null at step 10 does not stand for the baseline's
    moved = no_base + _frequency({}, {10: (0.0, 0.1)})
    assert _frequency_finding(moved).evidence.startswith("no shuffle null at step 0 ")


def test_the_frequency_evidence_counts_sites():
    null = {0: (0.0, 0.1), 100: (0.0, 0.1)}
    rows = _frequency({0: 0.0, 10: -0.2, 100: -0.5}, null)
    rows += _frequency({0: 0.0, 10: -0.2, 100: -0.7}, null, layer=1)
    finding = _frequency_finding(rows)
    assert finding.evidence.startswith("Pearson at step 100, mean over 2 sites: -0.600;")


# ----------------------------------------------------------------- shape_of_learning verdicts


def _bell(profiles: dict[int, tuple[float, ...]]) -> Finding:
    rows = [
        _row("shape_of_learning", "centred_anisotropy", step, v, layer=k)
        for step, profile in profiles.items()
        for k, v in enumerate(profile)
    ]
    (bell,) = shape_of_learning.findings(rows)
    return bell


def test_a_bell_that_did_not_grow_does_not_hold():
    same = (0.1, 0.3, 0.1)
    assert _bell({0: same, 10: same, 100: same}).holds is False
    assert _bell({0: (0.1, 0.3 - 1e-9, 0.1), 10: same, 100: same}).holds is True


def test_a_bell_stands_above_the_larger_of_its_end_layers():
    # at step 100 the interior 0.4 stands 0.05 above the last layer's 0.35 (0.3 above the
    # first's); at the baseline 0.1 above both ends: it shrank
    bell = _bell({0: (0.1, 0.2, 0.1), 10: (0.1, 0.2, 0.1), 100: (0.1, 0.4, 0.35)})
    assert bell.holds is False
    mirrored = _bell({0: (0.1, 0.2, 0.1), 10: (0.1, 0.2, 0.1), 100: (0.35, 0.4, 0.1)})
    assert mirrored.holds is False
    # the highest interior layer is the bell's top: 0.3 at L2 over ends 0.1 (L1 has none)
    wide = _bell({0: (0.1, 0.1, 0.12, 0.1), 10: (0.1, 0.1, 0.12, 0.1), 100: (0.1, 0.1, 0.3, 0.1)})
    assert wide.holds is True and "peak at L2" in wide.evidence


def test_a_monotonic_profile_peaks_at_an_end_and_does_not_hold():
    bell = _bell({0: (0.1, 0.1, 0.1), 10: (0.1, 0.2, 0.3), 100: (0.1, 0.2, 0.3)})
    assert bell.holds is False and "peak at L2" in bell.evidence


def _rise(by_step: dict[int, float]) -> Finding:
    rows = [_row("shape_of_learning", "twonn_dimension", s, v) for s, v in by_step.items()]
    (rise,) = shape_of_learning.findings(rows)
    return rise


def test_a_rise_of_exactly_5_percent_over_the_baseline_is_not_a_rise():
    assert 1.05 * 20.0 == 21.0  # the edge is exact in floating point
    assert _rise({0: 20.0, 10: 21.0, 100: 10.0}).holds is False
    assert _rise({0: 20.0, 10: 21.0 + 1e-9, 100: 10.0}).holds is True


def test_a_fall_of_exactly_5_percent_below_the_peak_is_not_a_fall():
    assert 21.0 / 1.05 == 20.0
    assert _rise({0: 10.0, 10: 21.0, 100: 20.0}).holds is False
    assert _rise({0: 10.0, 10: 21.0, 100: 20.0 - 1e-9}).holds is True


def test_a_dimension_still_rising_at_the_last_step_does_not_hold():
    rise = _rise({0: 10.0, 10: 20.0, 100: 30.0})
    assert rise.holds is False and rise.evidence.endswith("peak at step 100")
    assert shape_of_learning.findings([]) == []
