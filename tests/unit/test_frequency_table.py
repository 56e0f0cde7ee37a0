"""FrequencyTable.from_rows: token frequencies over exactly the positions a capture keeps."""

import numpy as np
import pytest
import torch

from tangentlens.data import FrequencyTable, MaskPolicy, SpecialTokens

PYTHIA = SpecialTokens(bos_id=0, eos_id=0, pad_id=1)
BERT = SpecialTokens(pad_id=0, cls_id=2, sep_id=3, mask_id=4, other_ids=frozenset({1}))


def _loop_counts(rows, vocab, special, causal):
    """Brute force: skip special ids, and for causal rows position 0 and the last position."""
    counts = np.zeros(vocab, dtype=np.int64)
    for row in rows.tolist():
        for pos, tok in enumerate(row):
            if tok in special.all_ids():
                continue
            if causal and pos in (0, len(row) - 1):
                continue
            counts[tok] += 1
    return counts


@pytest.mark.parametrize("special, causal", [(PYTHIA, True), (BERT, False)])
def test_from_rows_counts_only_kept_positions(special, causal):
    rows = np.random.default_rng(0).integers(0, 12, size=(9, 7))
    table = FrequencyTable.from_rows(rows, 12, special, causal=causal)
    assert table.counts.tolist() == _loop_counts(rows, 12, special, causal).tolist()
    for tok in special.all_ids():
        assert table.counts[tok] == 0
    # torch rows give the same table
    assert np.array_equal(
        FrequencyTable.from_rows(torch.from_numpy(rows), 12, special, causal=causal).counts,
        table.counts,
    )


def test_decoder_rows_hand_built():
    # EOS (0) separates documents; position 0 and the last position carry no geometry
    rows = np.array([[5, 6, 0, 7, 8], [9, 0, 5, 5, 6]])
    table = FrequencyTable.from_rows(rows, 10, PYTHIA, causal=True)
    expected = {6: 1, 7: 1, 5: 2}
    assert {i: int(c) for i, c in enumerate(table.counts) if c} == expected
    assert table.total == 4
    # counting every position (what the sweep did before) includes EOS and positions 0 / last
    assert FrequencyTable.from_tokens(rows, 10).counts[0] == 2


def test_policy_switches_reasons_off():
    rows = np.array([[2, 5, 6, 3]])
    everything = MaskPolicy(False, False, False, False)
    table = FrequencyTable.from_rows(rows, 8, BERT, causal=False, policy=everything)
    assert table.total == 4
