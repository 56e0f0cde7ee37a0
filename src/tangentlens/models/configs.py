"""The models package's configs as plain dataclasses, importable without torch or any model
library: the mini suites' training configs (:data:`MINI_SUITE_CONFIGS`, trained by
:mod:`tangentlens.models.training`) and the untrained-block experiment's
(:mod:`tangentlens.models.untrained_block`). A mini suite's checkpoint steps follow from its
config alone (:meth:`MiniSuiteConfig.schedule`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass
from numbers import Real
from typing import Any, Literal

from tangentlens.checks import check_count
from tangentlens.models.schedule import log_spaced_schedule

__all__ = [
    "ARCHITECTURES",
    "BLOCKS",
    "DEFAULT_BIAS_NORMS",
    "DTYPES",
    "MINI_SUITE_CONFIGS",
    "POSITION_INITS",
    "TRAINING_FORMAT",
    "MiniSuiteConfig",
    "UntrainedBlockConfig",
]

TRAINING_FORMAT = 2
"""Bumped whenever a change to :mod:`tangentlens.models.training` changes the trained weights (part
of the cache key)."""

Architecture = Literal["pythia", "bert"]
#: Architectures a mini suite can have (``MiniSuiteConfig.architecture``).
ARCHITECTURES: tuple[str, ...] = ("pythia", "bert")
#: How a mini encoder's position table starts (``MiniSuiteConfig.position_init``).
POSITION_INITS: tuple[str, ...] = ("sinusoidal", "normal")


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
    position_init: str = "sinusoidal"
    seq_len_warmup_steps: int = 0
    warmup_seq_len: int = 16
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
        if not 0 <= self.seq_len_warmup_steps < self.total_steps:
            raise ValueError(
                f"seq_len_warmup_steps must be in [0, total_steps={self.total_steps}), got "
                f"{self.seq_len_warmup_steps}"
            )
        if self.seq_len_warmup_steps and not 4 <= self.warmup_seq_len < self.seq_len:
            raise ValueError(
                f"warmup_seq_len must be in [4, seq_len={self.seq_len}), got {self.warmup_seq_len}"
            )
        if not 0 < self.mlm_probability < 1:
            raise ValueError(f"mlm_probability must be in (0, 1), got {self.mlm_probability}")
        if self.position_init not in POSITION_INITS:
            raise ValueError(
                f"position_init must be one of {POSITION_INITS}, got {self.position_init!r}"
            )
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
        """The steps training saves a checkpoint at: the trained suite's steps."""
        return log_spaced_schedule(self.total_steps, self.checkpoint_every)

    def seq_len_at(self, step: int) -> int:
        """Row length of training step ``step`` (1-based). Without a sequence-length warm-up:
        ``seq_len``. With one: ``warmup_seq_len`` doubling (16, 32, 64, …, below ``seq_len``)
        in equal stages over the first ``seq_len_warmup_steps`` steps, then ``seq_len``."""
        if step > self.seq_len_warmup_steps:
            return self.seq_len
        lengths = [self.warmup_seq_len]
        while lengths[-1] * 2 < self.seq_len:
            lengths.append(lengths[-1] * 2)
        stage = (max(step, 1) - 1) * len(lengths) // self.seq_len_warmup_steps
        return lengths[min(stage, len(lengths) - 1)]

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

#: The built-in mini suites by name, each with its training config.
MINI_SUITE_CONFIGS: dict[str, MiniSuiteConfig] = {
    "mini-pythia": MiniSuiteConfig(architecture="pythia"),
    # 15 % masking, 80/10/10; 32 × 128 tokens per step (~490 scored) for 1400 steps, the
    # first 600 on rows of 32 and 64 tokens
    "mini-bert": MiniSuiteConfig(
        architecture="bert",
        batch_size=32,
        learning_rate=2e-3,
        warmup_steps=100,
        total_steps=1400,
        eval_sequences=128,
        seq_len_warmup_steps=600,
        warmup_seq_len=32,
    ),
    # smoke-test suites: train in about a second (checkpoints 0 1 2 4 8 10 20 30 40)
    "micro-pythia": MiniSuiteConfig(architecture="pythia", **_MICRO),
    "micro-bert": MiniSuiteConfig(architecture="bert", **_MICRO),
}


