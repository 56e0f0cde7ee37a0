"""Capture memory: the chunked loss head against the unchunked computation, the loss's peak
memory at a large vocabulary, loss "none" (no head), and attention reduced in its hooks."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tangentlens.capture import (
    CaptureConfig,
    StatisticsConfig,
    capture_batch,
    capture_statistics,
    engine,
)
from tangentlens.capture import chunks as capture_chunks
from tangentlens.data import SpecialTokens
from tangentlens.data.masks import analysis_mask
from tangentlens.data.mlm import IGNORE_INDEX

DECODER_SPECIAL = SpecialTokens(bos_id=0, eos_id=0, pad_id=1)
DECODER_SITES = (
    "hook_embed",
    "blocks.0.hook_resid_post",
    "blocks.1.attn.hook_q",
    "blocks.1.hook_resid_post",
    "ln_final.hook_normalized",
)
ENCODER_SITES = (
    "embed.hook_embed",
    "blocks.0.hook_normalized_resid_post",
    "blocks.1.hook_normalized_resid_post",
    "mlm_head.ln.hook_normalized",
)


@pytest.fixture(scope="module")
def encoder(micro_bert):
    model = micro_bert.load(micro_bert.steps[-1]).to(torch.float64)
    tokenizer = micro_bert.tokenizer()
    special = SpecialTokens(
        cls_id=tokenizer.cls_token_id,
        sep_id=tokenizer.sep_token_id,
        pad_id=tokenizer.pad_token_id,
        mask_id=tokenizer.mask_token_id,
    )
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(10, model.cfg.d_vocab, (4, 32), generator=gen)
    tokens[:, 0], tokens[:, -1] = special.cls_id, special.sep_id
    return model, special, tokens


def _decoder_tokens(seed: int, batch: int = 3, pos: int = 10) -> torch.Tensor:
    tokens = torch.randint(2, 50, (batch, pos), generator=torch.Generator().manual_seed(seed))
    tokens[:, 0] = 0  # BOS
    tokens[1, 6] = DECODER_SPECIAL.pad_id  # a padded target: the scored rows are not contiguous
    return tokens


def _unchunked(model, inputs, labels, sites):
    """The former computation: the whole batch's logits at once, the summed cross-entropy, and
    ∂L/∂h through a zero perturbation δ at every site."""
    deltas: dict[str, torch.Tensor] = {}

    def perturb(tensor, hook):
        delta = torch.zeros_like(tensor, requires_grad=True)
        deltas[hook.name] = delta
        return tensor + delta

    logits = model.run_with_hooks(
        inputs, return_type="logits", fwd_hooks=[(s, perturb) for s in sites]
    )
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        labels.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )
    grads = torch.autograd.grad(loss, [deltas[s] for s in sites])
    return float(loss.detach()), dict(zip(sites, grads, strict=True))


def _count_chunks(monkeypatch, rows: int, d_vocab: int) -> list[int]:
    """Force ``rows`` positions per loss chunk; returns a list that grows by each chunk's size."""
    monkeypatch.setattr(capture_chunks, "LOSS_CHUNK_BYTES", 4 * d_vocab * rows)
    sizes: list[int] = []
    logits = engine._logits

    def counted(model, x):
        sizes.append(x.shape[0])
        return logits(model, x)

    monkeypatch.setattr(engine, "_logits", counted)  # the written-out head computes them too
    return sizes


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_chunked_decoder_loss_and_gradients_equal_the_unchunked_computation(
    tiny_decoder, monkeypatch
):
    sizes = _count_chunks(monkeypatch, 5, tiny_decoder.cfg.d_vocab)
    tokens = _decoder_tokens(1)
    batch = capture_batch(tiny_decoder, tokens, CaptureConfig(sites=DECODER_SITES), DECODER_SPECIAL)
    labels = torch.full_like(tokens, IGNORE_INDEX)
    labels[:, :-1] = tokens[:, 1:]
    labels[labels == DECODER_SPECIAL.pad_id] = IGNORE_INDEX
    loss, ref = _unchunked(tiny_decoder, tokens, labels, DECODER_SITES)
    assert batch.n_scored == 3 * 9 - 1 == sum(sizes)
    assert sizes == [5, 5, 5, 5, 5, 1]  # several chunks, none above the forced size
    assert batch.loss == pytest.approx(loss, rel=1e-12)
    for site in DECODER_SITES:  # the final norm's hook fires on the whole batch
        assert batch.gradients[site].shape == ref[site].shape, site
        assert _relative_error(batch.gradients[site], ref[site]) <= 1e-6, site
    sizes.clear()
    config = CaptureConfig(sites=DECODER_SITES, gradients=False)
    inference = capture_batch(tiny_decoder, tokens, config, DECODER_SPECIAL)
    assert len(sizes) == 6 and inference.loss == pytest.approx(loss, rel=1e-12)


