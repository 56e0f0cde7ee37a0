import pytest
from tokenizers import Tokenizer

from tangentlens.data import shakespeare
from tangentlens.data.tokenizer import (
    DECODER_SPECIAL_TOKENS,
    ENCODER_SPECIAL_TOKENS,
    batch_encoder,
    decoder_special_ids,
    encoder_special_ids,
    train_bpe_tokenizer,
)


def _gpt2_symbol_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode`` (printable bytes map to themselves)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


SYMBOL_TO_BYTE = _gpt2_symbol_to_byte()


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return shakespeare().texts()[:40]  # ~250 k characters: trains in a fraction of a second


@pytest.fixture(scope="module")
def tok(texts) -> Tokenizer:
    return train_bpe_tokenizer(texts, 600, DECODER_SPECIAL_TOKENS)


def test_special_token_layouts():
    assert DECODER_SPECIAL_TOKENS == ("<|endoftext|>", "<|padding|>")
    assert ENCODER_SPECIAL_TOKENS == ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


@pytest.mark.parametrize("specials", [DECODER_SPECIAL_TOKENS, ENCODER_SPECIAL_TOKENS])
def test_special_tokens_come_first_then_the_byte_alphabet(texts, specials):
    tok = train_bpe_tokenizer(texts[:5], 300, specials)
    assert [tok.token_to_id(t) for t in specials] == list(range(len(specials)))
    vocab = tok.get_vocab()
    n = len(specials)
    # ids n … n+255 are the 256 single byte symbols
    singles = {token for token, i in vocab.items() if n <= i < n + 256}
    assert len(singles) == 256 and all(len(t) == 1 for t in singles)
    assert tok.get_vocab_size() == 300


def test_special_id_helpers_match_the_trained_tokenizers(texts):
    dec = train_bpe_tokenizer(texts[:3], 270, DECODER_SPECIAL_TOKENS)
    ids = decoder_special_ids()
    assert ids.bos_id == ids.eos_id == dec.token_to_id("<|endoftext|>") == 0
    assert ids.pad_id == dec.token_to_id("<|padding|>") == 1
    enc = train_bpe_tokenizer(texts[:3], 270, ENCODER_SPECIAL_TOKENS)
    ids = encoder_special_ids()
    assert (ids.pad_id, ids.cls_id, ids.sep_id, ids.mask_id) == tuple(
        enc.token_to_id(t) for t in ("[PAD]", "[CLS]", "[SEP]", "[MASK]")
    )
    assert ids.other_ids == {enc.token_to_id("[UNK]")}
    assert ids.all_ids() == set(range(5))


def test_training_is_deterministic(texts, tok):
    again = train_bpe_tokenizer(texts, 600, DECODER_SPECIAL_TOKENS)
    assert again.get_vocab() == tok.get_vocab()
    assert again.to_str() == tok.to_str()
    sample = texts[7][:2000]
    assert again.encode(sample).ids == tok.encode(sample).ids


def test_first_merge_is_the_most_frequent_pair():
    # pre-tokens: "ab" once and "Ġab" 3× per text → (a, b) occurs 4×, (Ġ, a) 3×
    tok = train_bpe_tokenizer(["ab ab ab ab"] * 10, 256 + 2 + 1, DECODER_SPECIAL_TOKENS)
    assert tok.get_vocab_size() == 259
    assert tok.id_to_token(258) == "ab"
    assert tok.encode("ab ab").tokens == ["ab", "Ġ", "ab"]


def test_byte_level_round_trip_without_prefix_space_or_unknowns(tok):
    text = "To be, or not to be:\n  naïve café — 東京 🙂?"
    enc = tok.encode(text, add_special_tokens=False)
    assert tok.decode(enc.ids) == text
    assert len(enc.ids) < len(text.encode("utf-8"))  # merges compress
    assert tok.encode("To").tokens[0] == "To"  # no prefix space added
    # independent reference: GPT-2's byte ↔ symbol table maps the tokens back to the UTF-8 bytes
    assert b"".join(bytes(SYMBOL_TO_BYTE[c] for c in t) for t in enc.tokens) == text.encode()


def test_batch_encoder_matches_single_encodings(tok, texts):
    encode = batch_encoder(tok)
    batch = [texts[0][:300], "", texts[1][:50]]
    assert encode(batch) == [tok.encode(t, add_special_tokens=False).ids for t in batch]
    assert encode(batch)[1] == []


@pytest.mark.parametrize("vocab_size", [258, 100, 258.5])
def test_vocab_size_must_exceed_bytes_plus_specials(vocab_size):
    with pytest.raises(ValueError, match="above 256 bytes \\+ 2 special tokens = 258"):
        train_bpe_tokenizer(["abc"], vocab_size, DECODER_SPECIAL_TOKENS)


def test_bad_special_tokens_and_empty_texts_are_rejected():
    with pytest.raises(ValueError, match="not one string"):
        train_bpe_tokenizer(["abc"], 300, "<s>")
    with pytest.raises(ValueError, match="distinct"):
        train_bpe_tokenizer(["abc"], 300, ["<s>", "<s>"])
    with pytest.raises(ValueError, match="no text"):
        train_bpe_tokenizer([], 300, DECODER_SPECIAL_TOKENS)
    with pytest.raises(ValueError, match="no text"):
        train_bpe_tokenizer(iter(["", ""]), 300, DECODER_SPECIAL_TOKENS)
    with pytest.raises(ValueError, match="must be strings"):
        train_bpe_tokenizer([b"bytes"], 300, DECODER_SPECIAL_TOKENS)
