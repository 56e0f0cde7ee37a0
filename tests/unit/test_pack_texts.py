"""``pack_texts`` tokenises only the texts its rows need (a hub corpus can be millions of
documents): at most one row more than it keeps, never the whole corpus."""

from __future__ import annotations

import numpy as np
import pytest

from tangentlens.core import data as core_data
from tangentlens.data import SpecialTokens

SPECIAL = SpecialTokens(bos_id=0, eos_id=0, pad_id=1)


class _Tokenizer:
    """Characters as ids 2 … 51, no special tokens; counts the texts it was given."""

    def __init__(self) -> None:
        self.texts = 0

    def __call__(self, texts, add_special_tokens):
        assert add_special_tokens is False
        self.texts += len(texts)
        return {"input_ids": [[2 + ord(c) % 50 for c in text] for text in texts]}


def test_only_the_texts_the_rows_need_are_tokenised(monkeypatch):
    asked: list[int | None] = []
    real = core_data.tokenize_corpus

    def recording(texts, encode, **kwargs):
        asked.append(kwargs.get("max_tokens"))
        return real(texts, encode, **kwargs)

    monkeypatch.setattr(core_data, "tokenize_corpus", recording)
    texts = [f"document {i} of the corpus" for i in range(300)]
    tokenizer = _Tokenizer()
    rows = core_data.pack_texts(texts, tokenizer, "decoder", SPECIAL, 16, max_tokens=20)
    assert rows.shape == (1, 16) and asked == [2 * 16]  # one row kept: two rows' tokens read
    assert tokenizer.texts == 64  # one batch of the tokenizer, not the 300 texts
    rows = core_data.pack_texts(texts, tokenizer, "decoder", SPECIAL, 16, max_tokens=100)
    assert rows.shape == (6, 16) and asked[-1] == 7 * 16
    everything = core_data.pack_texts(texts, _Tokenizer(), "decoder", SPECIAL, 16, 10**6)
    assert np.array_equal(rows, everything[:6])  # the first rows of packing every text


def test_texts_too_short_for_one_row_are_refused_and_one_row_is_enough():
    one = core_data.pack_texts(["x" * 20], _Tokenizer(), "decoder", SPECIAL, 16, max_tokens=10**6)
    assert one.shape == (1, 16)
    with pytest.raises(ValueError, match=r"^the texts give no row of 64 tokens; lower seq_len"):
        core_data.pack_texts(["x" * 20], _Tokenizer(), "decoder", SPECIAL, 64, max_tokens=10**6)
