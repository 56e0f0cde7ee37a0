"""Published SAEs (SAELens' pretrained registry) as tangent proxies, loaded offline from a fake
Hugging Face hub cache: loading, the latent choice, the proxy basis, the checks against the
suite, and a sweep that scores them.

The fake cache holds the registry's real ``pythia-70m-deduped-res-sm`` release (its repo and
folders are read from the installed registry) in the layout SAELens' default loader reads:
``<folder>/cfg.json`` (the pre-6.0 config keys, no ``sae_lens_version``) and
``<folder>/sae_weights.safetensors``, no ``sparsity.safetensors``. The weights are ours: a
standard (ReLU) SAE of width 32 — the micro suite's — with 48 latents, of which ``PLANTED`` are
always active (large encoder bias), ``DECOYS`` active on about half of the rows and the rest
never, so the rule "most often active" must choose exactly ``PLANTED``.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tangentlens.core.recipe import load_recipe
from tangentlens.dictionaries import SAE, check_pretrained
from tangentlens.sweep.runner import SweepFailedError, run_sweep
from tangentlens.sweep.store import read_results

RELEASE = "pythia-70m-deduped-res-sm"
IDS = ("blocks.0.hook_resid_post", "blocks.1.hook_resid_post")
D_IN, D_SAE = 32, 48
PLANTED = (5, 17, 40)
DECOYS = (1, 2, 30, 44)


def _weights(layer: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(layer)
    b_enc = torch.full((D_SAE,), -50.0)
    b_enc[list(PLANTED)] = 50.0
    b_enc[list(DECOYS)] = 0.0
    return {
        "W_enc": 0.1 * torch.randn(D_IN, D_SAE, generator=gen),
        "b_enc": b_enc,
        "W_dec": torch.randn(D_SAE, D_IN, generator=gen),
        "b_dec": torch.zeros(D_IN),
    }


def _cfg(sae_id: str, layer: int) -> dict[str, object]:
    return {
        "architecture": "standard",
        "d_in": D_IN,
        "d_sae": D_SAE,
        "dtype": "float32",
        "device": "cpu",
        "model_name": "pythia-70m-deduped",
        "hook_name": sae_id,
        "hook_layer": layer,
        "hook_head_index": None,
        "activation_fn_str": "relu",
        "apply_b_dec_to_input": True,
        "finetuning_scaling_factor": False,
        "sae_lens_training_version": None,
        "prepend_bos": True,
        "dataset_path": "monology/pile-uncopyrighted",
        "context_size": 128,
        "normalize_activations": "none",
    }


@pytest.fixture(scope="module")
def sae_hub(tmp_path_factory) -> Path:
    """A Hugging Face hub cache holding the release's SAEs ``IDS`` at revision main."""
    from sae_lens.loading.pretrained_saes_directory import get_pretrained_saes_directory

    lookup = get_pretrained_saes_directory()[RELEASE]
    assert lookup.model == "pythia-70m-deduped"
    hub = tmp_path_factory.mktemp("sae-hub") / "hub"
    repo = hub / f"models--{lookup.repo_id.replace('/', '--')}"
    commit = hashlib.sha1(b"fake release").hexdigest()
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    for layer, sae_id in enumerate(IDS):
        folder = repo / "snapshots" / commit / lookup.saes_map[sae_id]
        folder.mkdir(parents=True)
        (folder / "cfg.json").write_text(json.dumps(_cfg(sae_id, layer)))
        save_file(_weights(layer), str(folder / "sae_weights.safetensors"))
    return hub


