"""Mini-suite training: schedule, determinism, learning, MLM masking, cache atomicity."""

import dataclasses
import json
import math
import multiprocessing
import os

import pytest
import torch
from safetensors.torch import load_file

from tangentlens.data import SpecialTokens
from tangentlens.models.suites import ensure_mini_suite, mini_suite_dir
from tangentlens.models.training import (
    MINI_SUITE_CONFIGS,
    MiniSuiteConfig,
    _learning_rate,
    _loss,
    build_model,
    evaluate,
    mask_for_mlm,
    prepare_data,
    repack_rows,
    sinusoidal_positions,
    train_mini_suite,
    wrap_tokenizer,
)
from tests.numerics import FLOAT64_PARITY, assert_float64_parity


def _weights(folder):
    return load_file(folder / "model.safetensors")


def test_micro_suite_has_the_log_spaced_schedule_and_metadata(micro_pythia):
    assert micro_pythia.steps == (0, 1, 2, 4, 8, 10, 20, 30, 40)
    meta = json.loads((micro_pythia.root / "suite.json").read_text())
    assert meta["tokens_per_step"] == 8 * 32
    assert micro_pythia.tokens_seen(20) == 20 * 8 * 32
    for step in micro_pythia.steps:
        folder = micro_pythia.folder(step)
        assert (folder / "config.json").exists() and (folder / "tokenizer.json").exists()
    config = json.loads((micro_pythia.folder(0) / "config.json").read_text())
    assert config["model_type"] == "gpt_neox"
    assert config["use_parallel_residual"] is True
    assert config["rope_parameters"]["partial_rotary_factor"] == 0.25  # Pythia's partial rotary
    assert config["tie_word_embeddings"] is False


def test_training_is_deterministic(tmp_path, micro_config):
    config = micro_config("pythia", total_steps=10, checkpoint_every=10)
    train_mini_suite(config, tmp_path / "a", "a")
    train_mini_suite(config, tmp_path / "b", "b")
    for step in (0, 10):
        first, second = (
            _weights(tmp_path / "a" / f"step{step}"),
            _weights(tmp_path / "b" / f"step{step}"),
        )
        assert first.keys() == second.keys()
        assert all(torch.equal(first[k], second[k]) for k in first)
    # a different seed gives different weights
    train_mini_suite(
        micro_config("pythia", total_steps=10, checkpoint_every=10, seed=1), tmp_path / "c", "c"
    )
    other = _weights(tmp_path / "c" / "step0")
    assert not all(torch.equal(first[k], other[k]) for k in first)


def test_training_does_not_touch_the_global_rng(tmp_path, micro_config):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    train_mini_suite(micro_config("bert", total_steps=2, checkpoint_every=1), tmp_path / "s", "s")
    assert torch.equal(torch.rand(3), expected)


def test_decoder_learns_far_below_the_unigram_entropy(tmp_path, micro_config):
    config = micro_config(
        "pythia",
        d_model=64,
        n_heads=4,
        d_mlp=256,
        total_steps=300,
        checkpoint_every=100,
        learning_rate=3e-3,
        batch_size=16,
        seq_len=64,
        max_documents=300,
        eval_sequences=32,
    )
    meta = train_mini_suite(config, tmp_path / "s", "s")
    losses = {int(s): c["val_loss"] for s, c in meta["checkpoints"].items()}
    assert losses[0] == pytest.approx(math.log(config.vocab_size), rel=0.05)  # untrained: uniform
    assert losses[300] < meta["unigram_entropy"] - 0.5
    assert losses[300] < losses[100] < losses[0]


def test_encoder_loss_falls(micro_bert):
    losses = micro_bert.validation_loss()
    assert micro_bert.family == "encoder"
    assert losses[40] < losses[0] - 0.2


