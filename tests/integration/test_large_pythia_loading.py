"""The large public suites loaded as a user without internet would: ``open_suite(name,
offline=True)`` over a Hugging Face hub cache holding ``EleutherAI/pythia-1b`` and
``EleutherAI/pythia-6.9b`` at revisions step0 and step143000 (``main`` = step143000).

The cache is fake but laid out as huggingface_hub writes it (refs → snapshots → links into
``blobs/`` named by SHA-256; see ``fake_pythia_hub.py``): each snapshot holds the published
``config.json`` fields (:data:`tangentlens.models.shapes.PYTHIA_CONFIGS`: the real width, heads,
MLP and padded vocabulary) with ``num_hidden_layers`` truncated to 1, random float16 weights
(Pythia's checkpoints are stored in float16) and a small BPE tokenizer — the real GPT-NeoX
tokenizer is not available offline. Sockets are blocked: any hub call fails at once.

``EleutherAI/pythia-1b-deduped`` is a copy of pythia-1b's cache whose step143000 snapshot links
its weights to step0's blob, as the cache stores a file two revisions share.

Measured on 2 CPU cores (torch 2.13, transformers 5.23, TransformerLens 3.9): building the cache
20–22 s (pythia-1b ≈ 6 s; pythia-6.9b ≈ 14 s: 2 × 1.23 GB of float16 weights), the pythia-1b
tests 2–5 s each (float16 runs slowly on a CPU), pythia-6.9b at bfloat16 ≈ 5 s (614 M
parameters, 1.23 GB; the embedding and unembedding alone 0.83 GB) — the file ≈ 35 s under pytest
(42 s wall with start-up, 11 s at worst for the 6.9b test while the fresh cache was still being
written back), peak resident memory 4.65 GB (loading half precision peaks at ≈ 3.3 × the weights:
see ``test_loading_peak.py``).
"""

from __future__ import annotations

import time

import pytest
import torch
from safetensors import safe_open

from tangentlens.models import PythiaSuite, open_suite
from tests.integration.conftest import decoder_tokenizer, scratch_dir, use_hub_cache
from tests.integration.fake_pythia_hub import copy_repo, share_blob, write_fake_pythia

REVISIONS = {"step0": 0, "step143000": 1}  # revision → seed of its random weights
SHAPES = {  # model → (d_model, d_vocab, n_heads, d_mlp)
    "EleutherAI/pythia-1b": (2048, 50304, 8, 8192),
    "EleutherAI/pythia-6.9b": (4096, 50432, 32, 16384),
}
SHARED = "EleutherAI/pythia-1b-deduped"


@pytest.fixture(scope="module")
def large_hub_dir(tmp_path_factory):
    """A hub cache of pythia-1b, -1b-deduped and -6.9b, one block each (3.3 GB, removed after
    the module)."""
    with scratch_dir(tmp_path_factory, "hf-home-large") as root:
        hub = root / "hub"
        hub.mkdir()
        tokenizer = decoder_tokenizer()
        for model in SHAPES:
            write_fake_pythia(hub, model, REVISIONS, tokenizer, layers=1, dtype=torch.float16)
        copy_repo(hub, "EleutherAI/pythia-1b", SHARED)
        share_blob(hub, SHARED, "step0", "step143000", "model.safetensors")
        yield hub


@pytest.fixture
def large_hub(large_hub_dir, monkeypatch):
    """Point huggingface_hub (and through it transformers) at the large cache; no network."""
    return use_hub_cache(monkeypatch, large_hub_dir)


