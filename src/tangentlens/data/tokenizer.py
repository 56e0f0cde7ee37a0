"""Byte-level BPE tokenizers trained on a corpus (``tokenizers`` only, no transformers).

Two special-token layouts, placed first in the vocabulary:

* decoders (Pythia style): ``<|endoftext|>`` = BOS = EOS, id 0; ``<|padding|>``, id 1;
* encoders (BERT style): ``[PAD] [UNK] [CLS] [SEP] [MASK]``, ids 0 … 4.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tangentlens.data.packing import BatchEncoder, SpecialTokens

logger = logging.getLogger(__name__)

__all__ = [
    "DECODER_SPECIAL_TOKENS",
    "ENCODER_SPECIAL_TOKENS",
    "batch_encoder",
    "decoder_special_ids",
    "encoder_special_ids",
    "train_bpe_tokenizer",
]

#: Special tokens of a decoder's vocabulary (Pythia's: end of text, padding), ids 0 and 1.
DECODER_SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|padding|>")
#: Special tokens of an encoder's vocabulary (BERT's), ids 0 … 4 in this order.
ENCODER_SPECIAL_TOKENS: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

#: Size of the byte-level alphabet every vocabulary contains.
BYTE_ALPHABET_SIZE = 256


def train_bpe_tokenizer(
    texts: Iterable[str], vocab_size: int, special_tokens: Sequence[str]
) -> Tokenizer:
    """Train a byte-level BPE tokenizer on ``texts``.

    ByteLevel pre-tokenizer (no prefix space, GPT-2 split regex) and decoder; the special tokens
    get ids ``0 … len(special_tokens) − 1`` in the given order, then the 256 byte symbols, then
    the merges. Deterministic: the same texts give the same vocabulary and encodings. The
    vocabulary is smaller than ``vocab_size`` when the texts run out of pairs to merge.
    No post-processor is set: encodings carry no special tokens.
    """
    if isinstance(special_tokens, str):
        raise ValueError("special_tokens must be a sequence of strings, not one string")
    specials = list(special_tokens)
    distinct = len(set(specials)) == len(specials)
    if any(not isinstance(t, str) or not t for t in specials) or not distinct:
        raise ValueError(f"special_tokens must be distinct non-empty strings, got {specials}")
    minimum = BYTE_ALPHABET_SIZE + len(specials)
    if not isinstance(vocab_size, int) or vocab_size <= minimum:
        raise ValueError(
            f"vocab_size must be an integer above 256 bytes + {len(specials)} special tokens "
            f"= {minimum}, got {vocab_size}"
        )
    n_chars = 0

    def counted(items: Iterable[str]) -> Iterator[str]:
        nonlocal n_chars
        for text in items:
            if not isinstance(text, str):
                raise ValueError(f"texts must be strings, got {type(text).__name__}")
            n_chars += len(text)
            yield text

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(counted(texts), trainer=trainer)
    if n_chars == 0:
        raise ValueError(
            "cannot train a tokenizer on no text: texts is empty or holds only empty strings"
        )
    for expected, token in enumerate(specials):
        if tokenizer.token_to_id(token) != expected:
            raise RuntimeError(f"special token {token!r} did not get id {expected}")
    size = tokenizer.get_vocab_size()
    if size < vocab_size:
        logger.info("BPE vocabulary has %d entries (asked for %d): no pairs left", size, vocab_size)
    return tokenizer


def batch_encoder(tokenizer: Tokenizer) -> BatchEncoder:
    """A :class:`~tangentlens.data.packing.BatchEncoder` over a ``tokenizers.Tokenizer``:
    token ids of each text, with no special tokens added."""

    def encode(texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    return encode


def decoder_special_ids() -> SpecialTokens:
    """Special ids of a tokenizer trained with :data:`DECODER_SPECIAL_TOKENS`."""
    return SpecialTokens(bos_id=0, eos_id=0, pad_id=1)


def encoder_special_ids() -> SpecialTokens:
    """Special ids of a tokenizer trained with :data:`ENCODER_SPECIAL_TOKENS` (UNK → other)."""
    return SpecialTokens(pad_id=0, cls_id=2, sep_id=3, mask_id=4, other_ids=frozenset({1}))
