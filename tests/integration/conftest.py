"""Hugging Face checkpoints built from configs (random weights, a small trained tokenizer) and a
fake Hugging Face hub cache, so that loading is tested for real without a network."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from transformers import (
    BertConfig,
    BertForMaskedLM,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from tangentlens.data import DECODER_SPECIAL_TOKENS, ENCODER_SPECIAL_TOKENS, train_bpe_tokenizer

TEXT = [
    "Now is the winter of our discontent made glorious summer by this sun of York.",
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer.",
    "All the world's a stage, and all the men and women merely players.",
] * 20
VOCAB = 320
SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
         "intermediate_size": 64, "max_position_embeddings": 64}  # fmt: skip


@contextmanager
def scratch_dir(tmp_path_factory, name: str) -> Iterator[Path]:
    """A temporary folder for a module fixture's gigabytes of checkpoints, removed when the
    fixture ends: pytest keeps the folders of its last three runs, and a test run must not
    need the disk of all its large checkpoints at once."""
    path = tmp_path_factory.mktemp(name)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def decoder_tokenizer(vocab: int = VOCAB) -> PreTrainedTokenizerFast:
    eos, pad = DECODER_SPECIAL_TOKENS
    backend = train_bpe_tokenizer(TEXT, vocab, DECODER_SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=eos, eos_token=eos, unk_token=eos, pad_token=pad
    )


def encoder_tokenizer(vocab: int = VOCAB) -> PreTrainedTokenizerFast:
    pad, unk, cls, sep, mask = ENCODER_SPECIAL_TOKENS
    backend = train_bpe_tokenizer(TEXT, vocab, ENCODER_SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=pad, unk_token=unk, cls_token=cls, sep_token=sep, mask_token=mask,
    )  # fmt: skip


def _gpt_neox(vocab):
    return GPTNeoXForCausalLM(
        GPTNeoXConfig(
            **SMALL,
            vocab_size=vocab,
            rotary_pct=0.25,
            use_parallel_residual=True,
            tie_word_embeddings=False,
        )
    )


def _llama(vocab):
    return LlamaForCausalLM(LlamaConfig(**SMALL, vocab_size=vocab, num_key_value_heads=4))


def _mistral(vocab):
    return MistralForCausalLM(
        MistralConfig(**SMALL, vocab_size=vocab, num_key_value_heads=4, sliding_window=None)
    )


def _qwen2(vocab):
    return Qwen2ForCausalLM(Qwen2Config(**SMALL, vocab_size=vocab, num_key_value_heads=4))


def _bert(vocab):
    return BertForMaskedLM(BertConfig(**SMALL, vocab_size=vocab))


BUILDERS = {
    "gpt_neox": (_gpt_neox, decoder_tokenizer),
    "llama": (_llama, decoder_tokenizer),
    "mistral": (_mistral, decoder_tokenizer),
    "qwen2": (_qwen2, decoder_tokenizer),
    "bert": (_bert, encoder_tokenizer),
}


def write_checkpoint(folder: Path, kind: str, *, seed: int = 0, vocab: int = VOCAB) -> Path:
    """A random ``kind`` model (see BUILDERS) saved in Hugging Face format with its tokenizer."""
    build, tokenizer = BUILDERS[kind]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build(vocab).eval()
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory):
    """``hf_checkpoint(kind, seed=0)``: path of a saved random checkpoint (cached per session)."""
    made: dict[tuple[str, int], Path] = {}

    def make(kind: str, seed: int = 0) -> Path:
        if (kind, seed) not in made:
            folder = tmp_path_factory.mktemp(f"hf-{kind}-{seed}")
            made[(kind, seed)] = write_checkpoint(folder, kind, seed=seed)
        return made[(kind, seed)]

    return make


PYTHIA_14M = {
    "hidden_size": 128, "num_hidden_layers": 6, "num_attention_heads": 4,
    "intermediate_size": 512, "max_position_embeddings": 2048, "vocab_size": 50304,
    "rotary_pct": 0.25, "rotary_emb_base": 10000, "use_parallel_residual": True,
    "tie_word_embeddings": False, "layer_norm_eps": 1e-5, "hidden_act": "gelu",
    "bos_token_id": 0, "eos_token_id": 0,
}  # fmt: skip
FAKE_REVISIONS = {"step0": 0, "step1000": 1}


@pytest.fixture(scope="session")
def fake_hf_cache_dir(tmp_path_factory) -> Path:
    """A Hugging Face hub cache holding ``EleutherAI/pythia-14m`` (random weights, pythia-14m
    config, a small tokenizer) at revisions step0, step1000 and main (= step1000)."""
    hub = tmp_path_factory.mktemp("hf-home") / "hub"
    repo = hub / "models--EleutherAI--pythia-14m"
    (repo / "refs").mkdir(parents=True)
    tokenizer = decoder_tokenizer()
    for revision, seed in FAKE_REVISIONS.items():
        commit = hashlib.sha1(revision.encode()).hexdigest()
        snapshot = repo / "snapshots" / commit
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = GPTNeoXForCausalLM(GPTNeoXConfig(**PYTHIA_14M))
        model.save_pretrained(snapshot, safe_serialization=True)
        tokenizer.save_pretrained(snapshot)
        (repo / "refs" / revision).write_text(commit)
        if revision == "step1000":
            (repo / "refs" / "main").write_text(commit)
    return hub


@pytest.fixture
def fake_hf_cache(fake_hf_cache_dir, monkeypatch):
    """Point huggingface_hub (and through it transformers) at the fake cache; block sockets so
    that any network access fails at once instead of passing unnoticed."""
    return use_hub_cache(monkeypatch, fake_hf_cache_dir)


def use_hub_cache(monkeypatch, hub: Path) -> Path:
    """Point huggingface_hub (and through it transformers) at the cache folder ``hub`` for one
    test and make every socket connection fail at once (no network access passes unnoticed)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setattr("socket.socket.connect", _refuse_network)
    return hub


