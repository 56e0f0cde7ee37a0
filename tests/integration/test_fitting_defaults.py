"""Defaults that fit the model in hand: ``tl.measure`` / ``capture_model`` leave out, in one
warning line, the probes a model cannot support (``qk_drift`` under grouped-query attention or
through loader ``"hf"``); ``suite.loader = "auto"`` resolves per architecture at planning, for a
local OLMo folder as for the hub suite; ``suite.steps=1500`` unquoted; a misspelt hub id; a
probe dropped from a built-in recipe."""

from __future__ import annotations

import logging
import shutil

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, OlmoConfig, OlmoForCausalLM

import tangentlens as tl
from tangentlens.core.recipe import load_recipe
from tangentlens.models.catalog import suite_loader
from tangentlens.models.loading import load_local_checkpoint
from tangentlens.models.suites import open_suite
from tangentlens.notebook import default_probes
from tangentlens.sweep.runner import plan_sweep
from tests.integration.conftest import SMALL, TEXT, VOCAB, decoder_tokenizer


def _save(model: torch.nn.Module, folder) -> None:
    model.save_pretrained(folder, safe_serialization=True)
    decoder_tokenizer().save_pretrained(folder)


@pytest.fixture(scope="module")
def gqa_llama(tmp_path_factory):
    """A random Llama with grouped-query attention (4 query heads, 2 key/value heads), 64 wide:
    the default proxy rank 16 needs complement controls in 64 − 1 − 16 dimensions."""
    folder = tmp_path_factory.mktemp("gqa-llama")
    torch.manual_seed(0)
    config = LlamaConfig(**{**SMALL, "hidden_size": 64}, vocab_size=VOCAB, num_key_value_heads=2)
    _save(LlamaForCausalLM(config), folder)
    return folder


@pytest.fixture(scope="module")
def olmo_suite(tmp_path_factory):
    """A local suite folder of two random OLMo checkpoints (step1/, step2/)."""
    root = tmp_path_factory.mktemp("olmo-suite")
    torch.manual_seed(0)
    _save(OlmoForCausalLM(OlmoConfig(**SMALL, vocab_size=VOCAB)), root / "step1")
    shutil.copytree(root / "step1", root / "step2")
    return root


def test_default_probes_leave_out_qk_drift_on_a_gqa_bridge_in_one_line(gqa_llama, caplog):
    bridge = load_local_checkpoint(gqa_llama, loader="bridge")
    with caplog.at_level(logging.WARNING, logger="tangentlens.notebook"):
        table = tl.measure(bridge, TEXT[:12], seq_len=16, n_bins=2, reservoir=256)
    probes = {row["probe"] for row in table.to_pylist()}
    assert "qk_drift" not in probes and {"tangent_energy", "cosine_drift"} <= probes
    (record,) = [r for r in caplog.records if "left out" in r.getMessage()]
    message = record.getMessage()
    assert "\n" not in message and message.startswith("default probes: qk_drift left out")
    assert "grouped-query attention (4 query heads, 2 key/value heads)" in message
    with pytest.raises(ValueError, match="probe\\(s\\) qk_drift cannot run"):  # asked for: refused
        tl.capture_model(bridge, TEXT[:12], probes=["qk_drift"], seq_len=16)


def test_default_probes_of_a_model_with_per_head_attention_keep_qk_drift(hf_checkpoint, caplog):
    for loader in ("hooked", "bridge"):
        model = load_local_checkpoint(hf_checkpoint("gpt_neox"), loader=loader)
        with caplog.at_level(logging.WARNING, logger="tangentlens.notebook"):
            assert "qk_drift" in default_probes(model)
    assert not [r for r in caplog.records if "left out" in r.getMessage()]


def test_auto_resolves_a_local_olmo_folder_to_the_bridge_at_planning(olmo_suite):
    spec = f"local:{olmo_suite}"
    assert suite_loader(spec) == "bridge" and suite_loader(spec, "auto") == "bridge"
    assert type(open_suite(spec).load(2)).__name__ == "TransformerBridge"
    recipe = load_recipe("quickstart", [f"suite.name='{spec}'", "suite.loader='hooked'"])
    with pytest.raises(ValueError, match="model type 'olmo' load only through loader 'bridge'"):
        plan_sweep(recipe)  # before anything is loaded
    plan_sweep(
        load_recipe("quickstart", [f"suite.name='{spec}'", "suite.steps=2", "proxies.rank=8"])
    )
