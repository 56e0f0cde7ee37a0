"""Train the built-in mini suites: a Pythia-architecture decoder and a BERT-style MLM encoder.

Both are trained on the shipped corpus (its training split only; the held-out split is what
analysis uses), with a byte-level BPE tokenizer trained on the same split, and saved in Hugging
Face format on Pythia's log-spaced checkpoint schedule, so that they load exactly like any local
folder of checkpoints. Training is seeded and deterministic (no dropout, like Pythia; every random
draw comes from a seeded generator, the global RNG is forked and restored).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from transformers import (
    BertConfig,
    BertForMaskedLM,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)
from transformers.utils import logging as hf_logging

from tangentlens.data import (
    DECODER_SPECIAL_TOKENS,
    ENCODER_SPECIAL_TOKENS,
    Corpus,
    FrequencyTable,
    load_corpus,
    pack_causal,
    pack_encoder,
    tokenize_corpus,
    train_bpe_tokenizer,
)
from tangentlens.data.mlm import mlm_corrupt
from tangentlens.models.schedule import log_spaced_schedule

TRAINING_FORMAT = 1
"""Bumped whenever a change to this module changes the trained weights (part of the cache key)."""

Architecture = Literal["pythia", "bert"]
ARCHITECTURES: tuple[str, ...] = ("pythia", "bert")


@dataclass(frozen=True)
class MiniSuiteConfig:
    """Everything that determines a mini suite's checkpoints (hashed into its cache key)."""

    architecture: Architecture
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    d_mlp: int = 512
    vocab_size: int = 4096
    seq_len: int = 128
    batch_size: int = 16
    total_steps: int = 1200
    checkpoint_every: int = 100
    learning_rate: float = 1e-3
    min_learning_rate_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.01
    mlm_probability: float = 0.15
    corpus: str = "shakespeare"
    heldout_fraction: float = 0.1
    max_documents: int | None = None
    eval_sequences: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ValueError(
                f"unknown mini-suite architecture {self.architecture!r}; allowed: {ARCHITECTURES}"
            )
        positive = [
            "d_model",
            "n_layers",
            "n_heads",
            "d_mlp",
            "vocab_size",
            "seq_len",
            "batch_size",
            "total_steps",
            "checkpoint_every",
            "eval_sequences",
        ]
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        if self.seq_len < 4:
            raise ValueError(f"seq_len must be at least 4, got {self.seq_len}")
        if not 0 < self.mlm_probability < 1:
            raise ValueError(f"mlm_probability must be in (0, 1), got {self.mlm_probability}")
        if not 0 < self.min_learning_rate_ratio <= 1:
            raise ValueError(
                f"min_learning_rate_ratio must be in (0, 1], got {self.min_learning_rate_ratio}"
            )
        log_spaced_schedule(self.total_steps, self.checkpoint_every)  # validates both

    @property
    def family(self) -> Literal["decoder", "encoder"]:
        return "decoder" if self.architecture == "pythia" else "encoder"

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len

    def schedule(self) -> tuple[int, ...]:
        return log_spaced_schedule(self.total_steps, self.checkpoint_every)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def cache_key(self, corpus_fingerprint: str) -> str:
        """Hash of the config, the corpus contents and the training format (12 hex digits)."""
        payload = json.dumps(
            {"config": self.to_dict(), "corpus": corpus_fingerprint, "format": TRAINING_FORMAT},
            sort_keys=True,
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


_MICRO = {
    "d_model": 32,
    "n_layers": 2,
    "n_heads": 2,
    "d_mlp": 64,
    "vocab_size": 512,
    "seq_len": 32,
    "batch_size": 8,
    "total_steps": 40,
    "checkpoint_every": 10,
    "warmup_steps": 5,
    "max_documents": 120,
    "eval_sequences": 16,
}

MINI_SUITE_CONFIGS: dict[str, MiniSuiteConfig] = {
    "mini-pythia": MiniSuiteConfig(architecture="pythia"),
    "mini-bert": MiniSuiteConfig(architecture="bert", learning_rate=5e-4, total_steps=1000),
    # smoke-test suites: train in about a second (checkpoints 0 1 2 4 8 10 20 30 40)
    "micro-pythia": MiniSuiteConfig(architecture="pythia", **_MICRO),
    "micro-bert": MiniSuiteConfig(architecture="bert", **_MICRO),
}


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

    def encode(texts):
        return tokenizer(list(texts), add_special_tokens=False)["input_ids"]

    train_docs = tokenize_corpus(train.shuffled(config.seed), encode)
    heldout_docs = tokenize_corpus(heldout, encode)
    if config.architecture == "pythia":
        eos = tokenizer.eos_token_id
        train_rows = pack_causal(train_docs, config.seq_len, eos_id=eos)
        eval_rows = pack_causal(heldout_docs, config.seq_len, eos_id=eos)
    else:
        cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
        train_rows = pack_encoder(train_docs, config.seq_len, cls_id=cls, sep_id=sep)
        eval_rows = pack_encoder(heldout_docs, config.seq_len, cls_id=cls, sep_id=sep)
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
    )


