"""The sweep's analysis rows are tokenised and packed exactly as the suite was trained, and token
frequencies are counted over the positions a capture keeps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tangentlens.data import analysis_mask
from tangentlens.models.training import prepare_data
from tangentlens.sweep.recipe import load_recipe
from tangentlens.sweep.runner import _prepare_data


def _recipe(seq_len: int):
    return load_recipe(
        "mini_bert", [f"data.seq_len={seq_len}", "data.max_tokens=100000", "data.n_bins=3"]
    )


@pytest.mark.parametrize("suite_name", ["micro_bert", "micro_pythia"])
def test_analysis_rows_are_the_training_pipelines_heldout_rows(suite_name, request):
    suite = request.getfixturevalue(suite_name)
    data = _prepare_data(suite, _recipe(suite.config.seq_len))
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
        data = _prepare_data(suite, _recipe(suite.config.seq_len))
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
