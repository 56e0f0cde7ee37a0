"""Under ``held_out = true`` a step unit fits each proxy on the first half of the analysis rows and
scores the second half (a proxy fitted on the half it scores is an in-sample measurement).

Planted: the two halves hold disjoint, repetitive token content (each first-half row alternates
two types of 2–25, every second-half row the same two types of 26–49), so a PCA proxy fitted on
the scored half spans other directions than one fitted on the first half: on this random model it
reads an energy fraction of 0.21–0.30 in-sample against 0.03–0.04 held out. The expected
fraction is computed by hand: the two halves captured as the unit captures them, PCA fitted on
the first (the library's fit), and tr(Qᵀ M Q) / tr(M) with M the second half's gradient second
moment. The energy fraction does not depend on the control frames. ``tangentlens.measure`` offers
the same held-out fit (``fit={"held_out": True}``): its rows are the step unit's.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import tangentlens as tl
from tangentlens.core.data import AnalysisData
from tangentlens.core.recipe import CaptureSpec, DataSpec, ProxiesSpec, Recipe, SuiteSpec
from tangentlens.core.resolve import resolve
from tangentlens.core.step import capture_sites, capture_step, fit_step
from tangentlens.data import FrequencyTable, SpecialTokens, decoder_special_ids
from tangentlens.models import lens_model
from tangentlens.models.facts import model_facts
from tangentlens.probes.tangent_energy import TangentEnergyConfig
from tangentlens.sweep import units
from tangentlens.sweep.plan import Unit
from tangentlens.sweep.store import RunStore, read_parts

STEP, N_ROWS, SEQ_LEN, N_BINS = 7, 32, 16, 2
#: The proxies stage: PCA fitted on each step's first half, scored on the second.
STAGE = {
    "methods": ["pca"],
    "rank": 3,
    "fit_policy": "per_checkpoint",
    "held_out": True,
    "draws": 10,
}


class _OneModelSuite:
    """The suite a step unit loads its model from: one (random, float64) model at every step."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def load(self, step, *, device="cpu", dtype=None, loader=None):
        return self.model

    def tokens_seen(self, step):
        return 1000 * step