def build_model(config: MiniSuiteConfig, tokenizer: PreTrainedTokenizerFast) -> PreTrainedModel:
    """A freshly initialised Hugging Face model for the config (seeded)."""
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
        return BertForMaskedLM(hf_config)


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
    return model(input_ids=inputs, labels=labels).loss


@torch.no_grad()
def evaluate(model: PreTrainedModel, data: PreparedData, config: MiniSuiteConfig) -> float:
    """Mean held-out loss per scored token (next-token CE, or MLM CE with a fixed seeded mask)."""
    model.eval()
    generator = torch.Generator().manual_seed(config.seed + 1)
    total, count = 0.0, 0
    for batch in data.eval_rows.split(config.batch_size):
        if config.architecture == "pythia":
            inputs, labels = batch, batch
            n_scored = batch[:, 1:].numel()
        else:
            inputs, labels = mask_for_mlm(batch, data.tokenizer, config.mlm_probability, generator)
            n_scored = int((labels != -100).sum())
        if n_scored:
            total += model(input_ids=inputs, labels=labels).loss.item() * n_scored
            count += n_scored
    model.train()
    return total / max(count, 1)


def _batches(n_rows: int, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Row indices, reshuffled each epoch by the seeded generator."""
    while True:
        order = torch.randperm(n_rows, generator=generator)
        for start in range(0, n_rows - batch_size + 1, batch_size):
            yield order[start : start + batch_size]


def _save_checkpoint(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, folder: Path
) -> None:
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
    started = time.perf_counter()
    notify(TrainingEvent("data", 0, config.total_steps))
    data = prepare_data(config)
    model = build_model(config, data.tokenizer)
    model.train()
    optimizer = _optimizer(model, config)
    schedule = set(config.schedule())
    generator = torch.Generator().manual_seed(config.seed)
    batches = _batches(len(data.train_rows), config.batch_size, generator)
    checkpoints: dict[str, dict[str, float | None]] = {}
    recent: list[float] = []

    def checkpoint(step: int) -> None:
        _save_checkpoint(model, data.tokenizer, out_dir / f"step{step}")
        val_loss = evaluate(model, data, config)
        train_loss = sum(recent) / len(recent) if recent else None
        checkpoints[str(step)] = {"val_loss": val_loss, "train_loss": train_loss}
        recent.clear()
        notify(TrainingEvent("checkpoint", step, config.total_steps, train_loss, val_loss))

    out_dir.mkdir(parents=True, exist_ok=True)
    checkpoint(0)
    for step in range(1, config.total_steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = _learning_rate(config, step)
        loss = _loss(model, data.train_rows[next(batches)], config, data.tokenizer, generator)
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
        "torch": torch.__version__,
    }
    (out_dir / "suite.json").write_text(json.dumps(metadata, indent=2))
    return metadata
