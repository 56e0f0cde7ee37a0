"""The reproduction summary states each finding from the rows, whichever way it comes out."""

from tangentlens.report.reproduction import reproduction_summary


def _row(probe, metric, step, value, layer=0, freq_bin="all"):
    return {
        "probe": probe,
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
        _row("tangent_energy", "energy_ratio", s, v) for s, v in [(0, 9.0), (10, 3.0), (100, 1.2)]
    ]
    rows += [_row("frequency_geometry", "freq_distance_spearman", 100, -0.5)]
    findings = reproduction_summary(rows)
    assert [f.holds for f in findings] == [True, True, True, True]
    assert "peak at L1" in findings[0].evidence


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
    rows += [_row("frequency_geometry", "freq_distance_spearman", 100, 0.2)]
    assert [f.holds for f in reproduction_summary(rows)] == [False, False, False, False]
    assert reproduction_summary([]) == []
