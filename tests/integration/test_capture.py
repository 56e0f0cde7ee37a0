"""Capture engine: gradients against an independent autograd reference, activations against
run_with_cache, masks, MLM seeding, streaming statistics and bad input."""

from __future__ import annotations

import math

import pytest
import torch

from tangentlens.capture import (
    CaptureConfig,
    StatisticsConfig,
    capture_batch,
    capture_statistics,
)
from tangentlens.data import FrequencyTable, SpecialTokens

DECODER_SPECIAL = SpecialTokens(bos_id=0, eos_id=0, pad_id=1)
SITES = (
    "hook_embed",
    "blocks.0.hook_resid_post",
    "blocks.1.attn.hook_q",
    "blocks.1.hook_attn_out",
    "blocks.1.hook_resid_post",
)


def _tokens(seed: int, batch: int = 3, pos: int = 10, vocab: int = 50) -> torch.Tensor:
    tokens = torch.randint(2, vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))
    tokens[:, 0] = 0  # BOS
    return tokens


def _reference_gradients(model, inputs, labels, sites, reduction="sum"):
    """∂L/∂h by adding a zero perturbation δ at every site and differentiating L with respect to
    δ — independent of the engine's leaf replacement."""
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
        ignore_index=-100,
        reduction=reduction,
    )
    grads = torch.autograd.grad(loss, [deltas[s] for s in sites])
    return dict(zip(sites, grads, strict=True))


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_decoder_gradients_match_autograd(tiny_decoder):
    reduction = "sum"
    tokens = _tokens(1)
    config = CaptureConfig(sites=SITES, loss="next_token", reduction=reduction)
    batch = capture_batch(tiny_decoder, tokens, config, DECODER_SPECIAL)
    labels = torch.full_like(tokens, -100)
    labels[:, :-1] = tokens[:, 1:]
    ref = _reference_gradients(tiny_decoder, tokens, labels, SITES, reduction)
    for site in SITES:
        assert _relative_error(batch.gradients[site], ref[site]) <= 1e-6, site
    assert batch.n_scored == 3 * 9
    # the last position predicts nothing: its gradient is exactly zero, and it is excluded
    assert batch.gradients["blocks.1.hook_resid_post"][:, -1].abs().max() == 0
    assert not batch.keep[:, -1].any() and not batch.keep[:, 0].any()
    assert batch.excluded["no_target"] == 3 and batch.excluded["position0"] == 3


def test_soft_capped_logits_give_the_gradients_and_loss_of_autograd(tiny_decoder):
    """The loss gradient written out (softmax − onehot, times the cap's tanh derivative) is the
    gradient autograd takes through the model's own soft-capped logits."""
    tokens = _tokens(4)
    labels = torch.full_like(tokens, -100)
    labels[:, :-1] = tokens[:, 1:]
    config = CaptureConfig(sites=SITES, loss="next_token")
    tiny_decoder.cfg.output_logits_soft_cap = 0.5  # small: the cap bends every logit
    try:
        batch = capture_batch(tiny_decoder, tokens, config, DECODER_SPECIAL)
        ref = _reference_gradients(tiny_decoder, tokens, labels, SITES)
        logits = tiny_decoder(tokens, return_type="logits").detach()
    finally:
        tiny_decoder.cfg.output_logits_soft_cap = -1.0
    plain = capture_batch(tiny_decoder, tokens, config, DECODER_SPECIAL)
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum"
    )
    assert batch.loss == pytest.approx(float(loss), rel=1e-12)
    for site in SITES:
        assert _relative_error(batch.gradients[site], ref[site]) <= 1e-10, site
        assert _relative_error(plain.gradients[site], ref[site]) > 1e-3  # the cap mattered


def test_sum_gradient_does_not_depend_on_batch_size(tiny_decoder):
    tokens = _tokens(2, batch=4)
    config = CaptureConfig(sites=("blocks.0.hook_resid_post",))
    whole = capture_batch(tiny_decoder, tokens, config, DECODER_SPECIAL)
    half = capture_batch(tiny_decoder, tokens[:2], config, DECODER_SPECIAL)
    site = "blocks.0.hook_resid_post"
    torch.testing.assert_close(whole.gradients[site][:2], half.gradients[site], rtol=1e-10, atol=0)


