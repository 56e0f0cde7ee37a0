import itertools

import pytest
import torch

from tangentlens.data.masks import (
    ANALYSIS_EXCLUSION_REASONS,
    EXCLUSION_REASONS,
    MaskPolicy,
    MaskResult,
    analysis_mask,
    token_mask,
)
from tangentlens.data.packing import SpecialTokens

PYTHIA = SpecialTokens(bos_id=0, eos_id=0, pad_id=1)
BERT = SpecialTokens(pad_id=0, cls_id=2, sep_id=3, mask_id=4, other_ids=frozenset({1}))


def reference_mask(tokens, special, causal, policy):
    """Brute force: one Python loop over positions."""
    bos_ids = {special.bos_id, special.cls_id} - {None}
    special_ids = ({special.eos_id, special.sep_id, special.mask_id} - {None}) | special.other_ids
    counts = dict.fromkeys(EXCLUSION_REASONS, 0)
    keep = []
    for row in tokens.tolist():
        keep_row = []
        for pos, tok in enumerate(row):
            reasons = {
                "bos": policy.bos and tok in bos_ids,
                "position0": policy.position0 and causal and pos == 0,
                "padding": policy.padding and tok == special.pad_id,
                "special": policy.special and tok in special_ids,
            }
            for reason, hit in reasons.items():
                counts[reason] += hit
            keep_row.append(not any(reasons.values()))
        keep.append(keep_row)
    counts["total"] = sum(not k for row in keep for k in row)
    return keep, counts


POLICIES = [MaskPolicy(*flags) for flags in itertools.product([True, False], repeat=4)]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("special, causal", [(PYTHIA, True), (BERT, False), (BERT, True)])
def test_token_mask_matches_a_python_loop(policy, special, causal):
    gen = torch.Generator().manual_seed(POLICIES.index(policy) + 16 * causal)
    tokens = torch.randint(0, 8, (6, 9), generator=gen)
    result = token_mask(tokens, special, causal=causal, policy=policy)
    keep, counts = reference_mask(tokens, special, causal, policy)
    assert isinstance(result, MaskResult)
    assert result.keep.dtype == torch.bool and result.keep.shape == tokens.shape
    assert result.keep.tolist() == keep
    assert result.excluded == counts
    assert result.n_kept == tokens.numel() - counts["total"]


def test_pythia_batch_hand_built():
    tokens = torch.tensor([[0, 5, 6, 0, 7], [0, 8, 9, 1, 1]])
    r = token_mask(tokens, PYTHIA, causal=True)
    assert r.keep.tolist() == [
        [False, True, True, False, True],
        [False, True, True, False, False],
    ]
    # id 0 is both BOS and EOS: each reason is counted on its own
    assert r.excluded == {"bos": 3, "position0": 2, "padding": 2, "special": 3, "total": 5}
    assert r.n_kept == 5


def test_encoder_batch_hand_built():
    tokens = torch.tensor([[2, 7, 4, 3, 0], [2, 1, 8, 9, 3]])
    r = token_mask(tokens, BERT, causal=False)
    assert r.keep.tolist() == [
        [False, True, False, False, False],
        [False, False, True, True, False],
    ]
    assert r.excluded == {"bos": 2, "position0": 0, "padding": 1, "special": 4, "total": 7}


def test_switching_everything_off_keeps_everything():
    tokens = torch.tensor([[0, 1, 2]])
    r = token_mask(tokens, PYTHIA, causal=True, policy=MaskPolicy(False, False, False, False))
    assert r.keep.all() and r.excluded["total"] == 0


@pytest.mark.parametrize(
    "tokens, match",
    [
        (torch.zeros(3, dtype=torch.long), "2-D"),
        ([[0, 1]], "2-D"),
        (torch.zeros(2, 3), "integer ids"),
        (torch.zeros(2, 3, dtype=torch.bool), "integer ids"),
    ],
)
def test_token_mask_rejects_bad_tokens(tokens, match):
    with pytest.raises(ValueError, match=match):
        token_mask(tokens, PYTHIA, causal=True)


def test_token_mask_rejects_bad_special_tokens():
    with pytest.raises(ValueError, match="SpecialTokens"):
        token_mask(torch.zeros(2, 3, dtype=torch.long), {"bos_id": 0}, causal=True)


# --------------------------------------------------------------------------- analysis_mask


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("special, causal", [(PYTHIA, True), (BERT, False)])
def test_analysis_mask_is_token_mask_plus_no_target_for_causal_models(policy, special, causal):
    gen = torch.Generator().manual_seed(POLICIES.index(policy))
    tokens = torch.randint(0, 8, (5, 7), generator=gen)
    keep, counts = reference_mask(tokens, special, causal, policy)
    no_target = 0
    if causal:  # the last column predicts nothing: excluded unless already excluded
        for row in keep:
            no_target += row[-1]
            row[-1] = False
    counts["no_target"] = no_target
    counts["total"] += no_target
    result = analysis_mask(tokens, special, causal=causal, policy=policy)
    assert result.keep.tolist() == keep
    assert result.excluded == counts
    assert set(result.excluded) == {*ANALYSIS_EXCLUSION_REASONS, "total"}


def test_analysis_mask_hand_built_decoder_row():
    tokens = torch.tensor([[0, 5, 6, 0, 7, 8]])
    r = analysis_mask(tokens, PYTHIA, causal=True)
    # position 0 (BOS), the EOS at position 3 and the last position (no target) are excluded
    assert r.keep.tolist() == [[False, True, True, False, True, False]]
    assert r.excluded["no_target"] == 1 and r.excluded["total"] == 3
