"""Per-sequence energy sums gathered during a real capture (a proxy known in advance, as under
``frozen_early``) against a brute force over the explicit gradient rows, and the probe's
intervals built from them (issue 11, item 8)."""

from __future__ import annotations

import pytest
import torch

from tangentlens.capture import (
    CaptureConfig,
    StatisticsConfig,
    capture_batch,
    capture_statistics,
)
from tangentlens.capture.captured import Capture
from tangentlens.core.resolve import resolve
from tangentlens.data import (
    FrequencyTable,
    decoder_special_ids,
    iter_batches,
    pack_causal,
    tokenize_corpus,
)
from tangentlens.metrics import drift_regression
from tangentlens.models import lens_model
from tangentlens.probes import tangent_energy
from tangentlens.proxies import (
    ProxyConfig,
    exchangeable_excluded,
    fit_proxies,
    sequence_energy_config,
)
from tests.integration.bridge_parity import within

N_BINS, SEQ_LEN, BATCH = 3, 32, 10
#: The control frames per measurement and their seed (the proxies stage's draws and seed).
DRAWS, SEED = 16, 2


@pytest.fixture(scope="module")
def setup(micro_pythia):
    step = micro_pythia.steps[-1]
    model = micro_pythia.load(step)
    tokenizer = micro_pythia.tokenizer()
    docs = tokenize_corpus(micro_pythia.analysis_corpus(), lambda t: tokenizer(t)["input_ids"])
    rows = pack_causal(docs, SEQ_LEN, eos_id=0)[:48]
    frequencies = FrequencyTable.from_tokens(rows, vocab_size=model.cfg.d_vocab)
    sites = tuple(lens_model(model).residual_sites())
    layers = {site: layer for layer, site in enumerate(sites)}
    capture = CaptureConfig(sites=sites)
    # the proxies are known before the scored capture: fitted on another capture's activations
    early = capture_statistics(
        model,
        iter_batches(rows[24:], 8),
        CaptureConfig(sites=sites, gradients=False),
        decoder_special_ids(),
        StatisticsConfig(gradients=False, reservoir_size=2048),
    )
    config = ProxyConfig(methods=("pca", "seminmf"), rank=4)
    proxies = {name: fit_proxies(site, config).bases for name, site in early.sites.items()}
    energy_config = tangent_energy.TangentEnergyConfig(bootstrap=200)
    spec = sequence_energy_config(proxies, N_BINS, SEQ_LEN)
    statistics = StatisticsConfig(n_bins=N_BINS, reservoir_size=256, sequence_energy=spec)
    bins = frequencies.bins(N_BINS)
    stats = capture_statistics(
        model,
        iter_batches(rows, BATCH),
        capture,
        decoder_special_ids(),
        statistics,
        bins=bins,
        step=step,
    )
    data = Capture("micro-pythia", step, 0, stats, layers, SEQ_LEN, frequencies)
    return model, rows, capture, bins, proxies, energy_config, data


def test_sums_gathered_during_capture_equal_explicit_rows(setup):
    model, rows, capture, bins, proxies, _, data = setup
    site = "blocks.1.hook_resid_post"
    energy = data.statistics.sites[site].sequence_energy
    # brute force: every kept row of every batch, its sequence and bin; for a proxy avoiding
    # m̂ the rows beyond the drift r = g − b (m̂ᵀg), b their least-squares coefficient on the
    # drift coordinate; the controls' exact mean energies k/(d − r) · (‖r‖² − ‖Xᵀr‖²)
    g_rows, seq_rows, bin_rows = [], [], []
    for start in range(0, len(rows), BATCH):
        tokens = torch.as_tensor(rows[start : start + BATCH])
        batch = capture_batch(model, tokens, capture, decoder_special_ids())
        _, g = batch.rows(site)
        sequence = torch.arange(start, start + len(batch.keep))[:, None].expand_as(batch.keep)
        g_rows.append(g.double())
        seq_rows.append(sequence[batch.keep])
        bin_rows.append(bins.assign(batch.tokens[batch.keep]))
    g, sequence, token_bin = torch.cat(g_rows), torch.cat(seq_rows), torch.cat(bin_rows)
    assert energy.sequences.tolist() == torch.unique(sequence).tolist()
    one_hot = (sequence[:, None] == energy.sequences[None, :]).double()  # (rows, S)
    for method, proxy in proxies[site].items():
        for bin_index in [None, *range(N_BINS)]:
            mask = torch.ones_like(sequence, dtype=torch.bool)
            if bin_index is not None:
                mask = token_bin == bin_index
            x = g * mask[:, None]
            d, k = proxy.shape
            m = exchangeable_excluded(proxies[site], method)
            total = one_hot.T @ (x**2).sum(dim=1)
            b = None
            if m is not None:
                drift = x @ m.double()  # (rows, 1)
                b = (x.T @ drift)[:, 0] / float(drift.T @ drift)
                x = x - drift * b
            r = 0 if m is None else 1
            along_q = ((x @ proxy.double()) ** 2).sum(dim=1)
            inside = one_hot.T @ along_q
            control = k / (d - r) * (one_hot.T @ (x**2).sum(dim=1))
            complement = k / (d - r - k) * (one_hot.T @ ((x**2).sum(dim=1) - along_q))
            got = energy.sums(method, bin_index, b)
            torch.testing.assert_close(got.total, total, rtol=1e-9, atol=1e-12)
            torch.testing.assert_close(got.inside, inside, rtol=1e-9, atol=1e-12)
            torch.testing.assert_close(got.control, control, rtol=1e-9, atol=1e-12)
            torch.testing.assert_close(got.complement, complement, rtol=1e-9, atol=1e-12)