@pytest.fixture
def offline_hub(sae_hub, monkeypatch):
    """huggingface_hub reads only the fake cache; a network access fails at once."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(sae_hub))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(sae_hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("socket.socket.connect", _refuse_network)
    return sae_hub


def _refuse_network(*args, **kwargs):
    raise OSError("network access attempted in an offline test")


def _projector(rows: torch.Tensor) -> torch.Tensor:
    q, _ = torch.linalg.qr(rows.double().T)
    return q @ q.T


def test_loads_offline_through_saelens(offline_hub):
    import sae_lens

    sae = SAE.from_pretrained(RELEASE, IDS[1], rank=3)
    assert isinstance(sae.sae_, sae_lens.StandardSAE)
    assert (sae.d_in, sae.hook_name, sae.model_name) == (D_IN, IDS[1], "pythia-70m-deduped")
    assert torch.equal(sae.sae_.W_dec.detach(), _weights(1)["W_dec"])
    widths = {IDS[0]: D_IN, IDS[1]: D_IN}
    assert sae.check_target(widths, "EleutherAI/pythia-70m-deduped") == IDS[1]


def test_the_planted_latents_are_chosen_and_span_the_proxy(offline_hub):
    sae = SAE.from_pretrained(RELEASE, IDS[0], rank=len(PLANTED))
    H = torch.randn(256, D_IN, generator=torch.Generator().manual_seed(1))
    sae.measure(H)
    assert tuple(sae.latents_.tolist()) == PLANTED
    assert torch.all(sae.latent_frequency_[list(PLANTED)] == 1)
    decoys = sae.latent_frequency_[list(DECOYS)]
    assert torch.all((decoys > 0.2) & (decoys < 0.8))  # often active, less than the planted
    Q = sae.basis()
    assert Q.dtype == torch.float64 and Q.shape == (D_IN, len(PLANTED))
    torch.testing.assert_close(Q.T @ Q, torch.eye(len(PLANTED), dtype=torch.float64))
    W_dec = _weights(0)["W_dec"]
    torch.testing.assert_close(Q @ Q.T, _projector(W_dec[list(PLANTED)]), atol=1e-10, rtol=0)


def test_model_hook_and_width_mismatches_are_refused(offline_hub):
    sae = SAE.from_pretrained(RELEASE, IDS[1], rank=3)
    source = f"SAE {IDS[1]!r} of release {RELEASE!r}"
    widths = {IDS[0]: D_IN, IDS[1]: D_IN}
    message = (
        f"{source} was trained on model 'pythia-70m-deduped', but the model measured is "
        "'EleutherAI/pythia-160m-deduped'"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        sae.check_target(widths, "EleutherAI/pythia-160m-deduped")
    message = (
        f"{source} reads hook {IDS[1]!r}, which is not a captured site; captured: "
        f"[{IDS[0]!r}] (see the capture's sites and layers)"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        sae.check_target({IDS[0]: D_IN}, "pythia-70m-deduped")
    message = f"{source} reads d_in = {D_IN}, but site {IDS[1]!r} has width 512"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        sae.check_target({IDS[1]: 512}, "pythia-70m-deduped")
    with pytest.raises(ValueError, match=r"rank must be an integer in \[1, 31\], got 32"):
        SAE.from_pretrained(RELEASE, IDS[1], rank=D_IN).measure(torch.randn(8, D_IN))


def test_release_and_ids_are_checked_against_the_registry():
    check_pretrained(RELEASE, IDS)
    message = r"'pythia-70m-dedup-res-sm' is not a release .* \(did you mean '{}'\?\)"
    with pytest.raises(ValueError, match=message.format(RELEASE)):
        check_pretrained("pythia-70m-dedup-res-sm", IDS)
    message = (
        f"release {RELEASE!r} has no SAE id 'blocks.3.hook_resid_pots' (did you mean "
        "'blocks.3.hook_resid_post'?); its ids: blocks.0.hook_resid_pre, blocks.0.hook_resid_post"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        check_pretrained(RELEASE, ["blocks.3.hook_resid_pots"])


# ---------------------------------------------------------------------------- in a sweep


@pytest.fixture(scope="module")
def pythia_70m_like(micro_pythia, tmp_path_factory) -> Path:
    """A local suite named ``pythia-70m-deduped``: the micro suite's checkpoints (width 32)."""
    root = tmp_path_factory.mktemp("suites") / "pythia-70m-deduped"
    root.mkdir()
    for step in (0, 40):
        (root / f"step{step}").symlink_to(micro_pythia.folder(step), target_is_directory=True)
    return root


@pytest.fixture
def fake_release_width(monkeypatch):
    """The fake release's SAEs read width ``D_IN`` (the micro suite's), not Pythia-70m's 512:
    the sweep's planning check compares the suite's width with that of the release's model, so
    ``pythia-70m-deduped`` is declared ``D_IN`` wide while a test sweeps ``pythia_70m_like``
    (unpatched, that suite is refused at planning: tests/unit/test_pretrained_registry.py)."""
    from tangentlens.models.shapes import PYTHIA_CONFIGS

    monkeypatch.setitem(PYTHIA_CONFIGS["EleutherAI/pythia-70m-deduped"], "hidden_size", D_IN)


def _recipe(tmp_path: Path, suite: Path, policy: str, extra: str = "") -> Path:
    path = tmp_path / f"pretrained_{policy}.toml"
    path.write_text(
        f"""
[suite]
name = "local:{suite}"
steps = "all"
offline = true
[data]
corpus = "shakespeare"
seq_len = 32
max_tokens = 1024
n_bins = 2
[capture]
sites = ["resid_post"]
embed = true
reservoir = 256
[proxies]
methods = ["pca"]
rank = {len(PLANTED)}
fit_policy = "{policy}"
window_checkpoints = 1
draws = 5
[probes.tangent_energy]
bootstrap = 10
[proxies.pretrained_sae]
release = "{RELEASE}"
ids = {list(IDS)!r}
[probes.subspace_stability]
[probes.update_alignment]
draws = 5
{extra}"""
    )
    return path