def _check_loaded(suite: PythiaSuite, model_name: str, dtype: torch.dtype) -> None:
    """Load step 143000 at ``dtype``: the shape is the config's, the weights are the
    snapshot's (the embedding bit for bit, cast from float16), a forward pass is finite."""
    d_model, d_vocab, n_heads, d_mlp = SHAPES[model_name]
    model = suite.load(143000, dtype=dtype)
    cfg = model.cfg
    assert (cfg.n_layers, cfg.d_model, cfg.d_vocab, cfg.n_heads, cfg.d_mlp) == (
        1, d_model, d_vocab, n_heads, d_mlp,
    )  # fmt: skip
    assert cfg.d_head == d_model // n_heads and cfg.rotary_dim == cfg.d_head // 4
    assert cfg.checkpoint_value == 143000 and cfg.dtype == dtype
    assert {p.dtype for p in model.parameters()} == {dtype}
    assert model.W_E.shape == (d_vocab, d_model) and model.W_U.shape == (d_model, d_vocab)
    weights = suite.cached_folder(143000) / "model.safetensors"
    with safe_open(weights, "pt") as stored:
        embedding = stored.get_tensor("gpt_neox.embed_in.weight")
    assert embedding.dtype == torch.float16
    assert torch.equal(model.W_E.detach(), embedding.to(dtype))
    tokens = model.to_tokens("To be, or not to be, that is the question")
    with torch.no_grad():
        logits = model(tokens)
    assert logits.shape == (1, tokens.shape[1], d_vocab) and logits.dtype == dtype
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_pythia_1b_loads_offline_at_half_precision(large_hub, dtype):
    suite = open_suite("EleutherAI/pythia-1b", offline=True)
    assert isinstance(suite, PythiaSuite)
    suite.check_available([0, 143000])
    _check_loaded(suite, "EleutherAI/pythia-1b", dtype)


def test_pythia_6_9b_loads_offline_at_bfloat16(large_hub):
    """The widest public shape this toolkit plans for but pythia-12b: 4096 wide, 50432 tokens
    (≈ 5 s to load, 1.23 GB of bfloat16 weights)."""
    suite = open_suite("EleutherAI/pythia-6.9b", offline=True)
    _check_loaded(suite, "EleutherAI/pythia-6.9b", torch.bfloat16)


def test_a_revision_missing_offline_is_named_with_how_to_fetch_it(large_hub):
    name = "EleutherAI/pythia-1b"
    suite = open_suite(name, offline=True)
    with pytest.raises(ValueError) as caught:
        suite.check_available([0, 1000, 143000])
    assert str(caught.value) == (
        f"{name} at step(s) 1000 is not in the local Hugging Face cache ({large_hub}) and the "
        f"hub is offline; fetch it where the hub is reachable (hf download {name} --revision "
        "step1000) or run online"
    )
    started = time.perf_counter()
    with pytest.raises(ValueError) as caught:
        suite.load(1000, dtype=torch.bfloat16)
    assert time.perf_counter() - started < 10  # no network retries
    message = str(caught.value)
    assert f"{name} at step 1000 (revision 'step1000') is not in the local" in message
    assert f"Hugging Face cache ({large_hub})" in message
    assert f"`hf download {name} --revision step1000`" in message
    assert suite.weights_hash(1000) is None


#: What verify says of every fake revision here: one block where the published model has 16.
TRUNCATED = (
    "config.json at steps 0, 143000 is not the suite's published config: num_hidden_layers 1 "
    "(published 16); these are not its checkpoints (the memory plan and the planning checks "
    "read the published config)"
)


def test_verify_tells_distinct_revisions_from_ones_sharing_a_weights_blob(large_hub):
    distinct = open_suite("EleutherAI/pythia-1b", offline=True).verify([0, 143000])
    assert distinct.duplicates == [] and distinct.not_checked == []
    assert distinct.damaged == {} and distinct.config_differs == {}
    assert distinct.problems() == [TRUNCATED]  # the fake's one block; nothing else

    suite = open_suite(SHARED, offline=True)
    shared = suite.verify([0, 143000])
    assert [(d.previous, d.step) for d in shared.duplicates] == [(0, 143000)]
    assert shared.duplicates[0].weights_hash == suite.weights_hash(0) == suite.weights_hash(143000)
    assert shared.damaged == {} and shared.config_differs == {}
    assert shared.problems() == [TRUNCATED]
    assert shared.to_dict()["duplicates"] == [[0, 143000]]