def test_activations_match_run_with_cache_and_only_requested_sites_kept(tiny_decoder):
    tokens = _tokens(3)
    config = CaptureConfig(sites=SITES, attention_layers=(1,))
    batch = capture_batch(tiny_decoder, tokens, config, DECODER_SPECIAL)
    names = set(SITES) | {"blocks.1.attn.hook_k", "blocks.1.attn.hook_pattern"}
    _, cache = tiny_decoder.run_with_cache(tokens, names_filter=lambda n: n in names)
    assert set(batch.activations) == set(SITES) == set(batch.gradients)
    for site in SITES:
        torch.testing.assert_close(batch.activations[site], cache[site], rtol=0, atol=0)
    # attention is reduced in its hooks: this batch's sums over the kept positions
    assert set(batch.attention) == {1}
    keys = cache["blocks.1.attn.hook_k"][batch.keep].double().sum(0)
    assert torch.equal(batch.attention[1].sum_k, keys)
    assert batch.attention[1].count == int(batch.keep.sum())
    # hooks only observe: the logits are untouched and no parameter gradient was made
    params = list(tiny_decoder.parameters())
    assert all(p.requires_grad for p in params) and all(p.grad is None for p in params)
    assert not tiny_decoder.hook_dict["hook_embed"]._forward_hooks


def test_without_gradients_activations_only(tiny_decoder):
    tokens = _tokens(4)
    config = CaptureConfig(sites=("blocks.1.hook_resid_post",), gradients=False)
    batch = capture_batch(tiny_decoder, tokens, config, DECODER_SPECIAL)
    assert batch.gradients == {}
    h, g = batch.rows("blocks.1.hook_resid_post")
    assert g is None and h.shape == (3 * 8, 16)


def test_unscored_forward_capture_skips_the_head_and_keeps_the_same_rows(tiny_decoder, monkeypatch):
    """``score_loss=False``: the same kept rows and activations (the mask still follows the
    loss kind), no logits computed, no loss; it cannot ask for gradients."""
    from tangentlens.capture import engine

    tokens = _tokens(4)
    tokens[1, 4] = 1  # a padding position: excluded either way
    sites = ("blocks.0.hook_resid_post", "blocks.1.hook_resid_post")
    scored = capture_batch(
        tiny_decoder, tokens, CaptureConfig(sites, gradients=False), DECODER_SPECIAL
    )
    calls = []
    logits = engine._logits
    monkeypatch.setattr(engine, "_logits", lambda *a: calls.append(1) or logits(*a))
    unscored = capture_batch(
        tiny_decoder,
        tokens,
        CaptureConfig(sites, gradients=False, score_loss=False),
        DECODER_SPECIAL,
    )
    assert calls == [] and math.isnan(unscored.loss) and unscored.n_scored == 0
    assert scored.n_scored > 0 and math.isfinite(scored.loss)
    assert torch.equal(unscored.keep, scored.keep) and unscored.excluded == scored.excluded
    for site in sites:
        assert torch.equal(unscored.rows(site)[0], scored.rows(site)[0])
    with pytest.raises(ValueError, match="score_loss=False skips the loss"):
        CaptureConfig(sites, score_loss=False)


def test_non_finite_gradients_name_site_and_step(tiny_decoder):
    import copy

    broken = copy.deepcopy(tiny_decoder)
    with torch.no_grad():
        broken.blocks[1].mlp.W_out[0, 0] = float("nan")
    config = CaptureConfig(sites=("blocks.0.hook_resid_post", "blocks.1.hook_resid_post"))
    with pytest.raises(ValueError, match=r"blocks\.1\.hook_resid_post.*at step 512"):
        capture_batch(broken, _tokens(5), config, DECODER_SPECIAL, step=512)


def test_bad_input(tiny_decoder):
    with pytest.raises(ValueError, match="unknown hook site"):
        capture_batch(
            tiny_decoder,
            _tokens(0),
            CaptureConfig(sites=("blocks.0.hook_resid_mid2",)),
            DECODER_SPECIAL,
        )
    with pytest.raises(ValueError, match=r"\[0, 50\)"):
        capture_batch(
            tiny_decoder, torch.full((2, 4), 99), CaptureConfig(sites=SITES[:1]), DECODER_SPECIAL
        )
    with pytest.raises(ValueError, match="loss must be one of"):
        CaptureConfig(sites=SITES, loss="clm")
    with pytest.raises(ValueError, match="reduction must be one of"):
        CaptureConfig(sites=SITES, reduction="avg")
    with pytest.raises(ValueError, match="distinct"):
        CaptureConfig(sites=(SITES[0], SITES[0]))
    with pytest.raises(ValueError, match="nothing to capture"):
        CaptureConfig(sites=())


def _stats_of(model, rows, batch_size, statistics, bins, first_sequence=0):
    config = CaptureConfig(
        sites=("blocks.0.hook_resid_post", "blocks.1.hook_resid_post"), attention_layers=(0,)
    )
    return capture_statistics(
        model,
        rows.split(batch_size),
        config,
        DECODER_SPECIAL,
        statistics,
        bins=bins,
        first_sequence=first_sequence,
    )


