"""Train the built-in mini suites: a Pythia-architecture decoder and a BERT-style MLM encoder.

Both are trained on the shipped corpus (its training split only; the held-out split is what
analysis uses), with a byte-level BPE tokenizer trained on the same split, and saved in Hugging
Face format on Pythia's log-spaced checkpoint schedule, so that they load exactly like any local
folder of checkpoints. Training is seeded and deterministic (no dropout, like Pythia; every random
draw comes from a seeded generator, the global RNG is forked and restored).

Documents are tokenised with no special tokens (:func:`tangentlens.data.document_encoder`) and
packed by :func:`tangentlens.data.pack_rows`: analysis text goes through the same two functions,
so it holds exactly the token layout the model was trained on.

The encoder (BERT MLM, 15 % of positions scored, 80/10/10) gets two things that only change how
fast it learns, not what it computes:

* the MLM head is applied to the scored positions only (the loss is identical; the head's
  softmax over the vocabulary at the 85 % unscored positions was ~40 % of a step's time);
* its learned absolute position embeddings start as sinusoids (Vaswani et al. 2017) scaled to
  the word embeddings' init scale, instead of noise (``position_init``). At a ``[MASK]`` input
  all information about the token comes through attention, and a random position table gives
  attention no way to find the neighbouring tokens: with it the encoder sat at the unigram
  entropy for its whole budget. A sinusoidal table makes "attend to offset ±k" one linear map
  for every position;
* a sequence-length warm-up (``seq_len_warmup_steps``; Li et al. 2022, "The stability-efficiency
  dilemma"): shorter rows (mini-bert: 32, then 64 tokens; the same tokens per step) before the
  full length. Under the near-uniform attention of a fresh model a neighbour holds 1/L of what
  attention brings to a ``[MASK]``, so short rows give the gradient that teaches attention to
  find neighbours more signal. Measured on the shipped corpus (held-out loss at ``[MASK]``
  inputs; unigram entropy 6.249 nats): sinusoids alone, 1200 steps of 32 × 128 tokens at
  lr 1e-3: 6.222, attention still uniform in every head; with a 16/32/64 warm-up over 600 steps:
  5.399; the shipped config (32/64 warm-up, lr 2e-3, 1400 steps): 4.583.

Held-out MLM loss is reported over every scored position (``val_loss``) and over the
``[MASK]``-input positions alone (``val_loss_mask``): the 10 % of scored positions that keep their
token can be copied, which flatters the overall loss by ~0.5 nat.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerFast

from tangentlens.data import (
    DECODER_SPECIAL_TOKENS,
    ENCODER_SPECIAL_TOKENS,
    Corpus,
    FrequencyTable,
    document_encoder,
    load_corpus,
    pack_rows,
    special_tokens_of,
    tokenize_corpus,
    train_bpe_tokenizer,
)
from tangentlens.data.mlm import IGNORE_INDEX, mlm_corrupt
from tangentlens.models.configs import MINI_SUITE_CONFIGS, TRAINING_FORMAT, MiniSuiteConfig

if TYPE_CHECKING:  # the model classes load with training (seconds): not for a suite's reader
    from transformers import PreTrainedModel


@dataclass(frozen=True)
class TrainingEvent:
    """Progress report: ``phase`` is "data", "train" or "checkpoint"."""

    phase: str
    step: int
    total_steps: int
    loss: float | None = None
    val_loss: float | None = None


ProgressCallback = Callable[[TrainingEvent], None]


@dataclass
class PreparedData:
    """Token rows for training and evaluation, plus the tokenizer and corpus facts."""

    tokenizer: PreTrainedTokenizerFast
    train_rows: torch.Tensor
    eval_rows: torch.Tensor
    unigram_entropy: float
    facts: dict[str, Any]
    unigram_counts: np.ndarray | None = None


def training_split(config: MiniSuiteConfig) -> tuple[Corpus, Corpus, str]:
    """(train, held-out, fingerprint of the full corpus) for a config; deterministic in its seed."""
    corpus = load_corpus(config.corpus)
    fingerprint = corpus.fingerprint()
    if config.max_documents is not None:
        corpus = Corpus(
            name=f"{corpus.name}[:{config.max_documents}]",
            documents=corpus.shuffled(config.seed).documents[: config.max_documents],
        )
    split = corpus.split(config.heldout_fraction, seed=config.seed)
    return split.train, split.heldout, fingerprint


def heldout_corpus(config: MiniSuiteConfig) -> Corpus:
    """The held-out split a suite never trained on: the default analysis corpus."""
    return training_split(config)[1]


def corpus_fingerprint(config: MiniSuiteConfig) -> str:
    """Fingerprint of the corpus a config trains on (part of the cache key)."""
    return load_corpus(config.corpus).fingerprint()


def wrap_tokenizer(config: MiniSuiteConfig, texts: list[str]) -> PreTrainedTokenizerFast:
    """Train the suite's byte-level BPE tokenizer and wrap it for transformers."""
    if config.architecture == "pythia":
        backend = train_bpe_tokenizer(texts, config.vocab_size, DECODER_SPECIAL_TOKENS)
        eos, pad = DECODER_SPECIAL_TOKENS
        return PreTrainedTokenizerFast(
            tokenizer_object=backend,
            bos_token=eos,
            eos_token=eos,
            unk_token=eos,
            pad_token=pad,
        )
    from tokenizers.processors import TemplateProcessing

    backend = train_bpe_tokenizer(texts, config.vocab_size, ENCODER_SPECIAL_TOKENS)
    pad, unk, cls, sep, mask = ENCODER_SPECIAL_TOKENS
    backend.post_processor = TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=f"{cls} $A {sep} $B {sep}",
        special_tokens=[(cls, backend.token_to_id(cls)), (sep, backend.token_to_id(sep))],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=pad,
        unk_token=unk,
        cls_token=cls,
        sep_token=sep,
        mask_token=mask,
        model_max_length=config.seq_len,
    )