def test_mlm_masking_follows_bert(micro_config):
    config = micro_config("bert")
    tokenizer = wrap_tokenizer(config, ["some text to train a tokenizer on " * 20])
    rows = torch.randint(5, len(tokenizer), (200, 64))
    rows[:, 0], rows[:, -1] = tokenizer.cls_token_id, tokenizer.sep_token_id
    inputs, labels = mask_for_mlm(rows, tokenizer, 0.15, torch.Generator().manual_seed(0))
    chosen = labels != -100
    assert not chosen[:, [0, -1]].any()  # special tokens are never scored
    assert torch.equal(labels[chosen], rows[chosen])
    share = chosen[:, 1:-1].float().mean().item()
    n = chosen[:, 1:-1].numel()
    assert abs(share - 0.15) < 4 * math.sqrt(0.15 * 0.85 / n)
    masked = (inputs == tokenizer.mask_token_id) & chosen
    kept = (inputs == rows) & chosen
    n_chosen = int(chosen.sum())
    assert abs(masked.sum().item() / n_chosen - 0.8) < 0.03
    # 10 % unchanged plus the random replacements that happen to hit the same token
    assert abs(kept.sum().item() / n_chosen - 0.1) < 0.03
    assert torch.equal(inputs[~chosen], rows[~chosen])  # unscored positions are untouched


def test_learning_rate_warms_up_then_decays_to_the_floor():
    config = MiniSuiteConfig(
        architecture="pythia",
        total_steps=100,
        warmup_steps=10,
        checkpoint_every=10,
        learning_rate=1.0,
        min_learning_rate_ratio=0.1,
    )
    assert _learning_rate(config, 5) == pytest.approx(0.5)
    assert _learning_rate(config, 10) == pytest.approx(1.0)
    assert _learning_rate(config, 100) == pytest.approx(0.1)
    assert _learning_rate(config, 55) == pytest.approx(0.55)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"architecture": "gpt2"}, "allowed"),
        ({"d_model": 30, "n_heads": 4}, "divisible"),
        ({"total_steps": 0}, "positive"),
        ({"checkpoint_every": 500, "total_steps": 100}, "every"),
        ({"mlm_probability": 1.5}, "mlm_probability"),
        ({"position_init": "learned"}, "position_init"),
        ({"seq_len_warmup_steps": 100, "total_steps": 100, "checkpoint_every": 10}, "warmup"),
        ({"seq_len_warmup_steps": 10, "warmup_seq_len": 128}, "warmup_seq_len"),
    ],
)
def test_bad_configs_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        MiniSuiteConfig(**{"architecture": "pythia", **overrides})


def test_cached_suite_is_reused_and_interrupted_training_leaves_nothing(tmp_path, micro_config):
    config = micro_config("pythia", total_steps=4, checkpoint_every=2)
    calls = []

    def interrupt(event):
        calls.append(event)
        if event.phase == "checkpoint" and event.step == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ensure_mini_suite("t", config=config, cache_dir=tmp_path, progress=interrupt)
    assert list(tmp_path.iterdir()) == []  # no half-written suite, no staging folder

    suite = ensure_mini_suite("t", config=config, cache_dir=tmp_path)
    stamp = (suite.root / "suite.json").stat().st_mtime_ns
    again = ensure_mini_suite("t", config=config, cache_dir=tmp_path)
    assert again.root == suite.root == mini_suite_dir("t", config, tmp_path)
    assert (again.root / "suite.json").stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="not trained yet"):
        ensure_mini_suite(
            "t", config=micro_config("pythia", seed=5), cache_dir=tmp_path, train=False
        )


def _train_and_count(config, cache, log) -> None:
    """Ensure the suite, appending this process's pid to ``log`` if it trained it."""

    def progress(event):
        if event.phase == "data":
            with open(log, "a") as handle:
                handle.write(f"{os.getpid()}\n")

    ensure_mini_suite("t", config=config, cache_dir=cache, progress=progress)


