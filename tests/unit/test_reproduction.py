"""The reproduction summary states each finding from the rows, whichever way it comes out."""

from tangentlens.report.reproduction import reproduction_summary


def _row(probe, metric, step, value, layer=0, freq_bin="all", method="pca"):
    return {
        "probe": probe,
        "method": method,
        "metric": metric,
        "step": step,
        "value": value,
        "layer": layer,
        "freq_bin": freq_bin,
    }


def test_findings_hold_on_rows_that_show_them():
    rows = [
        _row("shape_of_learning", "centred_anisotropy", 100, v, layer=k)
        for k, v in enumerate([0.1, 0.3, 0.2])
    ]
    rows += [
        _row("shape_of_learning", "twonn_dimension", s, v)
        for s, v in [(0, 10), (10, 20), (100, 12)]
    ]
    rows += [
        _row("tangent_energy", "energy_ratio", s, v) for s, v in [(0, 2.0), (10, 3.0), (100, 1.2)]
    ]
    rows += [_row("frequency_geometry", "freq_distance_pearson", 100, -0.5)]
    findings = reproduction_summary(rows)
    assert [f.holds for f in findings] == [True, True, True, True]
    assert "peak at L1" in findings[0].evidence
    assert "over steps [10]: 3.00" in findings[2].evidence  # step 0 is the baseline, not "early"


def test_an_energy_ratio_already_high_at_initialisation_is_not_credited_to_training():
    rows = [
        _row("tangent_energy", "energy_ratio", s, v) for s, v in [(0, 9.0), (10, 3.0), (100, 1.2)]
    ]
    (energy,) = reproduction_summary(rows)
    assert not energy.holds
    assert energy.evidence == (
        "mean energy ratio over steps [10]: 3.00; at step 100: 1.20; at step 0 (init): 9.00"
    )


def test_findings_that_do_not_hold_are_reported_as_such():
    rows = [
        _row("shape_of_learning", "centred_anisotropy", 100, v, layer=k)
        for k, v in enumerate([0.1, 0.2, 0.3])
    ]
    rows += [
        _row("shape_of_learning", "twonn_dimension", s, v)
        for s, v in [(0, 20), (10, 20.5), (100, 5)]
    ]
    rows += [
        _row("tangent_energy", "energy_ratio", s, v) for s, v in [(0, 1.1), (10, 1.2), (100, 3.0)]
    ]
    # the rank-1 mean direction is not a tangent proxy: its large early ratio must not count
    rows += [
        _row("tangent_energy", "energy_ratio", s, v, method="mean_direction")
        for s, v in [(0, 50.0), (10, 40.0), (100, 2.0)]
    ]
    rows += [
        _row("frequency_geometry", "freq_distance_pearson", s, v)
        for s, v in [(0, 0.01), (100, 0.2)]
    ]
    findings = reproduction_summary(rows)
    assert [f.holds for f in findings] == [False, False, False, False]
    assert (
        "mean direction m̂, rank 1: 50.00 at step 0 (init), 2.00 at step 100" in findings[2].evidence
    )
    assert "at step 0 (init): 0.01" in findings[3].evidence
    assert reproduction_summary([]) == []