BlockKind = Literal["bert", "pre_ln"]
#: Untrained-block kinds: ``bert`` (post-LN) or ``pre_ln``.
BLOCKS: tuple[str, ...] = ("bert", "pre_ln")
#: Dtypes the untrained-block experiment runs in.
DTYPES: tuple[str, ...] = ("float32", "float64")
#: The norms N of the common bias the experiment adds to its input, by default.
DEFAULT_BIAS_NORMS: tuple[float, ...] = (0.0, 1e-2, 1e-1, 1.0, 1e1, 1e2, 1e3, 1e4)


def _positive(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not 0 < float(value) < math.inf:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class UntrainedBlockConfig:
    """The experiment's sizes, initialisation, grid and seed (defaults: BERT-base, the paper's
    16 × 512 inputs). Validated on construction; ``bias_norms`` is stored as a tuple of floats.

    The block: ``d_model``, ``n_heads``, ``d_mlp``; ``block``, one of :data:`BLOCKS`
    ("bert" = post-LN, "pre_ln"); ``causal``: mask the future. Inputs: ``n_sequences`` random
    sequences of ``seq_len`` tokens drawn from a table of ``vocab_size`` rows ~
    N(0, ``embedding_std``²), plus a common bias of each norm in ``bias_norms``. Weights ~
    N(0, ``init_std``²). Run in ``dtype`` (one of :data:`DTYPES`), ``batch_size`` sequences at
    a time, every draw seeded from ``seed``.
    """

    d_model: int = 768
    n_heads: int = 12
    d_mlp: int = 3072
    n_sequences: int = 16
    seq_len: int = 512
    bias_norms: tuple[float, ...] = DEFAULT_BIAS_NORMS
    init_std: float = 0.02
    embedding_std: float = 0.02
    vocab_size: int = 30522
    causal: bool = False
    block: BlockKind = "bert"
    dtype: Literal["float32", "float64"] = "float64"
    batch_size: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "d_mlp", "n_sequences", "seq_len", "vocab_size"):
            check_count(getattr(self, name), name, minimum=1)
        check_count(self.batch_size, "batch_size", minimum=1)
        check_count(self.seed, "seed", minimum=0)
        if self.d_model % self.n_heads:
            raise ValueError(
                f"n_heads must divide d_model, got d_model={self.d_model}, n_heads={self.n_heads}"
            )
        if self.n_sequences * self.seq_len < 2:
            raise ValueError(
                "cosine anisotropy needs at least 2 tokens: n_sequences × seq_len must be ≥ 2, "
                f"got {self.n_sequences} × {self.seq_len}"
            )
        _positive(self.init_std, "init_std")
        _positive(self.embedding_std, "embedding_std")
        if not isinstance(self.causal, bool):
            raise ValueError(f"causal must be True or False, got {self.causal!r}")
        if self.block not in BLOCKS:
            raise ValueError(f"block must be one of {BLOCKS}, got {self.block!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        norms = self.bias_norms
        if isinstance(norms, str | bytes) or not hasattr(norms, "__iter__"):
            raise ValueError(f"bias_norms must be a sequence of numbers ≥ 0, got {norms!r}")
        norms = tuple(norms)
        bad = [
            v
            for v in norms
            if isinstance(v, bool) or not isinstance(v, Real) or not 0 <= float(v) < math.inf
        ]
        if not norms or bad:
            raise ValueError(
                "bias_norms must be a non-empty sequence of finite numbers ≥ 0, "
                f"got {self.bias_norms!r}"
            )
        object.__setattr__(self, "bias_norms", tuple(float(v) for v in norms))
