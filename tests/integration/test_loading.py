"""Loading checkpoints into TransformerLens: parity with Hugging Face, no processing, offline.

Parity is checked in float64 on both sides (TransformerLens' einsums against the Hugging Face
modules: the same function in another operation order), within float64 rounding
(:func:`tests.numerics.assert_float64_parity`); in float32 the two differ by float32 rounding
in another order, which no fixed tolerance bounds on every CPU. The parts Hugging Face computes
in float32 in any dtype run in float64 (:func:`tests.numerics.hugging_face_in_float64`); its
rotary tables, float32 too, are checked within their float32 rounding and shared
(:func:`tests.numerics.share_rotary_tables`)."""

import json
import time

import pytest
import torch
from transformer_lens import HookedEncoder, HookedTransformer
from transformers import AutoModelForCausalLM, BertForMaskedLM

from tangentlens.models import lens_model
from tangentlens.models.hub import hf_offline_mode, offline_requested
from tangentlens.models.loading import load_local_checkpoint, load_pythia_checkpoint
from tests.integration.conftest import decoder_tokenizer, write_checkpoint
from tests.numerics import assert_float64_parity, hugging_face_in_float64, share_rotary_tables

DECODERS = ["gpt_neox", "llama", "mistral", "qwen2"]
F64 = torch.float64


def _tokens(vocab: int, first_id: int = 0) -> torch.Tensor:
    return torch.randint(first_id, vocab, (2, 24), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("kind", DECODERS)
def test_local_decoder_matches_hugging_face_hidden_states_and_logits(hf_checkpoint, kind):
    folder = hf_checkpoint(kind)
    model = load_local_checkpoint(folder, dtype=F64)
    assert isinstance(model, HookedTransformer)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=F64).eval()
    tokens = _tokens(hf.config.vocab_size)
    with torch.no_grad(), hugging_face_in_float64(hf):
        share_rotary_tables(model, hf.base_model.rotary_emb, tokens.shape[1])
        reference = hf(tokens, output_hidden_states=True)
        logits, cache = model.run_with_cache(tokens)
    assert_float64_parity(logits, reference.logits, "logits")
    # HF's last hidden state is taken after the final norm; the inner ones are block outputs.
    for layer in range(model.cfg.n_layers - 1):
        ours = cache[lens_model(model).hook_name("resid_post", layer)]
        assert_float64_parity(ours, reference.hidden_states[layer + 1], f"block {layer}")
    assert_float64_parity(cache["ln_final.hook_normalized"], reference.hidden_states[-1], "ln")


def test_local_encoder_matches_hugging_face_hidden_states_and_mlm_logits(hf_checkpoint):
    folder = hf_checkpoint("bert")
    model = load_local_checkpoint(folder, dtype=F64)
    assert isinstance(model, HookedEncoder)
    hf = BertForMaskedLM.from_pretrained(folder, dtype=F64).eval()
    tokens = _tokens(hf.config.vocab_size, first_id=5)
    with torch.no_grad(), hugging_face_in_float64(hf):
        reference = hf(tokens, output_hidden_states=True)
        logits, cache = model.run_with_cache(tokens)
    assert_float64_parity(logits, reference.logits, "logits")
    assert_float64_parity(cache["hook_full_embed"], reference.hidden_states[0], "embedding")
    for layer in range(model.cfg.n_layers):
        ours = cache[lens_model(model).hook_name("resid_post", layer)]
        assert_float64_parity(ours, reference.hidden_states[layer + 1], f"block {layer}")
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_no_weight_processing_keeps_the_mean_direction(hf_checkpoint):
    folder = hf_checkpoint("gpt_neox")
    model = load_local_checkpoint(folder)
    hf = AutoModelForCausalLM.from_pretrained(folder)
    # Centring the unembedding would subtract each row's mean over the vocabulary.
    torch.testing.assert_close(model.W_U, hf.get_output_embeddings().weight.T, rtol=0, atol=0)
    assert model.cfg.normalization_type == "LN"  # not folded into LNPre