def test_streamed_statistics_equal_brute_force_and_merge(tiny_decoder):
    rows = _tokens(6, batch=8)
    bins = FrequencyTable.from_tokens(rows.numpy(), vocab_size=50).bins(2)
    statistics = StatisticsConfig(n_bins=2, reservoir_size=40, type_sums=True, vocab_size=50)
    whole = _stats_of(tiny_decoder, rows, 3, statistics, bins)
    first = _stats_of(tiny_decoder, rows[:5], 2, statistics, bins)
    first.merge(_stats_of(tiny_decoder, rows[5:], 3, statistics, bins, first_sequence=5))
    batch = capture_batch(
        tiny_decoder, rows, CaptureConfig(sites=("blocks.1.hook_resid_post",)), DECODER_SPECIAL
    )
    h, g = batch.rows("blocks.1.hook_resid_post")
    kept_bins = bins.assign(batch.tokens[batch.keep])
    assert whole.n_tokens == h.shape[0] == 8 * 8
    assert whole.excluded["total"] == 16 and whole.n_positions == 80
    for stats in (whole, first):
        site = stats.sites["blocks.1.hook_resid_post"]
        torch.testing.assert_close(site.g.second_moment, g.T @ g, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(site.h.sum, h.sum(0), rtol=1e-10, atol=1e-12)
        rows_b1 = g[kept_bins == 1]
        torch.testing.assert_close(site.g_bins[1].second_moment, rows_b1.T @ rows_b1)
    w, f = whole.sites["blocks.1.hook_resid_post"], first.sites["blocks.1.hook_resid_post"]
    assert torch.equal(w.reservoir.ids, f.reservoir.ids)
    torch.testing.assert_close(w.reservoir.columns()["G"], f.reservoir.columns()["G"])
    assert whole.n_scored == first.n_scored == 8 * 9
    assert whole.mean_loss == pytest.approx(first.mean_loss, rel=1e-12)
    torch.testing.assert_close(whole.attention[0].entropy(), first.attention[0].entropy())
    torch.testing.assert_close(whole.attention[0].drift().cosine, first.attention[0].drift().cosine)


def test_stream_bad_input(tiny_decoder):
    rows = _tokens(7)
    with pytest.raises(ValueError, match="FrequencyBins with n_bins=3"):
        _stats_of(tiny_decoder, rows, 2, StatisticsConfig(n_bins=3), None)
    config = CaptureConfig(sites=("blocks.0.hook_resid_post",))
    with pytest.raises(ValueError, match="empty"):
        capture_statistics(tiny_decoder, [], config, DECODER_SPECIAL, StatisticsConfig())
    with pytest.raises(ValueError, match="batch ≥ 1"):
        capture_batch(tiny_decoder, rows[:0], config, DECODER_SPECIAL)
    with pytest.raises(ValueError, match="every batch must have 10 positions"):
        batches = [rows, rows[:, :5]]
        capture_statistics(tiny_decoder, batches, config, DECODER_SPECIAL, StatisticsConfig())


def test_encoder_mlm_gradients_and_seeded_masks(micro_bert):
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
    sites = (
        "embed.hook_embed",
        "blocks.0.hook_normalized_resid_post",
        "blocks.1.hook_normalized_resid_post",
    )
    config = CaptureConfig(sites=sites, loss="mlm", seed=11)
    whole = capture_batch(model, tokens, config, special)
    halves = [capture_batch(model, tokens[:2], config, special)]
    halves.append(capture_batch(model, tokens[2:], config, special, first_sequence=2))
    assert torch.equal(whole.inputs, torch.cat([b.inputs for b in halves]))
    # ``tokens`` are the original ids (what bins use), ``inputs`` what the model read
    assert torch.equal(whole.tokens, tokens)
    masked = whole.inputs == special.mask_id
    # [MASK] inputs carry the loss: they are scored and kept (only [CLS] and [SEP] are not)
    assert masked.any() and whole.keep[masked].all() and whole.scored[masked].all()
    assert torch.equal(whole.keep, (tokens != special.cls_id) & (tokens != special.sep_id))
    assert whole.n_scored == int(whole.scored.sum()) >= int(masked.sum())
    other = capture_batch(model, tokens, CaptureConfig(sites=sites, loss="mlm", seed=12), special)
    assert not torch.equal(other.inputs, whole.inputs)
    # reference: the loss on exactly the scored positions, recovered from a second corruption
    from tangentlens.data.mlm import mlm_corrupt
    from tangentlens.seeding import seeded_generator

    pairs = [
        mlm_corrupt(
            row[None],
            special_ids=special.all_ids(),
            mask_id=special.mask_id,
            vocab_size=model.cfg.d_vocab,
            probability=0.15,
            generator=seeded_generator(11, i),
        )
        for i, row in enumerate(tokens)
    ]
    inputs, labels = torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs])
    assert torch.equal(inputs, whole.inputs) and torch.equal(labels != -100, whole.scored)
    ref = _reference_gradients(model, inputs, labels, sites)
    for site in sites:
        assert _relative_error(whole.gradients[site], ref[site]) <= 1e-6, site