def test_two_processes_needing_one_suite_train_it_once(tmp_path, micro_config):
    """A training holds a lock beside the suite: a second process that needs the same suite
    meanwhile (two sweeps started together, the test run's workers) waits and reads it."""
    config = micro_config("pythia", total_steps=20, checkpoint_every=10)
    # spawned, not forked: a child forked after torch's thread pool started can hang in it
    context = multiprocessing.get_context("spawn")
    log = tmp_path / "trained-by"
    processes = [
        context.Process(target=_train_and_count, args=(config, tmp_path / "cache", log))
        for _ in range(2)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=300)
    assert [p.exitcode for p in processes] == [0, 0]
    assert len(log.read_text().split()) == 1  # trained once
    names = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert names == [mini_suite_dir("t", config, tmp_path / "cache").name]  # no lock left


def test_cache_key_depends_on_config_and_corpus():
    base = MINI_SUITE_CONFIGS["mini-pythia"]
    assert base.cache_key("abc") == base.cache_key("abc")
    assert base.cache_key("abc") != base.cache_key("abd")
    other = MiniSuiteConfig(architecture="pythia", seed=1)
    assert base.cache_key("abc") != other.cache_key("abc")


def test_unknown_mini_suite_is_refused(tmp_path):
    with pytest.raises(ValueError, match="mini-pythia"):
        ensure_mini_suite("mini-gpt", cache_dir=tmp_path)


def test_encoder_eval_reports_the_loss_at_mask_inputs_against_an_independent_reference(
    micro_config,
):
    """val_loss: HF's own MLM loss over every scored position; val_loss_mask: the same with only
    the [MASK]-input positions labelled; unigram_loss_mask: the training unigram at those."""
    config = micro_config("bert")
    data = prepare_data(config)
    # float64: evaluate's head and Hugging Face's loss are two computations of one quantity; in
    # float32 they differ by float32 rounding in another order (no CPU-independent tolerance)
    model = build_model(config, data.tokenizer).eval().double()
    losses = evaluate(model, data, config)
    generator = torch.Generator().manual_seed(config.seed + 1)  # evaluate's fixed mask
    total = masked = unigram = 0.0
    n_scored = n_masked = 0
    counts = torch.as_tensor(data.unigram_counts, dtype=torch.float64) + 1
    log_p = counts.log() - counts.sum().log()
    with torch.no_grad():
        for batch in data.eval_rows.split(config.batch_size):
            inputs, labels = mask_for_mlm(batch, data.tokenizer, 0.15, generator)
            k = int((labels != -100).sum())
            total += model(input_ids=inputs, labels=labels).loss.item() * k
            n_scored += k
            at_mask = inputs == data.tokenizer.mask_token_id
            only = torch.where(at_mask, labels, -100)
            m = int(at_mask.sum())
            masked += model(input_ids=inputs, labels=only).loss.item() * m
            unigram -= log_p[labels[at_mask]].sum().item()
            n_masked += m
    assert losses["n_mask_positions"] == n_masked > 0
    assert losses["val_loss"] == pytest.approx(total / n_scored, rel=FLOAT64_PARITY)
    assert losses["val_loss_mask"] == pytest.approx(masked / n_masked, rel=FLOAT64_PARITY)
    assert losses["unigram_loss_mask"] == pytest.approx(unigram / n_masked, rel=1e-9)


def test_masked_head_training_loss_equals_the_full_head_loss(micro_config):
    """The head on the masked positions only gives the full head's loss and weight gradient:
    compared in float64 (two computations of one quantity, within float64 rounding; in float32
    they differ by float32 rounding in another order)."""
    config = micro_config("bert")
    data = prepare_data(config)
    model = build_model(config, data.tokenizer).double()
    rows = data.train_rows[:8]
    ours = _loss(model, rows, config, data.tokenizer, torch.Generator().manual_seed(4))
    inputs, labels = mask_for_mlm(rows, data.tokenizer, 0.15, torch.Generator().manual_seed(4))
    full = model(input_ids=inputs, labels=labels).loss
    assert float(ours.detach()) == pytest.approx(float(full.detach()), rel=FLOAT64_PARITY)
    # the same gradient reaches the weights
    (g_ours,) = torch.autograd.grad(ours, [model.bert.embeddings.word_embeddings.weight])
    (g_full,) = torch.autograd.grad(full, [model.bert.embeddings.word_embeddings.weight])
    assert_float64_parity(g_ours, g_full, "word embeddings")