def _refuse_network(*args, **kwargs):
    raise OSError("network access attempted in an offline test")


@pytest.fixture(scope="session")
def micro_step_data(micro_pythia):
    """Capture of the micro suite's last step: 96 held-out rows of 32 tokens captured at every
    residual site with gradients, 3 frequency bins, type sums, a 2048-row reservoir and the
    attention of both layers."""
    from tangentlens.capture import CaptureConfig, StatisticsConfig, capture_statistics
    from tangentlens.capture.captured import Capture
    from tangentlens.data import (
        FrequencyTable,
        decoder_special_ids,
        document_encoder,
        iter_batches,
        pack_rows,
        tokenize_corpus,
    )
    from tangentlens.models import lens_model

    step = micro_pythia.steps[-1]
    model = micro_pythia.load(step)
    special = decoder_special_ids()
    docs = tokenize_corpus(
        micro_pythia.analysis_corpus(), document_encoder(micro_pythia.tokenizer())
    )
    rows = pack_rows(docs, 32, family="decoder", special=special)[:96]  # as the sweep does
    frequencies = FrequencyTable.from_rows(rows, model.cfg.d_vocab, special, causal=True)
    sites = tuple(lens_model(model).residual_sites())
    statistics = StatisticsConfig(
        n_bins=3, type_sums=True, vocab_size=model.cfg.d_vocab, reservoir_size=2048
    )
    stats = capture_statistics(
        model,
        iter_batches(rows, 16),
        CaptureConfig(sites=sites, attention_layers=(0, 1)),
        special,
        statistics,
        bins=frequencies.bins(3),
    )
    layers = {site: layer for layer, site in enumerate(sites)}
    return Capture(
        "micro-pythia", step, micro_pythia.tokens_seen(step), stats, layers, 32, frequencies
    )


@pytest.fixture(scope="session")
def tiny_decoder():
    """A float64 Pythia-shaped decoder (two blocks, parallel attention and MLP, partial rotary,
    a final LayerNorm), randomly initialised."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    torch.manual_seed(0)
    cfg = HookedTransformerConfig(
        n_layers=2,
        d_model=16,
        n_heads=4,
        d_head=4,
        d_mlp=32,
        d_vocab=50,
        n_ctx=16,
        act_fn="gelu",
        normalization_type="LN",
        positional_embedding_type="rotary",
        rotary_dim=2,
        parallel_attn_mlp=True,
        dtype=torch.float64,
        device="cpu",
    )
    return HookedTransformer(cfg)
