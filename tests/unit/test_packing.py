import numpy as np
import pytest
import torch

from tangentlens.data import Corpus, Document
from tangentlens.data.packing import (
    SpecialTokens,
    document_encoder,
    iter_batches,
    limit_tokens,
    pack_causal,
    pack_encoder,
    pack_rows,
    special_tokens_of,
    tokenize_corpus,
)


def random_docs(seed: int, n_docs: int = 12, vocab: int = 50) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(5, vocab, size=rng.integers(0, 40)) for _ in range(n_docs)]


def reference_stream(docs, sep, *, after_each):
    """Python-loop reference: separator after each non-empty doc, or between them."""
    out = []
    for doc in docs:
        if len(doc) == 0:
            continue
        if out and not after_each:
            out.append(sep)
        out.extend(int(t) for t in doc)
        if after_each:
            out.append(sep)
    return out


# --------------------------------------------------------------------------- SpecialTokens


def test_special_tokens_all_ids():
    assert SpecialTokens().all_ids() == frozenset()
    s = SpecialTokens(bos_id=0, eos_id=0, pad_id=1, other_ids=frozenset({7, 9}))
    assert s.all_ids() == {0, 1, 7, 9}
    s = SpecialTokens(pad_id=0, cls_id=2, sep_id=3, mask_id=4, other_ids={1})
    assert s.all_ids() == {0, 1, 2, 3, 4} and isinstance(s.other_ids, frozenset)


@pytest.mark.parametrize(
    "kwargs", [{"bos_id": -1}, {"pad_id": 1.5}, {"sep_id": True}, {"other_ids": {-3}}]
)
def test_special_tokens_reject_bad_ids(kwargs):
    with pytest.raises(ValueError, match="non-negative integer"):
        SpecialTokens(**kwargs)


# --------------------------------------------------------------------------- tokenize_corpus


def test_tokenize_corpus_encodes_every_document_in_batches():
    corpus = Corpus("c", tuple(Document(f"d{i}", "ab"[: i % 3] + "xyz"[:i]) for i in range(5)))
    calls = []

    def encode(texts):
        calls.append(len(texts))
        return [[ord(ch) for ch in t] for t in texts]

    docs = tokenize_corpus(corpus, encode, batch_size=2)
    assert calls == [2, 2, 1]
    assert len(docs) == 5
    for doc, text in zip(docs, corpus.texts(), strict=True):
        assert doc.dtype == np.int64 and doc.ndim == 1
        assert doc.tolist() == [ord(ch) for ch in text]


@pytest.mark.parametrize("family", ["decoder", "encoder"])
def test_tokenize_corpus_stops_once_the_rows_are_covered(family):
    """With max_tokens, only the first batches are tokenised, and packing them gives exactly the
    first rows of packing every document (the stream's cut is prefix-stable)."""
    texts = ["".join(chr(97 + (i * 7 + j) % 26) for j in range(5 + i % 11)) for i in range(200)]
    calls = []

    def encode(batch):
        calls.append(len(batch))
        return [[ord(ch) for ch in t] for t in batch]

    special = SpecialTokens(eos_id=0, cls_id=1, sep_id=2)
    seq_len, rows = 16, 10
    every = pack_rows(tokenize_corpus(texts, encode, 8), seq_len, family=family, special=special)
    calls.clear()
    docs = tokenize_corpus(texts, encode, 8, max_tokens=(rows + 1) * seq_len)
    assert len(calls) < 200 // 8 and len(docs) == 8 * len(calls)  # stopped early
    assert (
        sum(len(d) + 1 for d in docs[:-8]) < (rows + 1) * seq_len <= sum(len(d) + 1 for d in docs)
    )
    first = pack_rows(docs, seq_len, family=family, special=special)
    np.testing.assert_array_equal(first[:rows], every[:rows])


def test_tokenize_corpus_rejects_bad_encoders_and_batch_sizes():
    corpus = Corpus("c", (Document("a", "x"), Document("b", "y")))
    with pytest.raises(ValueError, match="one list per text"):
        tokenize_corpus(corpus, lambda texts: [[1]])
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        tokenize_corpus(corpus, lambda texts: [[1]] * len(texts), batch_size=0)


# --------------------------------------------------------------------------- pack_causal


def test_pack_causal_hand_built():
    docs = [np.array([1, 2, 3]), np.array([4, 5])]
    # stream 1 2 3 E 4 5 E → two rows of 3, the trailing E dropped
    assert pack_causal(docs, 3, eos_id=0).tolist() == [[1, 2, 3], [0, 4, 5]]
    assert pack_causal(docs, 3, eos_id=0, bos_id=9).tolist() == [[9, 1, 2], [9, 3, 0], [9, 4, 5]]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("seq_len", [1, 2, 7, 16])