def test_encoder_position_embeddings_start_as_scaled_sinusoids(micro_config):
    config = micro_config("bert")
    tokenizer = wrap_tokenizer(config, ["some text to train a tokenizer on " * 20])
    table = build_model(config, tokenizer).bert.embeddings.position_embeddings.weight.detach()
    p = torch.arange(config.seq_len, dtype=torch.float64)[:, None]
    i = torch.arange(config.d_model // 2, dtype=torch.float64)
    angle = p / 10000 ** (2 * i / config.d_model)
    expected = torch.stack([angle.sin(), angle.cos()], dim=-1).reshape(config.seq_len, -1)
    torch.testing.assert_close(table, (0.02 * math.sqrt(2) * expected).float())
    assert table.pow(2).mean().sqrt().item() == pytest.approx(0.02, rel=0.05)
    hand = sinusoidal_positions(4, 6)
    assert hand[2, 4].item() == pytest.approx(math.sin(2 / 10000 ** (4 / 6)), rel=1e-6)
    assert hand[3, 1].item() == pytest.approx(math.cos(3), rel=1e-6)
    noise = build_model(dataclasses.replace(config, position_init="normal"), tokenizer)
    other = noise.bert.embeddings.position_embeddings.weight.detach()
    assert not torch.allclose(other, table) and other.std().item() == pytest.approx(0.02, rel=0.2)


@pytest.mark.slow
def test_default_encoder_learns_to_fill_masks_a_nat_below_the_unigram_entropy():
    """mini-bert (trained once into the user cache, ~4-6 min on 2 idle cores): the held-out MLM
    loss at [MASK]-input positions ends at least 1 nat under the corpus unigram entropy."""
    suite = ensure_mini_suite("mini-bert")
    entropy = suite.metadata["unigram_entropy"]
    at_mask = suite.masked_validation_loss()
    first, last = suite.steps[0], suite.steps[-1]
    assert 6.0 < entropy < 6.5
    assert at_mask[first] > entropy
    assert at_mask[last] < entropy - 1.0
    assert suite.metadata["config"]["mlm_probability"] == 0.15


def test_sequence_length_warmup_doubles_in_equal_stages_and_keeps_tokens_per_step():
    config = MiniSuiteConfig(
        architecture="bert", seq_len=128, seq_len_warmup_steps=600, warmup_seq_len=16
    )
    lengths = [config.seq_len_at(step) for step in range(1, 1201)]
    assert lengths[:200] == [16] * 200 and lengths[200:400] == [32] * 200
    assert lengths[400:600] == [64] * 200 and set(lengths[600:]) == {128}
    assert MiniSuiteConfig(architecture="bert").seq_len_at(1) == 128  # no warm-up by default


def test_repacked_rows_hold_the_same_token_stream():
    cls, sep = 2, 3
    body = torch.arange(10, 10 + 4 * 14).reshape(4, 14)
    rows = torch.cat([torch.full((4, 1), cls), body, torch.full((4, 1), sep)], dim=1)
    special = SpecialTokens(cls_id=cls, sep_id=sep, pad_id=0, mask_id=4)
    short = repack_rows(rows, 9, "encoder", special)  # bodies of 7 tokens
    assert (short[:, 0] == cls).all() and (short[:, -1] == sep).all()
    assert torch.equal(short[:, 1:-1].reshape(-1), body.reshape(-1))


def test_encoder_suite_with_a_sequence_length_warmup_trains(tmp_path, micro_config):
    config = micro_config("bert", seq_len_warmup_steps=20, warmup_seq_len=8)
    meta = train_mini_suite(config, tmp_path / "s", "s")
    losses = {int(s): c["val_loss"] for s, c in meta["checkpoints"].items()}
    assert losses[40] < losses[0] - 0.2