def prepare_data(config: MiniSuiteConfig) -> PreparedData:
    """Split the corpus, train the tokenizer on the training split, tokenize and pack."""
    train, heldout, fingerprint = training_split(config)
    tokenizer = wrap_tokenizer(config, train.texts())

    encode = document_encoder(tokenizer)  # no special tokens: the packer adds the only ones
    special = special_tokens_of(tokenizer, config.family)
    train_docs = tokenize_corpus(train.shuffled(config.seed), encode)
    heldout_docs = tokenize_corpus(heldout, encode)
    train_rows = pack_rows(train_docs, config.seq_len, family=config.family, special=special)
    eval_rows = pack_rows(heldout_docs, config.seq_len, family=config.family, special=special)
    if len(train_rows) < config.batch_size or len(eval_rows) == 0:
        raise ValueError(
            f"the corpus is too small for this suite: {len(train_rows)} training rows and "
            f"{len(eval_rows)} held-out rows of {config.seq_len} tokens (need at least "
            f"batch_size={config.batch_size} and 1)"
        )
    stream = np.concatenate(train_docs)
    table = FrequencyTable.from_tokens(stream, vocab_size=len(tokenizer))
    facts = {
        "corpus": config.corpus,
        "corpus_fingerprint": fingerprint,
        "train_documents": len(train.documents),
        "heldout_documents": len(heldout.documents),
        "train_tokens": int(stream.size),
        "heldout_tokens": int(sum(d.size for d in heldout_docs)),
        "train_rows": len(train_rows),
        "eval_rows": min(len(eval_rows), config.eval_sequences),
    }
    return PreparedData(
        tokenizer=tokenizer,
        train_rows=torch.from_numpy(train_rows),
        eval_rows=torch.from_numpy(eval_rows[: config.eval_sequences]),
        unigram_entropy=table.unigram_entropy(),
        facts=facts,
        unigram_counts=table.counts,
    )


def build_model(config: MiniSuiteConfig, tokenizer: PreTrainedTokenizerFast) -> PreTrainedModel:
    """A freshly initialised Hugging Face model for the config (seeded)."""
    from transformers import BertConfig, BertForMaskedLM, GPTNeoXConfig, GPTNeoXForCausalLM

    common = {
        "vocab_size": len(tokenizer),
        "hidden_size": config.d_model,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "intermediate_size": config.d_mlp,
        "max_position_embeddings": config.seq_len,
    }
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        if config.architecture == "pythia":
            hf_config = GPTNeoXConfig(
                **common,
                rotary_pct=0.25,
                use_parallel_residual=True,
                tie_word_embeddings=False,
                hidden_act="gelu",
                attention_dropout=0.0,
                hidden_dropout=0.0,
                bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
            return GPTNeoXForCausalLM(hf_config)
        hf_config = BertConfig(
            **common,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            pad_token_id=tokenizer.pad_token_id,
        )
        model = BertForMaskedLM(hf_config)
    if config.position_init == "sinusoidal":
        table = model.bert.embeddings.position_embeddings.weight
        with torch.no_grad():
            scale = hf_config.initializer_range * math.sqrt(2.0)  # entry RMS = the init std
            table.copy_(scale * sinusoidal_positions(table.shape[0], table.shape[1]))
    return model


def sinusoidal_positions(n_positions: int, d_model: int) -> torch.Tensor:
    """Vaswani et al.'s table, ``(n_positions, d_model)``: ``sin(p / 10000^(2i/d))`` in column
    ``2i`` and ``cos`` of the same in column ``2i + 1`` (entries in [−1, 1])."""
    position = torch.arange(n_positions, dtype=torch.float64)[:, None]
    rate = torch.exp(
        -math.log(10000.0) * torch.arange(0, d_model, 2, dtype=torch.float64) / d_model
    )
    table = torch.zeros(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * rate)
    table[:, 1::2] = torch.cos(position * rate)[:, : d_model // 2]
    return table.to(torch.float32)


def _learning_rate(config: MiniSuiteConfig, step: int) -> float:
    """Linear warm-up, then cosine decay to ``min_learning_rate_ratio`` of the peak."""
    if step <= config.warmup_steps:
        return config.learning_rate * step / max(1, config.warmup_steps)
    progress = (step - config.warmup_steps) / max(1, config.total_steps - config.warmup_steps)
    floor = config.min_learning_rate_ratio
    return config.learning_rate * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def _optimizer(model: PreTrainedModel, config: MiniSuiteConfig) -> torch.optim.Optimizer:
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "LayerNorm" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2 or "LayerNorm" in n]
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=config.learning_rate, betas=(0.9, 0.95))