def test_local_model_has_its_tokenizer_and_float64_loads(hf_checkpoint):
    model = load_local_checkpoint(hf_checkpoint("gpt_neox"), dtype=torch.float64)
    assert model.W_E.dtype == torch.float64
    assert model.tokenizer is not None
    assert model.to_tokens("To be", prepend_bos=False).shape[0] == 1


def test_local_loading_makes_no_network_call(hf_checkpoint, monkeypatch):
    folder = hf_checkpoint("llama")
    monkeypatch.setattr("socket.socket.connect", _refuse)
    load_local_checkpoint(folder)


def _refuse(*args, **kwargs):
    raise OSError("network access attempted")


def test_bad_local_folders_name_the_problem(hf_checkpoint, tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_local_checkpoint(tmp_path / "nowhere")
    with pytest.raises(ValueError, match=r"no config\.json"):
        load_local_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_local_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["T5Model"]}))
    with pytest.raises(ValueError, match="GPTNeoXForCausalLM"):
        load_local_checkpoint(tmp_path)


def test_tokenizer_larger_than_the_vocabulary_is_refused(hf_checkpoint, tmp_path):
    folder = write_checkpoint(tmp_path / "small-vocab", "gpt_neox", vocab=300)
    decoder_tokenizer(vocab=320).save_pretrained(folder)
    with pytest.raises(ValueError, match=r"tokenizer .* 320 tokens .* 300"):
        load_local_checkpoint(folder)


def test_missing_tokenizer_is_a_clear_error(hf_checkpoint, tmp_path):
    import shutil

    folder = tmp_path / "no-tokenizer"
    shutil.copytree(hf_checkpoint("gpt_neox"), folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)
    with pytest.raises(ValueError, match="tokenizer"):
        load_local_checkpoint(folder)


def test_pythia_revisions_load_from_the_cache_like_a_user_with_internet(fake_hf_cache):
    from huggingface_hub import snapshot_download

    early = load_pythia_checkpoint("EleutherAI/pythia-14m", 0, offline=True, dtype=F64)
    late = load_pythia_checkpoint("EleutherAI/pythia-14m", 1000, offline=True, dtype=F64)
    assert early.cfg.n_layers == 6 and early.cfg.d_model == 128 and early.cfg.d_vocab == 50304
    with hf_offline_mode():
        folder = snapshot_download("EleutherAI/pythia-14m", revision="step1000")
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=F64).eval()
    tokens = _tokens(300)
    with torch.no_grad(), hugging_face_in_float64(hf):
        share_rotary_tables(late, hf.base_model.rotary_emb, tokens.shape[1])
        assert_float64_parity(late(tokens), hf(tokens).logits, "logits")
        assert (early(tokens) - late(tokens)).abs().max().item() > 1e-3


def test_missing_pythia_revision_fails_fast_naming_model_step_and_fix(fake_hf_cache):
    started = time.perf_counter()
    with pytest.raises(ValueError, match=r"pythia-14m at step 2000 .*hf download"):
        load_pythia_checkpoint("EleutherAI/pythia-14m", 2000, offline=True)
    assert time.perf_counter() - started < 10  # no network retries


def test_offline_setting_resolution(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("TANGENTLENS_OFFLINE", "1")
    assert offline_requested(None) is True
    assert offline_requested(False) is False
    monkeypatch.setenv("TANGENTLENS_OFFLINE", "0")
    monkeypatch.setattr("tangentlens.models.hub.hub_reachable", lambda: False)
    assert offline_requested(None) is True
    monkeypatch.setattr("tangentlens.models.hub.hub_reachable", lambda: True)
    assert offline_requested(None) is False
    assert offline_requested(True) is True


def test_offline_mode_is_restored_after_the_block(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    before = constants.HF_HUB_OFFLINE
    with hf_offline_mode():
        assert constants.HF_HUB_OFFLINE is True
    assert before == constants.HF_HUB_OFFLINE