def _encoder_special(tokenizer) -> SpecialTokens:
    return SpecialTokens(
        cls_id=tokenizer.cls_token_id,
        sep_id=tokenizer.sep_token_id,
        pad_id=tokenizer.pad_token_id,
        mask_id=tokenizer.mask_token_id,
        other_ids=frozenset({tokenizer.unk_token_id}),
    )


def test_mlm_statistics_keep_every_scored_position_binned_by_its_original_token(micro_bert):
    """One set of positions (every non-special position of the original text, [MASK] inputs
    included) feeds activation moments, gradient moments, per-bin moments, type sums and the
    reservoir; bins and types come from the original token; G equals an independent autograd
    reference there."""
    from tangentlens.data.mlm import mlm_corrupt
    from tangentlens.seeding import seeded_generator

    model = micro_bert.load(micro_bert.steps[-1]).to(torch.float64)
    tokenizer = micro_bert.tokenizer()
    special = _encoder_special(tokenizer)
    vocab = model.cfg.d_vocab
    gen = torch.Generator().manual_seed(3)
    rows = torch.randint(10, vocab, (6, 32), generator=gen)
    rows[:, 0], rows[:, -1] = special.cls_id, special.sep_id
    rows[1, 12] = special.sep_id  # a document boundary inside a row
    rows[2, -4:-1] = special.pad_id
    last = "blocks.1.hook_normalized_resid_post"
    sites = ("embed.hook_embed", "blocks.0.hook_normalized_resid_post", last)
    config = CaptureConfig(sites=sites, loss="mlm", seed=5)
    frequencies = FrequencyTable.from_tokens(rows, vocab_size=vocab)
    bins = frequencies.bins(2)
    statistics = StatisticsConfig(
        n_bins=2, type_sums=True, vocab_size=vocab, reservoir_size=10_000, seed=1
    )
    stats = capture_statistics(model, rows.split(4), config, special, statistics, bins=bins)

    # independent reference: corruption redrawn from its seeds, gradients by perturbation
    pairs = [
        mlm_corrupt(
            row[None],
            special_ids=special.all_ids(),
            mask_id=special.mask_id,
            vocab_size=vocab,
            probability=0.15,
            generator=seeded_generator(5, i),
        )
        for i, row in enumerate(rows)
    ]
    inputs, labels = torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs])
    ref = _reference_gradients(model, inputs, labels, sites)
    _, cache = model.run_with_cache(inputs, names_filter=lambda n: n in sites)
    specials = torch.tensor(sorted(special.all_ids()))
    keep = ~torch.isin(rows, specials)  # the original text's non-special positions
    scored = labels != -100
    at_mask = inputs == special.mask_id
    replaced = scored & ~at_mask & (inputs != rows)
    assert at_mask.any() and replaced.any()  # both corruptions occur in this batch
    assert int(stats.n_tokens) == int(keep.sum()) and stats.n_scored == int(scored.sum())
    assert keep[scored].all()  # every scored position is kept
    original = rows[keep]
    for site in sites:
        h, g = cache[site][keep], ref[site][keep]
        acc = stats.sites[site]
        torch.testing.assert_close(acc.g.second_moment, g.T @ g, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(acc.h.second_moment, h.T @ h, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(acc.g.sum, g.sum(0), rtol=1e-9, atol=1e-12)
        assert acc.h.count == acc.g.count == int(keep.sum())
        for b in range(2):  # binned by the original token
            in_bin = torch.from_numpy(bins.bin_of_type)[original] == b
            torch.testing.assert_close(
                acc.g_bins[b].second_moment, g[in_bin].T @ g[in_bin], rtol=1e-9, atol=1e-12
            )
        # per-type sums by the original token: [MASK] never appears as a type
        expected_counts = torch.bincount(original, minlength=vocab)
        assert torch.equal(acc.types.count, expected_counts)
        assert acc.types.count[special.mask_id] == 0
        token = int(rows[replaced][0])
        torch.testing.assert_close(acc.types.sum[token], h[original == token].sum(0))
        # the reservoir holds the same positions (all of them: it is larger than the stream)
        ids = (torch.arange(6)[:, None] * 32 + torch.arange(32))[keep]
        assert torch.equal(torch.sort(acc.reservoir.ids).values, ids)
        columns = acc.reservoir.columns()
        order = torch.argsort(acc.reservoir.ids)
        assert torch.equal(columns["token"][order], original)
    # at the last block only the scored positions have a gradient (each of them has one)
    g_last = ref[last]
    nonzero = g_last.abs().amax(dim=-1) > 0
    assert torch.equal(nonzero & keep, scored)