def _planted_data(vocab: int) -> AnalysisData:
    """First half: each row alternates two types of the lower half of the vocabulary; second
    half: every row alternates the same two types of the upper half."""
    rng = np.random.default_rng(1)
    special = decoder_special_ids()
    rows = np.empty((N_ROWS, SEQ_LEN), dtype=np.int64)
    half, middle = N_ROWS // 2, (2 + vocab) // 2
    for i in range(half):
        rows[i] = np.tile(rng.choice(np.arange(2, middle), 2, replace=False), SEQ_LEN // 2)
    pair = rng.choice(np.arange(middle, vocab), 2, replace=False)
    rows[half:] = np.tile(pair, (N_ROWS - half, SEQ_LEN // 2))
    rows[:, 0] = special.bos_id
    frequencies = FrequencyTable.from_rows(rows, vocab, special, causal=True)
    return AnalysisData(rows, frequencies, frequencies.bins(N_BINS), special, "next_token")


def _recipe() -> Recipe:
    return Recipe(
        name="held-out",
        suite=SuiteSpec(name="tiny", steps=str(STEP)),
        data=DataSpec(seq_len=SEQ_LEN, max_tokens=N_ROWS * SEQ_LEN, batch_size=8, n_bins=N_BINS),
        capture=CaptureSpec(sites=("resid_post",), reservoir=128, threads=1),
        proxies=ProxiesSpec(**STAGE),
        probes={"tangent_energy": TangentEnergyConfig(bootstrap=10)},
    )


def _same(a, b) -> bool:
    return a == b or (
        isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    )


def _fraction(proxies: dict[str, torch.Tensor], moment: torch.Tensor) -> float:
    """The PCA proxy's energy fraction beyond the drift: ``tr(Qᵀ S Q) / tr M`` with ``S`` the
    moment of the gradients with their drift coordinate (along the fit's m̂) regressed out."""
    from tangentlens.metrics import drift_regression

    Q, M = proxies["pca"].double(), moment.double()
    S = drift_regression(M, proxies["mean_direction"][:, 0]).moment
    return float(torch.trace(Q.T @ S @ Q) / torch.trace(M))


def _unit_rows(model, recipe, data, root, monkeypatch) -> tuple[RunStore, Unit, list[dict]]:
    """The step unit's store, the unit and its rows, on ``model`` at every step."""
    monkeypatch.setattr(units, "_suite", lambda recipe: _OneModelSuite(model))
    monkeypatch.setattr(units, "_data", lambda recipe, store: data)
    monkeypatch.setattr(units, "_capture_passes", lambda recipe: 1)
    store = RunStore(root)
    for folder in (store.results, store.state):
        folder.mkdir(parents=True)
    store.write_manifest({})
    unit = Unit(
        name=f"step-{STEP:08d}",
        kind="step",
        step=STEP,
        deps=("data",),
        output=f"results/step-{STEP:08d}.parquet",
        model=True,
    )
    run = resolve(recipe, model_facts(lens_model(model), "tiny", STEP, "next_token"))
    units._step_unit(run, store, unit, lambda text: None)
    return store, unit, read_parts([store.part_path(unit.name)]).to_pylist()


def test_held_out_step_unit_fits_on_the_first_half_and_scores_the_second(
    tiny_decoder, tmp_path, monkeypatch
):
    recipe, data = _recipe(), _planted_data(tiny_decoder.cfg.d_vocab)
    store, unit, rows = _unit_rows(tiny_decoder, recipe, data, tmp_path, monkeypatch)
    got = {
        r["site"]: r
        for r in rows
        if r["probe"] == "tangent_energy"
        and r["metric"] == "energy_fraction"
        and r["freq_bin"] == "all"
        and r["method"] == "pca"
    }

    # by hand: the two halves captured as the unit captures them
    run = resolve(recipe, model_facts(lens_model(tiny_decoder), "tiny", STEP, "next_token"))
    sites = capture_sites(tiny_decoder, run)
    stage = recipe.proxies
    half = N_ROWS // 2
    first, second = (
        capture_step(tiny_decoder, sites, data, run, STEP, part=p)
        for p in (slice(0, half), slice(half, None))
    )
    held_out, in_sample = fit_step(first, stage, {}), fit_step(second, stage, {})
    assert sorted(got) == sorted(sites) and len(sites) == 2
    for site in sites:
        moment = second.sites[site].g.second_moment
        want = _fraction(held_out[site].bases, moment)
        in_sample_value = _fraction(in_sample[site].bases, moment)
        assert in_sample_value - want > 0.05, site  # the planted halves tell the fits apart
        assert got[site]["value"] == pytest.approx(want, rel=1e-9), (site, in_sample_value)
        assert got[site]["n_tokens"] == second.sites[site].g.count  # the second half only
    # the unit's saved proxies are the first half's fit
    saved = torch.load(store.state / f"{unit.name}.pt", weights_only=True)["proxies"]
    for site in sites:
        torch.testing.assert_close(saved[site]["pca"], held_out[site].bases["pca"])


def test_measure_fits_held_out_as_the_step_unit_does(tiny_decoder, tmp_path, monkeypatch):
    """``measure(model, token_ids, fit={"held_out": True})`` gives the step unit's rows, value for
    value; a ``Capture`` (one stream) is refused held out, in one line."""
    recipe, planted = _recipe(), _planted_data(tiny_decoder.cfg.d_vocab)
    # the tokenizer-less model has no special tokens for measure to exclude: neither does the unit
    special = SpecialTokens()
    frequencies = FrequencyTable.from_rows(
        planted.rows, tiny_decoder.cfg.d_vocab, special, causal=True
    )
    data = AnalysisData(planted.rows, frequencies, frequencies.bins(N_BINS), special, planted.loss)
    *_, want = _unit_rows(tiny_decoder, recipe, data, tmp_path, monkeypatch)
    table = tl.measure(
        tiny_decoder,
        torch.from_numpy(data.rows),
        probes={"tangent_energy": {"bootstrap": 10}},
        fit=STAGE,
        frequencies=data.frequencies,
        suite=recipe.suite.name,
        step=STEP,
        tokens_seen=1000 * STEP,
        n_bins=N_BINS,
        batch_size=8,
        sites=["resid_post"],
        reservoir=128,
        threads=1,
    )
    key = ("site", "probe", "method", "freq_bin", "metric")
    got = {tuple(r[k] for k in key): r for r in table.to_arrow().to_pylist()}
    assert got.keys() == {tuple(r[k] for k in key) for r in want}
    for row in want:
        mine = got[tuple(row[k] for k in key)]
        assert all(_same(mine[f], row[f]) for f in row), row
    capture = tl.capture_model(tiny_decoder, torch.from_numpy(data.rows), n_bins=N_BINS)
    with pytest.raises(ValueError, match=r"held_out fits each proxy.*a Capture holds one stream"):
        tl.measure(capture, probes=["tangent_energy"], fit={"held_out": True})