def test_chunked_mlm_loss_and_gradients_equal_the_unchunked_computation(encoder, monkeypatch):
    model, special, tokens = encoder
    sizes = _count_chunks(monkeypatch, 3, model.cfg.d_vocab)
    config = CaptureConfig(sites=ENCODER_SITES, loss="mlm", seed=11)
    batch = capture_batch(model, tokens, config, special)
    labels = torch.where(batch.scored, tokens, IGNORE_INDEX)  # MLM labels: the original token
    loss, ref = _unchunked(model, batch.inputs, labels, ENCODER_SITES)
    # only the ~15 % scored positions reach the head, a chunk of at most 3 at a time
    assert sum(sizes) == batch.n_scored < tokens.numel() // 4 and len(sizes) >= 3
    assert max(sizes) == 3
    assert batch.loss == pytest.approx(loss, rel=1e-12)
    for site in ENCODER_SITES:
        assert _relative_error(batch.gradients[site], ref[site]) <= 1e-6, site


def test_loss_peak_stays_far_below_the_full_logits():
    """One capture_batch of a 1-block decoder with a 200 000-type vocabulary (batch 4 × pos 256:
    full float32 logits 819 MB), the peak resident memory (VmHWM) above the baseline taken after
    imports and model build. Measured on the development machine (CPU): the former unchunked loss
    peaked at +3195 MB with gradients (+1582 MB without); chunked at the default 256 MiB chunk
    +785 MB (about 3 chunks: logits, log-softmax, gradient); at the 32 MiB chunk forced here +112 MB
    with gradients, +78 MB without. glibc's mmap threshold is pinned so freed chunks leave RSS.
    """
    script = textwrap.dedent(
        """
        import json
        import torch
        from transformer_lens import HookedTransformer, HookedTransformerConfig
        from tangentlens.capture import CaptureConfig, capture_batch, chunks
        from tangentlens.data import SpecialTokens

        torch.set_num_threads(1)
        torch.manual_seed(0)
        cfg = HookedTransformerConfig(
            n_layers=1, d_model=64, n_heads=4, d_head=16, d_mlp=128, d_vocab=200_000,
            n_ctx=256, act_fn="gelu", normalization_type="LN", device="cpu",
        )
        model = HookedTransformer(cfg)
        tokens = torch.randint(2, cfg.d_vocab, (4, 256), generator=torch.Generator().manual_seed(0))
        chunks.LOSS_CHUNK_BYTES = 2**25
        config = CaptureConfig(sites=("blocks.0.hook_resid_post",))
        def hwm_kib():  # VmHWM: ru_maxrss would carry the parent's peak across exec
            with open("/proc/self/status") as status:
                return next(int(l.split()[1]) for l in status if l.startswith("VmHWM:"))
        base = hwm_kib()
        batch = capture_batch(model, tokens, config, SpecialTokens(bos_id=0, eos_id=0))
        peak = hwm_kib()
        print(json.dumps({"peak_kib": peak - base, "n_scored": batch.n_scored}))
        """
    )
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, env=env
    )
    assert result.returncode == 0, result.stderr
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    full_logits = 4 * 256 * 200_000 * 4
    assert measured["n_scored"] == 4 * 255
    assert measured["peak_kib"] * 1024 < full_logits / 3, measured