def mask_for_mlm(
    rows: torch.Tensor,
    tokenizer: PreTrainedTokenizerFast,
    probability: float,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT masking of ``rows`` (see :func:`tangentlens.data.mlm.mlm_corrupt`) with the
    tokenizer's special ids, mask id and vocabulary. Returns (inputs, labels)."""
    return mlm_corrupt(
        rows,
        special_ids=tokenizer.all_special_ids,
        mask_id=tokenizer.mask_token_id,
        vocab_size=len(tokenizer),
        probability=probability,
        generator=generator,
    )


def mlm_token_losses(
    model: PreTrainedModel, inputs: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy of a ``BertForMaskedLM`` at every scored position (labels ≠ -100), in
    row-major order, and the boolean ``(batch, pos)`` mask of those positions. The MLM head runs
    on the scored positions only (the loss equals ``model(inputs, labels=labels).loss``)."""
    scored = labels != IGNORE_INDEX
    hidden = model.bert(input_ids=inputs).last_hidden_state  # type: ignore[attr-defined]
    logits = model.cls(hidden[scored])  # type: ignore[attr-defined]
    return torch.nn.functional.cross_entropy(logits, labels[scored], reduction="none"), scored


def _loss(
    model: PreTrainedModel,
    rows: torch.Tensor,
    config: MiniSuiteConfig,
    tokenizer: PreTrainedTokenizerFast,
    generator: torch.Generator,
) -> torch.Tensor:
    if config.architecture == "pythia":
        return model(input_ids=rows, labels=rows).loss
    inputs, labels = mask_for_mlm(rows, tokenizer, config.mlm_probability, generator)
    losses, _ = mlm_token_losses(model, inputs, labels)
    return losses.mean() if losses.numel() else losses.sum()


@torch.no_grad()
def evaluate(
    model: PreTrainedModel, data: PreparedData, config: MiniSuiteConfig
) -> dict[str, float]:
    """Held-out losses per scored token (next-token CE, or MLM CE with a fixed seeded mask).

    ``val_loss``: every scored token. Encoders also get ``val_loss_mask``: the MLM loss at the
    ``[MASK]``-input positions only (the 10 % of scored positions that keep their token can be
    copied), and ``unigram_loss_mask``: the loss the training split's unigram distribution
    (add-one smoothed) gets at those same positions — the bar "using context" has to clear.
    """
    model.eval()
    generator = torch.Generator().manual_seed(config.seed + 1)
    total, count = 0.0, 0
    masked_total, unigram_total, masked_count = 0.0, 0.0, 0
    log_unigram = None
    if config.architecture == "bert" and data.unigram_counts is not None:
        counts = torch.as_tensor(data.unigram_counts, dtype=torch.float64) + 1.0
        log_unigram = counts.log() - counts.sum().log()
    for batch in data.eval_rows.split(config.batch_size):
        if config.architecture == "pythia":
            n_scored = batch[:, 1:].numel()
            total += model(input_ids=batch, labels=batch).loss.item() * n_scored
            count += n_scored
            continue
        inputs, labels = mask_for_mlm(batch, data.tokenizer, config.mlm_probability, generator)
        losses, scored = mlm_token_losses(model, inputs, labels)
        total += losses.double().sum().item()
        count += losses.numel()
        at_mask = inputs[scored] == data.tokenizer.mask_token_id
        masked_total += losses[at_mask].double().sum().item()
        masked_count += int(at_mask.sum())
        if log_unigram is not None:
            unigram_total -= log_unigram[labels[scored][at_mask]].sum().item()
    model.train()
    out = {"val_loss": total / max(count, 1)}
    if config.architecture == "bert":
        out["val_loss_mask"] = masked_total / max(masked_count, 1)
        if log_unigram is not None:
            out["unigram_loss_mask"] = unigram_total / max(masked_count, 1)
        out["n_mask_positions"] = masked_count
    return out


def repack_rows(rows: torch.Tensor, seq_len: int, family: str, special: Any) -> torch.Tensor:
    """Training rows re-cut to ``seq_len`` tokens: the packed stream (rows without their
    [CLS] … [SEP] frame for encoders) packed again by :func:`~tangentlens.data.pack_rows`."""
    body = rows[:, 1:-1] if family == "encoder" else rows
    stream = body.reshape(-1).numpy()
    return torch.from_numpy(pack_rows([stream], seq_len, family=family, special=special))


def _batches(n_rows: int, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Row indices, reshuffled each epoch by the seeded generator."""
    while True:
        order = torch.randperm(n_rows, generator=generator)
        for start in range(0, n_rows - batch_size + 1, batch_size):
            yield order[start : start + batch_size]


def _save_checkpoint(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, folder: Path
) -> None:
    from transformers.utils import logging as hf_logging

    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()


def train_mini_suite(
    config: MiniSuiteConfig,
    out_dir: Path,
    name: str,
    progress: ProgressCallback | None = None,
) -> dict[str, Any]:
    """Train a suite into ``out_dir`` (``step{N}/`` folders plus ``suite.json``).

    Returns the suite metadata that is also written to ``out_dir/suite.json``. The caller owns
    atomicity (train into a temporary folder, then rename).
    """
    notify = progress or (lambda event: None)
    started, started_cpu = time.perf_counter(), time.process_time()
    notify(TrainingEvent("data", 0, config.total_steps))
    data = prepare_data(config)
    model = build_model(config, data.tokenizer)
    model.train()
    optimizer = _optimizer(model, config)
    schedule = set(config.schedule())
    generator = torch.Generator().manual_seed(config.seed)
    special = special_tokens_of(data.tokenizer, config.family)
    rows_by_length = {config.seq_len: data.train_rows}
    batches_by_length: dict[int, Iterator[torch.Tensor]] = {}

    def next_batch(step: int) -> torch.Tensor:
        """Rows of this step's length; as many tokens per step whatever the length."""
        length = config.seq_len_at(step)
        if length not in rows_by_length:
            rows_by_length[length] = repack_rows(data.train_rows, length, config.family, special)
        rows = rows_by_length[length]
        if length not in batches_by_length:
            n_rows = max(1, config.batch_size * config.seq_len // length)
            batches_by_length[length] = _batches(len(rows), n_rows, generator)
        return rows[next(batches_by_length[length])]

    checkpoints: dict[str, dict[str, float | None]] = {}
    recent: list[float] = []

    def checkpoint(step: int) -> None:
        _save_checkpoint(model, data.tokenizer, out_dir / f"step{step}")
        losses = evaluate(model, data, config)
        train_loss = sum(recent) / len(recent) if recent else None
        checkpoints[str(step)] = {**losses, "train_loss": train_loss}
        recent.clear()
        notify(
            TrainingEvent("checkpoint", step, config.total_steps, train_loss, losses["val_loss"])
        )

    out_dir.mkdir(parents=True, exist_ok=True)
    checkpoint(0)
    for step in range(1, config.total_steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = _learning_rate(config, step)
        loss = _loss(model, next_batch(step), config, data.tokenizer, generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        recent.append(loss.item())
        notify(TrainingEvent("train", step, config.total_steps, loss.item()))
        if step in schedule:
            checkpoint(step)
    metadata = {
        "name": name,
        "kind": name if name in MINI_SUITE_CONFIGS else "mini",
        "family": config.family,
        "architecture": config.architecture,
        "config": config.to_dict(),
        "training_format": TRAINING_FORMAT,
        "tokens_per_step": config.tokens_per_step,
        "steps": sorted(int(s) for s in checkpoints),
        "checkpoints": checkpoints,
        "unigram_entropy": data.unigram_entropy,
        "data": data.facts,
        "training_seconds": time.perf_counter() - started,
        # CPU time of this process (all its threads): comparable across loaded and idle machines
        "training_cpu_seconds": time.process_time() - started_cpu,
        "torch": torch.__version__,
    }
    (out_dir / "suite.json").write_text(json.dumps(metadata, indent=2))
    return metadata
