"""Tokenise a corpus and pack the token stream into fixed-length rows.

* causal (Pythia style): documents joined with EOS after each, cut into consecutive rows,
  optionally each row opened by BOS;
* encoder (BERT style): documents joined with SEP between them, each row ``[CLS] … [SEP]``.

The trailing incomplete row is dropped; no other token of the stream is lost or repeated.

Documents are tokenised *without* special tokens (:func:`document_encoder`): the packers add the
only special tokens a row holds. The mini suites are trained on rows made by
:func:`document_encoder` + :func:`pack_rows`, and the sweep's analysis rows are made by the same
two functions, so analysis text has exactly the layout the model was trained on (a tokenizer's
default ``add_special_tokens=True`` would wrap every document in ``[CLS] … [SEP]``, leaving
special tokens mid-row that training never showed the model).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch
from jaxtyping import Int

if TYPE_CHECKING:
    from tangentlens.data.corpus import Corpus

logger = logging.getLogger(__name__)

__all__ = [
    "FAMILIES",
    "BatchEncoder",
    "SpecialTokens",
    "document_encoder",
    "iter_batches",
    "limit_tokens",
    "pack_causal",
    "pack_encoder",
    "pack_rows",
    "special_tokens_of",
    "tokenize_corpus",
]

#: Model families: decoders (next-token loss, causal packing) and encoders (MLM, [CLS] … [SEP]).
FAMILIES: tuple[str, ...] = ("decoder", "encoder")

Rows = Int[np.ndarray, "n_seq seq_len"]


@dataclass(frozen=True)
class SpecialTokens:
    """Ids of a model's special tokens (``None`` where it has none).

    Decoders (Pythia) use ``bos_id = eos_id = 0, pad_id = 1``; encoders (BERT) use ``cls_id``,
    ``sep_id``, ``pad_id``, ``mask_id``; ``other_ids`` holds any further special ids (e.g. UNK).
    """

    bos_id: int | None = None
    eos_id: int | None = None
    pad_id: int | None = None
    cls_id: int | None = None
    sep_id: int | None = None
    mask_id: int | None = None
    other_ids: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name == "other_ids":
                continue
            value = getattr(self, f.name)
            if value is not None and (not _is_int(value) or value < 0):
                raise ValueError(f"{f.name} must be a non-negative integer or None, got {value!r}")
        others = frozenset(self.other_ids)
        if any(not _is_int(i) or i < 0 for i in others):
            raise ValueError(f"other_ids must hold non-negative integers, got {sorted(others)}")
        object.__setattr__(self, "other_ids", frozenset(int(i) for i in others))

    def all_ids(self) -> frozenset[int]:
        """Every special id: the non-``None`` named ids plus ``other_ids``."""
        named = (getattr(self, f.name) for f in fields(self) if f.name != "other_ids")
        return frozenset(int(i) for i in named if i is not None) | self.other_ids


class BatchEncoder(Protocol):
    """Encodes a batch of texts into token ids (no special tokens added)."""

    def __call__(self, texts: Sequence[str], /) -> list[list[int]]: ...


def special_tokens_of(tokenizer: object, family: str) -> SpecialTokens:
    """The :class:`SpecialTokens` of a Hugging Face tokenizer (read from its ``*_token_id``
    attributes): BOS, EOS and PAD for decoders; CLS, SEP, PAD, MASK (and UNK as ``other_ids``)
    for encoders."""
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")

    def token_id(name: str) -> int | None:
        return getattr(tokenizer, f"{name}_token_id", None)

    if family == "encoder":
        unk = token_id("unk")
        return SpecialTokens(
            pad_id=token_id("pad"),
            cls_id=token_id("cls"),
            sep_id=token_id("sep"),
            mask_id=token_id("mask"),
            other_ids=frozenset() if unk is None else frozenset({unk}),
        )
    return SpecialTokens(bos_id=token_id("bos"), eos_id=token_id("eos"), pad_id=token_id("pad"))


def document_encoder(tokenizer: object) -> BatchEncoder:
    """A :class:`BatchEncoder` over a Hugging Face tokenizer: each text's ids with **no** special
    tokens added (``add_special_tokens=False``), as the mini suites are trained."""

    def encode(texts: Sequence[str]) -> list[list[int]]:
        return tokenizer(list(texts), add_special_tokens=False)["input_ids"]  # type: ignore[operator]

    return encode


def _is_int(x: object) -> bool:
    return isinstance(x, int | np.integer) and not isinstance(x, bool)


def _check_positive(value: int, name: str) -> None:
    if not _is_int(value) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def tokenize_corpus(
    corpus: Corpus | Sequence[str],
    encode: BatchEncoder,
    batch_size: int = 64,
    *,
    max_tokens: int | None = None,
) -> list[np.ndarray]:
    """Token ids of every document (a corpus or a list of texts), in order: a list of int64
    arrays of shape (n_tok,). With ``max_tokens``, tokenising stops after the batch in which the
    documents reach ``max_tokens`` tokens (one separator per document counted): packing the
    result gives the first rows of packing every document."""
    _check_positive(batch_size, "batch_size")
    if max_tokens is not None:
        _check_positive(max_tokens, "max_tokens")
    texts = corpus.texts() if hasattr(corpus, "texts") else list(corpus)
    out: list[np.ndarray] = []
    seen = 0
    for start in range(0, len(texts), batch_size):
        batch = texts[start : start + batch_size]
        encoded = encode(batch)
        if len(encoded) != len(batch):
            raise ValueError(
                f"encoder returned {len(encoded)} id lists for a batch of {len(batch)} texts; "
                "it must return one list per text"
            )
        out.extend(np.asarray(ids, dtype=np.int64).reshape(-1) for ids in encoded)
        seen += sum(len(ids) + 1 for ids in encoded)
        if max_tokens is not None and seen >= max_tokens:
            break
    return out


def _stream(docs: Sequence[np.ndarray], separator: int, *, after_each: bool) -> np.ndarray:
    """Concatenate documents with ``separator`` after each (or between them); (n_stream,)."""
    if len(docs) == 0:
        raise ValueError("docs is empty: packing needs at least one tokenised document")
    parts: list[np.ndarray] = []
    sep = np.array([separator], dtype=np.int64)
    for i, doc in enumerate(docs):
        arr = np.asarray(doc)
        if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer) or arr.size == 0):
            raise ValueError(
                f"docs[{i}] must be a 1-D integer array of token ids, got shape {arr.shape} and "
                f"dtype {arr.dtype}"
            )
        if arr.size == 0:
            continue  # an empty document adds no separator
        if arr.min() < 0:
            raise ValueError(f"docs[{i}] holds a negative token id {arr.min()}; ids must be ≥ 0")
        if parts and not after_each:
            parts.append(sep)
        parts.append(arr.astype(np.int64, copy=False))
        if after_each:
            parts.append(sep)
    if not parts:
        raise ValueError(f"all {len(docs)} documents are empty: there are no tokens to pack")
    return np.concatenate(parts)


def _cut(stream: np.ndarray, body_len: int) -> tuple[np.ndarray, int]:
    """The stream cut into consecutive rows of ``body_len`` tokens, and their number."""
    n_rows = stream.size // body_len
    if n_rows == 0:
        logger.warning(
            "token stream of %d tokens is shorter than one row (%d stream tokens): no rows",
            stream.size,
            body_len,
        )
    return stream[: n_rows * body_len].reshape(n_rows, body_len), n_rows


def pack_causal(
    docs: Sequence[np.ndarray], seq_len: int, *, eos_id: int, bos_id: int | None = None
) -> Rows:
    """Pack documents for a causal model: int64 rows of shape (n_seq, seq_len).

    The stream is ``doc₀ EOS doc₁ EOS …`` (Pythia style; empty documents are skipped), cut into
    consecutive rows of ``seq_len`` tokens, or of ``seq_len − 1`` tokens after a BOS when
    ``bos_id`` is given. The trailing incomplete row is dropped (a stream shorter than one row
    gives zero rows).
    """
    _check_positive(seq_len, "seq_len")
    if not _is_int(eos_id) or eos_id < 0:
        raise ValueError(f"eos_id must be a non-negative integer, got {eos_id!r}")
    if bos_id is not None and (not _is_int(bos_id) or bos_id < 0):
        raise ValueError(f"bos_id must be a non-negative integer or None, got {bos_id!r}")
    if bos_id is not None and seq_len < 2:
        raise ValueError(f"seq_len must be at least 2 with a BOS token, got {seq_len}")
    stream = _stream(docs, eos_id, after_each=True)
    if bos_id is None:
        body, _ = _cut(stream, seq_len)
        return np.ascontiguousarray(body)
    body, n_rows = _cut(stream, seq_len - 1)
    return np.concatenate([np.full((n_rows, 1), bos_id, dtype=np.int64), body], axis=1)


def pack_encoder(docs: Sequence[np.ndarray], seq_len: int, *, cls_id: int, sep_id: int) -> Rows:
    """Pack documents for an encoder: int64 rows ``[CLS] + (seq_len − 2) tokens + [SEP]``.

    The stream is ``doc₀ SEP doc₁ SEP … doc_last`` (SEP between documents; empty documents are
    skipped), cut into consecutive pieces of ``seq_len − 2`` tokens; the trailing incomplete
    piece is dropped.
    """
    _check_positive(seq_len, "seq_len")
    if seq_len < 3:
        raise ValueError(f"seq_len must be at least 3 for [CLS] … [SEP] rows, got {seq_len}")
    for name, value in (("cls_id", cls_id), ("sep_id", sep_id)):
        if not _is_int(value) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    stream = _stream(docs, sep_id, after_each=False)
    body, n_rows = _cut(stream, seq_len - 2)
    cls = np.full((n_rows, 1), cls_id, dtype=np.int64)
    sep = np.full((n_rows, 1), sep_id, dtype=np.int64)
    return np.concatenate([cls, body, sep], axis=1)


def pack_rows(
    docs: Sequence[np.ndarray], seq_len: int, *, family: str, special: SpecialTokens
) -> Rows:
    """Pack documents the way the family is trained: :func:`pack_causal` with ``special.eos_id``
    (no BOS) for decoders, :func:`pack_encoder` with ``special.cls_id`` / ``sep_id`` for
    encoders."""
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    if family == "encoder":
        if special.cls_id is None or special.sep_id is None:
            raise ValueError("packing encoder rows needs special.cls_id and special.sep_id")
        return pack_encoder(docs, seq_len, cls_id=special.cls_id, sep_id=special.sep_id)
    if special.eos_id is None:
        raise ValueError("packing decoder rows needs special.eos_id")
    return pack_causal(docs, seq_len, eos_id=special.eos_id)


def _check_rows(rows: np.ndarray) -> None:
    if not isinstance(rows, np.ndarray) or rows.ndim != 2:
        raise ValueError(
            f"rows must be a 2-D numpy array (n_seq, seq_len), got {type(rows).__name__} "
            f"with shape {getattr(rows, 'shape', None)}"
        )
    if rows.shape[0] == 0 or rows.shape[1] == 0:
        raise ValueError(f"rows is empty (shape {rows.shape}); at least one row is needed")


def limit_tokens(rows: Rows, max_tokens: int) -> Rows:
    """The first ``max(1, ⌊max_tokens / seq_len⌋)`` rows (all rows if there are fewer)."""
    _check_rows(rows)
    _check_positive(max_tokens, "max_tokens")
    return rows[: max(1, max_tokens // rows.shape[1])]


def iter_batches(rows: Rows, batch_size: int) -> Iterator[Int[torch.Tensor, "batch pos"]]:
    """Consecutive int64 tensors of ``batch_size`` rows (the last may be smaller).

    Each batch is a copy: changing it in place leaves ``rows`` untouched. Arguments are checked
    when this is called, not at the first batch.
    """
    _check_rows(rows)
    _check_positive(batch_size, "batch_size")

    def batches() -> Iterator[torch.Tensor]:
        for start in range(0, rows.shape[0], batch_size):
            yield torch.tensor(rows[start : start + batch_size], dtype=torch.int64)

    return batches()