def test_loss_none_captures_activations_only(tiny_decoder):
    with pytest.raises(ValueError, match=r"loss 'none'.*gradients=False"):
        CaptureConfig(sites=DECODER_SITES[:2], loss="none")
    config = CaptureConfig(sites=DECODER_SITES[:4], loss="none", gradients=False)
    assert not config.causal
    tokens = _decoder_tokens(2)
    batch = capture_batch(tiny_decoder, tokens, config, DECODER_SPECIAL)
    assert math.isnan(batch.loss) and batch.n_scored == 0 and not batch.scored.any()
    assert batch.gradients == {}
    _, cache = tiny_decoder.run_with_cache(tokens)
    for site in DECODER_SITES[:4]:
        assert torch.equal(batch.activations[site], cache[site])
    # encoder-style masks: BOS and padding go, position 0 and the last position count
    assert batch.excluded["position0"] == 0 and batch.excluded["no_target"] == 0
    assert batch.keep[:, -1].all()
    residual = CaptureConfig(sites=DECODER_SITES[1:2], loss="none", gradients=False)
    stats = capture_statistics(
        tiny_decoder, tokens.split(2), residual, DECODER_SPECIAL, StatisticsConfig(gradients=False)
    )
    assert math.isnan(stats.mean_loss) and stats.n_scored == 0
    with pytest.raises(ValueError, match=r"not reached.*loss 'none' runs no head"):
        capture_batch(
            tiny_decoder,
            tokens,
            CaptureConfig(sites=("ln_final.hook_normalized",), loss="none", gradients=False),
            DECODER_SPECIAL,
        )
    with pytest.raises(ValueError, match="lie in the unembedding"):
        capture_batch(
            tiny_decoder, tokens, CaptureConfig(sites=("unembed.hook_in",)), DECODER_SPECIAL
        )


def test_loss_none_runs_an_encoder_without_its_head(encoder):
    import copy

    model, special, tokens = encoder
    headless = copy.deepcopy(model)
    del headless.mlm_head, headless.unembed  # a plain BertModel: no language-modelling head
    config = CaptureConfig(sites=ENCODER_SITES[:3], loss="none", gradients=False)
    batch = capture_batch(headless, tokens, config, special)
    _, cache = model.run_with_cache(tokens)
    for site in ENCODER_SITES[:3]:
        assert torch.equal(batch.activations[site], cache[site])
    assert math.isnan(batch.loss) and batch.n_scored == 0


def _attention_by_brute_force(model, batches, layers):
    """Per layer: Σq, Σk at kept positions, Σ entropy of kept query rows, and their count, from
    run_with_cache of ``(inputs, keep)`` batches, batch by batch in the stream's order."""
    out = {}
    for inputs, keep in batches:
        _, cache = model.run_with_cache(inputs)
        for layer in layers:
            q = cache[f"blocks.{layer}.attn.hook_q"][keep].to(torch.float64).sum(0)
            k = cache[f"blocks.{layer}.attn.hook_k"][keep].to(torch.float64).sum(0)
            p = cache[f"blocks.{layer}.attn.hook_pattern"].to(torch.float64)
            row_entropy = -torch.special.xlogy(p, p).sum(dim=-1)
            entropy = (row_entropy * keep.to(torch.float64)[:, None, :]).sum(dim=(0, 2))
            if layer not in out:
                out[layer] = [q, k, entropy, int(keep.sum())]
            else:
                sums = out[layer]
                sums[0] += q
                sums[1] += k
                sums[2] += entropy
                sums[3] += int(keep.sum())
    return out


