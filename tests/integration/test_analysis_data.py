"""The sweep's analysis rows are tokenised and packed exactly as the suite was trained, and token
frequencies are counted over the positions a capture keeps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tangentlens.core.data import prepare_analysis_data
from tangentlens.core.recipe import load_recipe
from tangentlens.data import analysis_mask
from tangentlens.models.training import prepare_data


def _recipe(seq_len: int):
    return load_recipe(
        "mini_bert", [f"data.seq_len={seq_len}", "data.max_tokens=100000", "data.n_bins=3"]
    )


@pytest.mark.parametrize("suite_name", ["micro_bert", "micro_pythia"])
def test_analysis_rows_are_the_training_pipelines_heldout_rows(suite_name, request):
    suite = request.getfixturevalue(suite_name)
    data = prepare_analysis_data(suite, _recipe(suite.config.seq_len))
    training = prepare_data(suite.config)  # held-out rows packed by the training code
    n = len(training.eval_rows)
    assert len(data.rows) >= n
    assert np.array_equal(data.rows[:n], training.eval_rows.numpy())
    # no special token the training rows lack: for the encoder [CLS] only opens a row
    train_rows = training.train_rows.numpy()
    special = data.special
    for tok in special.all_ids():
        in_analysis = data.rows == tok
        if not in_analysis.any():
            continue
        assert (train_rows == tok).any(), tok
        columns = set(np.nonzero(in_analysis)[1].tolist())
        if tok == special.cls_id:
            assert columns == {0}


def test_frequencies_count_only_kept_positions(micro_pythia, micro_bert):
    for suite in (micro_pythia, micro_bert):
        data = prepare_analysis_data(suite, _recipe(suite.config.seq_len))
        causal = suite.family == "decoder"
        keep = analysis_mask(torch.from_numpy(data.rows), data.special, causal=causal).keep
        assert data.frequencies.total == int(keep.sum())
        for tok in data.special.all_ids():
            assert data.frequencies.counts[tok] == 0, (suite.name, tok)
        expected = np.bincount(data.rows[keep.numpy()], minlength=data.frequencies.vocab_size)
        assert np.array_equal(data.frequencies.counts, expected)
        if causal:  # position 0 and EOS are not counted (the old table counted both)
            eos = data.special.eos_id
            assert (data.rows == eos).any()
            assert data.frequencies.total < data.rows.size - len(data.rows)


def test_saved_analysis_data_reads_back_identically(micro_bert, tmp_path):
    """What the sweep's data unit writes is what every other unit reads: same rows, counts,
    bins and special tokens; the file's hash is stable."""
    from tangentlens.core.data import data_sha256, load_analysis_data, save_analysis_data

    data = prepare_analysis_data(micro_bert, _recipe(micro_bert.config.seq_len))
    save_analysis_data(data, tmp_path / "a.npz")
    back = load_analysis_data(tmp_path / "a.npz", n_bins=3)
    assert np.array_equal(back.rows, data.rows) and back.rows.dtype == data.rows.dtype
    assert np.array_equal(back.frequencies.counts, data.frequencies.counts)
    assert np.array_equal(back.bins.bin_of_type, data.bins.bin_of_type)
    assert back.special == data.special and back.special.mask_id is not None
    assert back.loss == data.loss == "mlm"
    save_analysis_data(data, tmp_path / "b.npz")
    assert data_sha256(tmp_path / "a.npz") == data_sha256(tmp_path / "b.npz")


def test_a_named_corpus_is_read_instead_of_the_suites_held_out_split(micro_pythia, tmp_path):
    from tangentlens.core.data import pack_texts
    from tangentlens.data import load_corpus, special_tokens_of

    text = tmp_path / "own.txt"
    text.write_text("To be, or not to be, that is the question. " * 40)
    recipe = load_recipe(
        "quickstart", [f"data.corpus='{text}'", "data.seq_len=32", "data.n_bins=2"]
    )
    data = prepare_analysis_data(micro_pythia, recipe)
    tokenizer = micro_pythia.tokenizer()
    special = special_tokens_of(tokenizer, "decoder")
    expected = pack_texts(
        load_corpus(str(text)), tokenizer, "decoder", special, 32, recipe.data.max_tokens
    )
    assert np.array_equal(data.rows, expected)
    held_out = prepare_analysis_data(micro_pythia, load_recipe("quickstart", ["data.seq_len=32"]))
    assert not np.array_equal(held_out.rows[: len(expected)], expected)