def test_probe_intervals_resample_every_sequence_and_contain_their_point(setup):
    *_, proxies, config, data = setup
    assert tangent_energy.interval_source(data) == tangent_energy.INTERVAL_ALL_SEQUENCES
    rows = tangent_energy.rows(data, proxies, config, draws=DRAWS, seed=SEED)
    with_ci = [r for r in rows if r["ci_low"] is not None]
    assert {r["metric"] for r in with_ci} == {
        "energy_fraction",
        "energy_ratio",
        "energy_complement_ratio",
    }
    n_proxies = sum(len(methods) for methods in proxies.values())  # sites × methods
    assert len(with_ci) == 3 * n_proxies * (N_BINS + 1)
    for r in with_ci:
        assert r["ci_low"] <= r["value"] <= r["ci_high"], r
        assert r["ci_low"] < r["ci_high"], r
    # the bootstrap's own point value is the reported energy fraction
    for r in with_ci:
        if r["metric"] != "energy_fraction":
            continue
        energy = data.statistics.sites[r["site"]].sequence_energy
        b = None if r["freq_bin"] == "all" else int(r["freq_bin"])
        m = exchangeable_excluded(proxies[r["site"]], r["method"])
        coefficient = None
        if m is not None:  # the bin's drift regression, as the probe fits it
            stats = data.statistics.sites[r["site"]]
            moment = (stats.g if b is None else stats.g_bins[b]).second_moment
            coefficient = drift_regression(moment, m[:, 0]).coefficient
        inside, total, *_ = energy.sums(r["method"], b, coefficient)
        assert float(inside.sum() / total.sum()) == pytest.approx(r["value"], rel=1e-10)
        assert energy.n_sequences == 48


def test_the_refit_beside_the_probes_gives_the_rows_of_a_refit_in_line(setup, monkeypatch):
    """With frozen proxies the step's own fit (read by ``subspace_stability``) runs on a second
    thread beside the other probes: the same rows, in the same order, and the same own fit as
    when it runs in line before them."""
    import contextlib
    import dataclasses
    import functools
    import threading

    from tangentlens import runtime
    from tangentlens.core import step as step_module
    from tangentlens.core.recipe import load_recipe

    *_, proxies, config, data = setup
    recipe = load_recipe(
        "quickstart",
        [
            f"data.n_bins={N_BINS}",
            f"data.seq_len={SEQ_LEN}",
            "proxies.methods=['pca', 'seminmf']",
            "proxies.rank=4",
            f"proxies.draws={DRAWS}",
            f"proxies.seed={SEED}",
            f"probes.tangent_energy.bootstrap={config.bootstrap}",
        ],
    )
    kept = ("tangent_energy", "anisotropy_share", "subspace_stability")
    recipe = dataclasses.replace(recipe, probes={k: recipe.probes[k] for k in kept})
    fitted_on: list[bool] = []
    real_fit = step_module.fit_step

    def recording_fit(*args, **kwargs):
        fitted_on.append(threading.current_thread() is threading.main_thread())
        return real_fit(*args, **kwargs)

    monkeypatch.setattr(step_module, "fit_step", recording_fit)
    with runtime.threads(2):
        beside, own_beside = step_module.step_rows(resolve(recipe), data, frozen=proxies)

    @contextlib.contextmanager
    def in_line(task):
        yield functools.cache(task)

    monkeypatch.setattr(step_module, "alongside", in_line)
    with runtime.threads(2):
        before, own_before = step_module.step_rows(resolve(recipe), data, frozen=proxies)
    assert fitted_on == [False, True]  # a second thread, then the main one
    assert {r["probe"] for r in beside} >= {"subspace_stability", "tangent_energy"}
    # the same rows in the same order; the values within float64 reordering: beside the fit the
    # probes run on one thread less (runtime.alongside), and the BLAS may split a product
    # otherwise on one thread than on two (seen: 12 of 662 rows a float64 ulp apart under MKL's
    # AVX2 kernels) — tests.integration.bridge_parity's classes: counts equal, float64 closed
    # forms within 1e-12 + 1e-9·|a|, the own fit (a single-threaded loop) equal below
    values = ("value", "ci_low", "ci_high")
    labels = [{k: v for k, v in r.items() if k not in values} for r in beside]
    assert labels == [{k: v for k, v in r.items() if k not in values} for r in before]
    for a, b in zip(beside, before, strict=True):
        assert all(within(a[f], b[f], b) for f in values), (a, b)
    assert own_beside.keys() == own_before.keys() == proxies.keys()
    for site, methods in own_before.items():
        for method, basis in methods.items():
            assert torch.equal(own_beside[site][method], basis)
