"""The default mini suite really learns: trained once into the user cache (the same artifact
`make run` uses; ~4 min on 2 CPU cores the first time, then read from the cache)."""

import pytest

from tangentlens.models.suites import ensure_mini_suite


@pytest.mark.slow
def test_default_decoder_ends_far_below_the_unigram_entropy():
    suite = ensure_mini_suite("mini-pythia")
    losses = suite.validation_loss()
    entropy = suite.metadata["unigram_entropy"]
    first, last = suite.steps[0], suite.steps[-1]
    assert 6.0 < entropy < 6.5  # the shipped corpus with the 4096-token BPE
    assert losses[first] > entropy  # untrained: close to uniform over the vocabulary
    assert losses[last] < entropy - 1.5  # measured: 4.31 against 6.25 nats
    assert sorted(losses) == list(suite.steps)
