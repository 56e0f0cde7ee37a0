"""The tangent-energy and anisotropy-share probes on statistics captured from the micro suite."""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import pytest

from tangentlens.capture import RowReservoir
from tangentlens.core.proxy_stage import ProxiesSpec
from tangentlens.probes import anisotropy_share, tangent_energy
from tangentlens.proxies import ProxyConfig, fit_proxies
from tangentlens.results import REPLICATE_FIELDS, ROW_FIELDS


def _proxies(micro_step_data, methods=("seminmf", "pca"), rank=4):
    config = ProxyConfig(methods=methods, rank=rank, mean_direction=False)
    sites = micro_step_data.statistics.sites
    return {name: fit_proxies(site, config).bases for name, site in sites.items()}


def test_tangent_energy_rows(micro_step_data):
    config = tangent_energy.TangentEnergyConfig(bootstrap=50, data_matched_m=12)
    proxies = _proxies(micro_step_data)
    rows = tangent_energy.rows(micro_step_data, proxies, config, draws=30)
    assert rows and all(tuple(r) == ROW_FIELDS for r in rows)
    table = {(r["site"], r["method"], r["freq_bin"], r["metric"]): r for r in rows}
    sites = list(micro_step_data.statistics.sites)
    assert {k[2] for k in table} == {"all", "0", "1", "2"}
    d = 32
    for site in sites:
        for method in ("seminmf", "pca"):
            for b in ("all", "0", "1", "2"):
                e = table[(site, method, b, "energy_fraction")]
                p = table[(site, method, b, "energy_p_value")]["value"]
                null = table[(site, method, b, "energy_null_mean")]["value"]
                mean = table[(site, method, b, "energy_control_mean")]["value"]
                std = table[(site, method, b, "energy_control_std")]["value"]
                assert 0 < e["value"] < 1 and 1 / 31 <= p <= 1
                # no m̂ projected out (mean_direction = False): exchangeable frames in ℝ^d
                assert null == pytest.approx(4 / d, rel=1e-12)
                assert abs(mean - null) < 5 * std / math.sqrt(30) + 1e-12
                complement = table[(site, method, b, "energy_complement_null_mean")]["value"]
                assert complement == pytest.approx(4 / (d - 4) * (1 - e["value"]), rel=1e-10)
                assert e["layer"] == sites.index(site) and e["rank"] == 4
                ratio = table[(site, method, b, "energy_ratio")]
                # every interval describes (and contains) its own reported value
                assert e["ci_low"] <= e["value"] <= e["ci_high"] <= 1, e
                assert 0 < ratio["ci_low"] <= ratio["value"] <= ratio["ci_high"], ratio
    assert table[(sites[0], "pca", "all", "energy_fraction")]["n_tokens"] == (
        micro_step_data.statistics.n_tokens
    )
    # no per-sequence sums in this capture: the intervals come from the reservoir's sample
    assert tangent_energy.interval_source(micro_step_data) == tangent_energy.INTERVAL_SAMPLE
    again = tangent_energy.rows(micro_step_data, proxies, config, draws=30)
    assert [r["value"] for r in again] == [r["value"] for r in rows]  # same seed, same numbers


def _with_reservoir(data, capacity):
    """The step's statistics with each site's reservoir cut to ``capacity`` rows — exactly the
    sample a capture with that capacity keeps (bottom-k of the same seeded priorities)."""
    sites = {}
    for name, site in data.statistics.sites.items():
        small = copy.copy(site)
        small.reservoir = RowReservoir(capacity, site.reservoir.seed)
        small.reservoir.add(site.reservoir.ids, site.reservoir.columns())
        sites[name] = small
    statistics = dataclasses.replace(data.statistics, sites=sites)
    return dataclasses.replace(data, statistics=statistics)


def test_every_energy_interval_contains_its_point_value(micro_step_data):
    """As in the micro sweep recipe (a 512-row reservoir out of ~2 900 kept rows, 20 bootstrap
    replicates), the interval comes from a sample while the point value uses every token: it
    must still be the reported value's interval. (Before the fix, 2 of these 32 excluded it.)"""
    data = _with_reservoir(micro_step_data, 512)
    config = tangent_energy.TangentEnergyConfig(bootstrap=20)
    rows = tangent_energy.rows(data, _proxies(data), config, draws=20)
    with_ci = [r for r in rows if r["ci_low"] is not None]
    assert len(with_ci) == 2 * 2 * 3 * 4  # sites × methods × (fraction, both ratios) × bins
    outside = [r for r in with_ci if not r["ci_low"] <= r["value"] <= r["ci_high"]]
    assert not outside, outside


def test_anisotropy_share_rows(micro_step_data):
    rows = anisotropy_share.rows(
        micro_step_data,
        _proxies(micro_step_data, ("pca",)),
        anisotropy_share.AnisotropyShareConfig(5),
        draws=30,
    )
    values = {(r["site"], r["freq_bin"], r["metric"]): r["value"] for r in rows}
    assert len(values) == 2 * 4 * 10
    assert all(np.isfinite(v) for v in values.values())
    for (_, _, metric), v in values.items():
        if metric == "anisotropy_share_spectral_p_value":
            assert round(v * 31) == pytest.approx(v * 31)  # a count over 30 draws + 1
        if metric == "delta_isoscore_star_p_value":
            assert round(v * 6) == pytest.approx(v * 6)  # over the first 5 draws + 1


def test_probe_configs_reject_bad_values():
    with pytest.raises(ValueError, match=r"unknown method 'ica'.*did you mean 'pca'"):
        ProxyConfig(methods=("ica",))
    with pytest.raises(ValueError, match="methods must be distinct names"):
        ProxyConfig(methods=("pca", "pca"))
    with pytest.raises(ValueError, match="draws must be an integer ≥ 1"):
        ProxiesSpec(draws=0)
    with pytest.raises(ValueError, match="data_matched_m must be an integer ≥ 2"):
        tangent_energy.TangentEnergyConfig(data_matched_m=1)
    with pytest.raises(ValueError, match="zeta"):
        anisotropy_share.AnisotropyShareConfig(zeta=2.0)


def test_kept_replicates_are_one_record_per_interval_and_give_its_bounds(micro_step_data):
    """With a sink, every row with an interval has one replicate record (its labels, ``bootstrap``
    values); under the percentile method the interval's bounds are the record's percentiles
    (the rescaling onto the reported value is applied to both), and keeping them changes no row."""
    config = tangent_energy.TangentEnergyConfig(
        bootstrap=100, interval="percentile", keep_replicates=True
    )
    proxies = _proxies(micro_step_data)
    sink: list[dict] = []
    rows = tangent_energy.rows(micro_step_data, proxies, config, replicates=sink, draws=20)
    assert rows == tangent_energy.rows(micro_step_data, proxies, config, draws=20)
    with_ci = {tuple(r[f] for f in REPLICATE_FIELDS): r for r in rows if r["ci_low"] is not None}
    records = {tuple(r[f] for f in REPLICATE_FIELDS): r["replicates"] for r in sink}
    assert len(with_ci) == 2 * 2 * 3 * 4 and records.keys() == with_ci.keys()
    for key, values in records.items():
        row = with_ci[key]
        assert len(values) == 100
        # Hall's rule: the (B + 1)·p-th order statistic, 2.525th and 98.475th of 100
        v = np.sort(values)
        low, high = v[1] + 0.525 * (v[2] - v[1]), v[97] + 0.475 * (v[98] - v[97])
        assert min(low, row["value"]) == pytest.approx(row["ci_low"], rel=1e-9)
        assert max(high, row["value"]) == pytest.approx(row["ci_high"], rel=1e-9)