@pytest.mark.parametrize("gradients", [True, False])
def test_attention_reduced_in_hooks_equals_brute_force_exactly(tiny_decoder, gradients):
    """The sums are bit-identical to reducing the cached tensors batch by batch — which is what
    the capture computed before it reduced them in the hooks."""
    rows = _decoder_tokens(6, batch=7)
    config = CaptureConfig(
        sites=("blocks.0.hook_resid_post",), attention_layers=(0, 1), gradients=gradients
    )
    statistics = StatisticsConfig(gradients=gradients, reservoir_size=0)
    stats = capture_statistics(tiny_decoder, rows.split(3), config, DECODER_SPECIAL, statistics)
    batches = [(t, analysis_mask(t, DECODER_SPECIAL, causal=True).keep) for t in rows.split(3)]
    ref = _attention_by_brute_force(tiny_decoder, batches, (0, 1))
    for layer in (0, 1):
        got = stats.attention[layer]
        assert got.sum_q.device.type == "cpu"
        q, k, entropy, count = ref[layer]
        assert torch.equal(got.sum_q, q) and torch.equal(got.sum_k, k)
        assert torch.equal(got.entropy_sum, entropy) and got.count == count


def test_mlm_attention_reduced_in_hooks_equals_brute_force(encoder):
    model, special, tokens = encoder
    config = CaptureConfig(sites=(), attention_layers=(1,), loss="mlm", seed=3)
    batch = capture_batch(model, tokens, config, special)
    # kept positions come from the original tokens ([MASK] inputs are kept), the tensors from
    # the corrupted input
    keep = analysis_mask(tokens, special, causal=False).keep
    assert (keep & (batch.inputs == special.mask_id)).any()
    [(q, k, entropy, count)] = _attention_by_brute_force(
        model, [(batch.inputs, keep)], (1,)
    ).values()
    assert count == int(keep.sum()) == batch.attention[1].count
    got = batch.attention[1]
    assert torch.equal(got.sum_q, q) and torch.equal(got.sum_k, k)
    assert torch.equal(got.entropy_sum, entropy)


def test_written_loss_gradient_matches_autograd_and_falls_back_where_logits_are_not_plain(
    tiny_decoder, monkeypatch
):
    """The written-out head (softmax − one-hot in the logits buffer, then ``(p − y) W_Uᵀ``)
    gives autograd's loss and gradients — compared in float64 (both heads, the same float64
    model: within float64 rounding, :data:`tests.numerics.FLOAT64_PARITY`; in float32 the two
    heads sum in other orders and differ by float32 rounding, which no tolerance bounds on
    every CPU); a float32 model takes the written head too; models whose logits are cast up
    from half precision, or soft-capped, keep the autograd head."""
    import copy

    from tangentlens.models.lens import lens_model
    from tests.numerics import FLOAT64_PARITY

    assert lens_model(copy.deepcopy(tiny_decoder).to(torch.float32)).plain_logits
    model = copy.deepcopy(tiny_decoder)
    assert next(model.parameters()).dtype == torch.float64 and lens_model(model).plain_logits
    tokens = _decoder_tokens(2)
    config = CaptureConfig(sites=DECODER_SITES)
    written = capture_batch(model, tokens, config, DECODER_SPECIAL)
    monkeypatch.setattr(type(lens_model(model)), "plain_logits", property(lambda self: False))
    autograd = capture_batch(model, tokens, config, DECODER_SPECIAL)
    assert written.loss == pytest.approx(autograd.loss, rel=FLOAT64_PARITY)
    for site in DECODER_SITES:
        error = _relative_error(written.gradients[site], autograd.gradients[site])
        assert error <= FLOAT64_PARITY, site
    monkeypatch.undo()
    assert not lens_model(copy.deepcopy(tiny_decoder).to(torch.bfloat16)).plain_logits
    capped = copy.deepcopy(tiny_decoder)
    capped.cfg.output_logits_soft_cap = 30.0
    assert not lens_model(capped).plain_logits