def test_pack_causal_reconstructs_the_stream(seed, seq_len):
    docs = random_docs(seed)
    stream = reference_stream(docs, 0, after_each=True)
    rows = pack_causal(docs, seq_len, eos_id=0)
    assert rows.dtype == np.int64 and rows.shape == (len(stream) // seq_len, seq_len)
    assert rows.ravel().tolist() == stream[: rows.size]
    if seq_len >= 2:
        rows = pack_causal(docs, seq_len, eos_id=0, bos_id=1)
        body = seq_len - 1
        assert rows.shape == (len(stream) // body, seq_len)
        assert (rows[:, 0] == 1).all()
        assert rows[:, 1:].ravel().tolist() == stream[: rows.shape[0] * body]


def test_pack_causal_short_stream_gives_zero_rows():
    rows = pack_causal([np.array([1, 2])], 8, eos_id=0)
    assert rows.shape == (0, 8) and rows.dtype == np.int64


@pytest.mark.parametrize(
    "docs, kwargs, match",
    [
        ([], {"eos_id": 0}, "docs is empty"),
        ([np.array([], dtype=np.int64)], {"eos_id": 0}, "no tokens to pack"),
        ([np.array([[1, 2]])], {"eos_id": 0}, "1-D integer array"),
        ([np.array([1.0, 2.0])], {"eos_id": 0}, "1-D integer array"),
        ([np.array([1, -2])], {"eos_id": 0}, "negative token id"),
        ([np.array([1, 2])], {"eos_id": -1}, "eos_id"),
        ([np.array([1, 2])], {"eos_id": 0, "bos_id": -1}, "bos_id"),
    ],
)
def test_pack_causal_rejects_bad_input(docs, kwargs, match):
    with pytest.raises(ValueError, match=match):
        pack_causal(docs, 4, **kwargs)


@pytest.mark.parametrize("seq_len", [0, -3])
def test_pack_rejects_non_positive_lengths(seq_len):
    with pytest.raises(ValueError, match="seq_len must be a positive integer"):
        pack_causal([np.array([1])], seq_len, eos_id=0)
    with pytest.raises(ValueError, match="seq_len must be a positive integer"):
        pack_encoder([np.array([1])], seq_len, cls_id=2, sep_id=3)
    with pytest.raises(ValueError, match="at least 2"):
        pack_causal([np.array([1])], 1, eos_id=0, bos_id=1)
    with pytest.raises(ValueError, match="at least 3"):
        pack_encoder([np.array([1])], 2, cls_id=2, sep_id=3)


# --------------------------------------------------------------------------- pack_encoder


def test_pack_encoder_hand_built():
    docs = [np.array([10, 11, 12]), np.array([], dtype=np.int64), np.array([13, 14, 15])]
    # stream 10 11 12 S 13 14 15 → pieces of 2: (10 11) (12 S) (13 14), 15 dropped
    assert pack_encoder(docs, 4, cls_id=2, sep_id=3).tolist() == [
        [2, 10, 11, 3],
        [2, 12, 3, 3],
        [2, 13, 14, 3],
    ]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("seq_len", [3, 8, 33])
def test_pack_encoder_reconstructs_the_stream(seed, seq_len):
    docs = random_docs(seed)
    stream = reference_stream(docs, 3, after_each=False)
    rows = pack_encoder(docs, seq_len, cls_id=2, sep_id=3)
    body = seq_len - 2
    assert rows.dtype == np.int64 and rows.shape == (len(stream) // body, seq_len)
    assert (rows[:, 0] == 2).all() and (rows[:, -1] == 3).all()
    assert rows[:, 1:-1].ravel().tolist() == stream[: rows.shape[0] * body]


# --------------------------------------------------------------------------- limit and batches


def test_limit_tokens_takes_whole_rows():
    rows = np.arange(40).reshape(10, 4)
    assert limit_tokens(rows, 12).tolist() == rows[:3].tolist()
    assert limit_tokens(rows, 15).shape == (3, 4)
    assert limit_tokens(rows, 1).shape == (1, 4)  # at least one row
    assert limit_tokens(rows, 1000).shape == (10, 4)


def test_limit_tokens_rejects_empty_rows_and_bad_budgets():
    with pytest.raises(ValueError, match="rows is empty"):
        limit_tokens(np.zeros((0, 4), dtype=np.int64), 10)
    with pytest.raises(ValueError, match="2-D"):
        limit_tokens(np.zeros(4, dtype=np.int64), 10)
    with pytest.raises(ValueError, match="max_tokens"):
        limit_tokens(np.zeros((2, 4), dtype=np.int64), 0)


def test_iter_batches_covers_all_rows_as_int64_copies():
    rows = np.arange(70, dtype=np.int32).reshape(10, 7)
    batches = list(iter_batches(rows, 4))
    assert [tuple(b.shape) for b in batches] == [(4, 7), (4, 7), (2, 7)]
    assert all(b.dtype == torch.int64 for b in batches)
    assert torch.equal(torch.cat(batches), torch.from_numpy(rows).long())
    batches[0][0, 0] = -1
    assert rows[0, 0] == 0


def test_iter_batches_checks_arguments_when_called():
    rows = np.zeros((3, 2), dtype=np.int64)
    with pytest.raises(ValueError, match="batch_size"):
        iter_batches(rows, 0)
    with pytest.raises(ValueError, match="rows is empty"):
        iter_batches(np.zeros((0, 2), dtype=np.int64), 2)


# --------------------------------------------------------------------------- training layout


class _WrappingTokenizer:
    """Stands in for a Hugging Face BERT tokenizer whose post-processor wraps every text in
    [CLS] … [SEP] unless ``add_special_tokens=False``."""

    cls_token_id, sep_token_id, pad_token_id, mask_token_id, unk_token_id = 2, 3, 0, 4, 1

    def __call__(self, texts, add_special_tokens=True):
        ids = [[10 + ord(ch) % 20 for ch in t] for t in texts]
        if add_special_tokens:
            ids = [[self.cls_token_id, *i, self.sep_token_id] for i in ids]
        return {"input_ids": ids}


def test_document_encoder_adds_no_special_tokens_and_packed_rows_have_them_only_at_the_ends():
    tokenizer = _WrappingTokenizer()
    corpus = Corpus("c", tuple(Document(f"d{i}", "abcdefg"[: 3 + i]) for i in range(4)))
    docs = tokenize_corpus(corpus, document_encoder(tokenizer))
    assert all(not np.isin(doc, [2, 3]).any() for doc in docs)
    special = special_tokens_of(tokenizer, "encoder")
    rows = pack_rows(docs, 6, family="encoder", special=special)
    assert (rows[:, 0] == 2).all() and not (rows[:, 1:] == 2).any()  # [CLS] only at position 0
    # inside a row, [SEP] appears exactly where the documents meet
    assert int((rows[:, 1:-1] == 3).sum()) <= len(docs) - 1
    # the old sweep path (the tokenizer's default) left [CLS] in the middle of rows
    wrapped = tokenize_corpus(corpus, lambda t: tokenizer(t)["input_ids"])
    old_rows = pack_encoder(wrapped, 6, cls_id=2, sep_id=3)
    assert (old_rows[:, 1:] == 2).any()


def test_pack_rows_dispatches_on_the_family():
    docs = random_docs(3)
    decoder = SpecialTokens(bos_id=0, eos_id=0, pad_id=1)
    encoder = SpecialTokens(pad_id=0, cls_id=2, sep_id=3, mask_id=4)
    assert np.array_equal(
        pack_rows(docs, 8, family="decoder", special=decoder), pack_causal(docs, 8, eos_id=0)
    )
    assert np.array_equal(
        pack_rows(docs, 8, family="encoder", special=encoder),
        pack_encoder(docs, 8, cls_id=2, sep_id=3),
    )
    with pytest.raises(ValueError, match="family must be one of"):
        pack_rows(docs, 8, family="seq2seq", special=decoder)
    with pytest.raises(ValueError, match="cls_id"):
        pack_rows(docs, 8, family="encoder", special=decoder)
    with pytest.raises(ValueError, match="eos_id"):
        pack_rows(docs, 8, family="decoder", special=encoder)


def test_special_tokens_of_a_tokenizer():
    assert special_tokens_of(_WrappingTokenizer(), "encoder") == SpecialTokens(
        pad_id=0, cls_id=2, sep_id=3, mask_id=4, other_ids=frozenset({1})
    )

    class Decoder:
        bos_token_id = eos_token_id = 0
        pad_token_id = None

    assert special_tokens_of(Decoder(), "decoder") == SpecialTokens(bos_id=0, eos_id=0)
    with pytest.raises(ValueError, match="family"):
        special_tokens_of(Decoder(), "other")
