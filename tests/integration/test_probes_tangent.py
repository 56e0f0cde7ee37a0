"""The tangent-energy and anisotropy-share probes on statistics captured from the micro suite."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tangentlens.probes import anisotropy_share, tangent_energy
from tangentlens.probes.base import ROW_FIELDS, StepData
from tangentlens.probes.proxies import ProxyConfig, fit_proxies

from tangentlens.capture import CaptureConfig, StatisticsConfig, capture_statistics
from tangentlens.data import (
    FrequencyTable,
    decoder_special_ids,
    iter_batches,
    pack_causal,
    tokenize_corpus,
)
from tangentlens.models import residual_sites


@pytest.fixture(scope="module")
def step_data(micro_pythia):
    step = micro_pythia.steps[-1]
    model = micro_pythia.load(step)
    tokenizer = micro_pythia.tokenizer()
    docs = tokenize_corpus(micro_pythia.analysis_corpus(), lambda t: tokenizer(t)["input_ids"])
    rows = pack_causal(docs, 32, eos_id=0)[:96]
    bins = FrequencyTable.from_tokens(rows, vocab_size=model.cfg.d_vocab).bins(3)
    sites = tuple(residual_sites(model))
    stats = capture_statistics(
        model,
        iter_batches(rows, 16),
        CaptureConfig(sites=sites),
        decoder_special_ids(),
        StatisticsConfig(n_bins=3, reservoir_size=2048),
        bins=bins,
    )
    layers = {site: layer for layer, site in enumerate(sites)}
    return StepData("micro-pythia", step, micro_pythia.tokens_seen(step), stats, layers, 32)


def _proxies(step_data, methods=("seminmf", "pca"), rank=4):
    config = ProxyConfig(methods=methods, rank=rank)
    return {name: fit_proxies(site, config) for name, site in step_data.statistics.sites.items()}


def test_tangent_energy_rows(step_data):
    config = tangent_energy.TangentEnergyConfig(draws=30, bootstrap=50, data_matched_m=12)
    proxies = _proxies(step_data)
    rows = tangent_energy.rows(step_data, proxies, config)
    assert rows and all(tuple(r) == ROW_FIELDS for r in rows)
    table = {(r["site"], r["method"], r["freq_bin"], r["metric"]): r for r in rows}
    sites = list(step_data.statistics.sites)
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
                assert null == pytest.approx(4 / (d - 4) * (1 - e["value"]))
                assert abs(mean - null) < 5 * std / math.sqrt(30) + 1e-12
                assert e["layer"] == sites.index(site) and e["rank"] == 4
                if e["ci_low"] is not None:
                    assert e["ci_low"] <= e["ci_high"]
    assert table[(sites[0], "pca", "all", "energy_fraction")]["n_tokens"] == (
        step_data.statistics.n_tokens
    )
    again = tangent_energy.rows(step_data, proxies, config)
    assert [r["value"] for r in again] == [r["value"] for r in rows]  # same seed, same numbers


def test_anisotropy_share_rows(step_data):
    rows = anisotropy_share.rows(
        step_data, _proxies(step_data, ("pca",)), anisotropy_share.AnisotropyShareConfig(5)
    )
    values = {(r["site"], r["freq_bin"], r["metric"]): r["value"] for r in rows}
    assert len(values) == 2 * 4 * 4
    assert all(np.isfinite(v) for v in values.values())
    for key, v in values.items():
        if key[2].startswith("anisotropy_share"):
            assert 0 <= v <= 1


def test_probe_configs_reject_bad_values():
    with pytest.raises(ValueError, match="methods must be distinct names"):
        ProxyConfig(methods=("ica",))
    with pytest.raises(ValueError, match="draws must be an integer ≥ 1"):
        tangent_energy.TangentEnergyConfig(draws=0)
    with pytest.raises(ValueError, match="data_matched_m must be an integer ≥ 2"):
        tangent_energy.TangentEnergyConfig(data_matched_m=1)
    with pytest.raises(ValueError, match="zeta"):
        anisotropy_share.AnisotropyShareConfig(zeta=2.0)
