"""Issue 11, item 14: the loss reduction must not reweight tokens across batches. A per-batch
mean (``L / n_scored`` of each batch) scaled every gradient of a batch by 1 / (its own number of
scored tokens), so tokens of a small last batch or of sparsely scored MLM batches weighed more
in every pooled ratio; it is gone — only the summed loss is offered."""

from __future__ import annotations

import pytest

from tangentlens.capture import REDUCTIONS, CaptureConfig
from tangentlens.core.recipe import CaptureSpec


def test_only_the_summed_loss_is_offered():
    assert REDUCTIONS == ("sum",)
    assert CaptureConfig(sites=("hook_embed",)).reduction == "sum"
    with pytest.raises(ValueError, match=r"reduction must be one of.*reweight tokens"):
        CaptureConfig(sites=("hook_embed",), reduction="mean")
    assert CaptureSpec().reduction == "sum"
    with pytest.raises(ValueError, match=r"capture.reduction must be .sum.*reweighted tokens"):
        CaptureSpec(reduction="mean")