@pytest.mark.parametrize("policy", ["per_checkpoint", "frozen_early"])
def test_a_sweep_scores_the_pretrained_proxies(
    offline_hub, fake_release_width, pythia_70m_like, tmp_path, policy
):
    run = run_sweep(load_recipe(_recipe(tmp_path, pythia_70m_like, policy)), tmp_path / "run")
    saved = torch.load(run / "state" / "pretrained-sae.pt", weights_only=True)
    assert saved["step"] == 0 and saved["ids"] == {site: site for site in IDS}
    for layer, site in enumerate(IDS):  # chosen once, on step 0's rows: the planted latents
        assert tuple(saved["latents"][site].tolist()) == PLANTED
        expected = _projector(_weights(layer)["W_dec"][list(PLANTED)])
        Q = saved["bases"][site]
        torch.testing.assert_close(Q @ Q.T, expected, atol=1e-10, rtol=0)
    rows = read_results(run).to_pylist()
    fit = {(r["step"], r["site"], r["metric"]) for r in rows if r["method"] == "pretrained_sae"}
    assert {(0, IDS[0], "sae_explained_variance"), (0, IDS[1], "sae_l0")} <= fit
    energy = {
        (r["step"], r["site"], r["rank"])
        for r in rows
        if r["probe"] == "tangent_energy" and r["metric"] == "energy_fraction"
        if r["method"] == "pretrained_sae" and r["freq_bin"] == "all"
    }
    # m̂ projected out, as from every proxy: rank 3 unless m̂ lay inside the span
    assert {(s, site) for s, site, _ in energy} == {(s, site) for s in (0, 40) for site in IDS}
    assert {rank for *_, rank in energy} <= {len(PLANTED) - 1, len(PLANTED)}
    methods = {(r["probe"], r["method"]) for r in rows}
    assert ("subspace_stability", "pca~pretrained_sae") in methods
    assert ("update_alignment", "pretrained_sae") in methods
    if policy == "frozen_early":  # in the frozen proxies, with per-sequence energy sums
        frozen = torch.load(run / "state" / "proxies.pt", weights_only=True)
        assert all("pretrained_sae" in frozen["bases"][site] for site in IDS)
        assert ("subspace_stability", "pretrained_sae@frozen") in methods


def test_a_sweep_refuses_an_sae_whose_hook_is_not_captured(
    offline_hub, fake_release_width, pythia_70m_like, tmp_path
):
    path = _recipe(tmp_path, pythia_70m_like, "per_checkpoint")
    recipe = load_recipe(path, ["capture.layers='0'"])
    message = "reads hook 'blocks.1.hook_resid_post', which is not a captured site"
    with pytest.raises(SweepFailedError, match=re.escape(message)):
        run_sweep(recipe, tmp_path / "run")


def test_suites_name_their_model_as_saelens_does(micro_pythia, pythia_70m_like):
    from tangentlens.models import LocalSuite, PythiaSuite

    assert PythiaSuite("EleutherAI/pythia-70m-deduped").model_name == "pythia-70m-deduped"
    assert LocalSuite(pythia_70m_like).model_name == "pythia-70m-deduped"
    assert micro_pythia.model_name == "micro-pythia"


def test_an_offline_sweep_names_the_published_sae_files_it_lacks_before_any_unit(
    sae_hub, fake_release_width, pythia_70m_like, tmp_path, monkeypatch
):
    """The hub cache holds the release's first SAE only: the second is named with the command
    that fetches its folder, before any unit runs."""
    from sae_lens.loading.pretrained_saes_directory import get_pretrained_saes_directory

    from tests.integration.conftest import use_hub_cache

    lookup = get_pretrained_saes_directory()[RELEASE]
    hub = tmp_path / "hub"
    shutil.copytree(sae_hub, hub, symlinks=True)
    repo = hub / f"models--{lookup.repo_id.replace('/', '--')}"
    (snapshot,) = (repo / "snapshots").iterdir()
    shutil.rmtree(snapshot / lookup.saes_map[IDS[1]])
    use_hub_cache(monkeypatch, hub)
    recipe = load_recipe(_recipe(tmp_path, pythia_70m_like, "per_checkpoint"))
    with pytest.raises(ValueError) as caught:
        run_sweep(recipe, tmp_path / "run")
    message = str(caught.value)
    folder = lookup.saes_map[IDS[1]]
    assert message.startswith("1 download(s) this sweep needs are not in the local Hugging Face")
    assert f"SAE {IDS[1]!r} of release {RELEASE!r}" in message and IDS[0] not in message
    assert f"`hf download {lookup.repo_id} --include '{folder}/*'`" in message
    assert not (tmp_path / "run").exists()
