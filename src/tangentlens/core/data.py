"""The sweep's analysis data: token rows, frequency table and bins, prepared once per run.

The ``data`` unit tokenises and packs the recipe's corpus exactly as the suite was trained and
writes ``state/data.npz`` (rows, type counts, special-token ids, loss kind); every other unit
reads that file, so no worker re-tokenises (possibly with another tokenizers version). Its
SHA-256 goes into the manifest.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tangentlens.core.recipe import Recipe
from tangentlens.data import (
    Corpus,
    FrequencyBins,
    FrequencyTable,
    SpecialTokens,
    document_encoder,
    limit_tokens,
    load_corpus,
    pack_rows,
    special_tokens_of,
    tokenize_corpus,
)

__all__ = [
    "DATA_FILE",
    "AnalysisData",
    "capture_loss",
    "data_sha256",
    "load_analysis_data",
    "pack_texts",
    "prepare_analysis_data",
    "save_analysis_data",
]

#: Where the data unit writes the analysis data, relative to the run directory.
DATA_FILE = "state/data.npz"


@dataclass(frozen=True)
class AnalysisData:
    """``rows`` (n_rows × seq_len token ids), the frequency table counted over the kept
    positions, its ``n_bins`` bins, the special tokens and the loss ("next_token", "mlm", or
    "none" for a suite without a language-modelling head)."""

    rows: np.ndarray
    frequencies: FrequencyTable
    bins: FrequencyBins
    special: SpecialTokens
    loss: str


def prepare_analysis_data(suite: Any, recipe: Recipe) -> AnalysisData:
    """Tokenise and pack the recipe's corpus for ``suite`` (a ``CheckpointSuite``)."""
    spec = recipe.data
    corpus = suite.analysis_corpus() if spec.corpus == "analysis" else load_corpus(spec.corpus)
    tokenizer = suite.tokenizer()
    special = special_tokens_of(tokenizer, suite.family)
    rows = pack_texts(corpus, tokenizer, suite.family, special, spec.seq_len, spec.max_tokens)
    # counted over the positions a capture keeps (no EOS/BOS/CLS/SEP/PAD, no position 0 or
    # last position of a causal row), with the original tokens a capture bins by
    frequencies = FrequencyTable.from_rows(
        rows, len(tokenizer), special, causal=suite.family != "encoder"
    )
    return AnalysisData(
        rows=np.asarray(rows),
        frequencies=frequencies,
        bins=frequencies.bins(spec.n_bins),
        special=special,
        loss=capture_loss(suite.family, suite.has_lm_head),
    )


def pack_texts(
    texts: Corpus | Sequence[str],
    tokenizer: Any,
    family: str,
    special: SpecialTokens,
    seq_len: int,
    max_tokens: int,
) -> np.ndarray:
    """The first ``max(1, max_tokens // seq_len)`` rows of ``seq_len`` tokens of ``texts``,
    tokenised and packed exactly as the mini suites are trained (documents without special
    tokens; the packer adds the row's [CLS] … [SEP] for encoders, EOS between documents for
    decoders). Only as many texts are tokenised as those rows need."""
    wanted = max(1, max_tokens // seq_len)
    encode = document_encoder(tokenizer)
    docs = tokenize_corpus(texts, encode, max_tokens=(wanted + 1) * seq_len)
    rows = pack_rows(docs, seq_len, family=family, special=special)
    if len(rows) == 0:
        raise ValueError(
            f"the texts give no row of {seq_len} tokens; lower seq_len (data.seq_len in a recipe)"
        )
    return np.asarray(limit_tokens(rows, max_tokens))


def capture_loss(family: str, has_lm_head: bool) -> str:
    """The capture loss of a model of ``family``: none without a language-modelling head
    (activations only), else the training loss of its family."""
    if not has_lm_head:
        return "none"
    return "mlm" if family == "encoder" else "next_token"


def save_analysis_data(data: AnalysisData, path: str | Path) -> None:
    """Write ``data`` to ``path`` (an ``.npz``; the bins are recomputed from the counts)."""
    special = {
        f.name: getattr(data.special, f.name)
        for f in dataclasses.fields(data.special)
        if f.name != "other_ids"
    }
    meta = {"special": special, "other_ids": sorted(data.special.other_ids), "loss": data.loss}
    with open(path, "wb") as handle:
        np.savez(
            handle,
            rows=data.rows,
            counts=data.frequencies.counts,
            meta=np.array(json.dumps(meta, sort_keys=True)),
        )


def load_analysis_data(path: str | Path, n_bins: int) -> AnalysisData:
    """Read what :func:`save_analysis_data` wrote, binned into ``n_bins`` frequency bins."""
    with np.load(path, allow_pickle=False) as saved:
        rows, counts, meta = saved["rows"], saved["counts"], json.loads(str(saved["meta"]))
    frequencies = FrequencyTable(counts)
    special = SpecialTokens(**meta["special"], other_ids=frozenset(meta["other_ids"]))
    return AnalysisData(rows, frequencies, frequencies.bins(n_bins), special, meta["loss"])


def data_sha256(path: str | Path) -> str:
    """The SHA-256 of the data file (recorded in the manifest)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
