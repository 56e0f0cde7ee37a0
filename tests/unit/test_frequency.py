import collections
import itertools
import math

import numpy as np
import pytest
import torch

from tangentlens.data.frequency import FrequencyBins, FrequencyTable


def zipf_tokens(seed: int, n: int = 20_000, vocab: int = 600, s: float = 1.05) -> np.ndarray:
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, vocab + 1) ** s
    return rng.choice(vocab, size=n, p=p / p.sum())[rng.permutation(n)]


# --------------------------------------------------------------------------- FrequencyTable


def test_from_tokens_counts_kept_positions_like_a_python_loop():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 30, size=(7, 11))
    keep = rng.random((7, 11)) < 0.6
    ref = collections.Counter(int(tokens[i, j]) for i in range(7) for j in range(11) if keep[i, j])
    for toks, kp in ((tokens, keep), (torch.from_numpy(tokens), torch.from_numpy(keep))):
        table = FrequencyTable.from_tokens(toks, 32, keep=kp)
        assert table.counts.dtype == np.int64 and table.counts.shape == (32,)
        assert table.counts.tolist() == [ref.get(i, 0) for i in range(32)]
        assert table.total == int(keep.sum()) and table.vocab_size == 32
    full = FrequencyTable.from_tokens(tokens, 30)
    assert full.total == tokens.size


@pytest.mark.parametrize("bad", [-1, 10, 99])
def test_from_tokens_names_the_offending_id_and_the_vocabulary(bad):
    with pytest.raises(ValueError, match=rf"token id {bad} .*vocab_size=10"):
        FrequencyTable.from_tokens(np.array([[1, bad, 2]]), 10)


def test_from_tokens_rejects_bad_masks_and_dtypes():
    tokens = np.array([[1, 2], [3, 4]])
    with pytest.raises(ValueError, match="boolean array"):
        FrequencyTable.from_tokens(tokens, 5, keep=np.ones((2, 3), dtype=bool))
    with pytest.raises(ValueError, match="boolean array"):
        FrequencyTable.from_tokens(tokens, 5, keep=np.ones((2, 2)))
    with pytest.raises(ValueError, match="integer token ids"):
        FrequencyTable.from_tokens(tokens.astype(float), 5)
    with pytest.raises(ValueError, match="vocab_size"):
        FrequencyTable.from_tokens(tokens, 0)


def test_log_frequency_and_entropy_on_known_distributions():
    table = FrequencyTable(np.array([2, 0, 1, 1]))
    lf = table.log_frequency()
    assert lf[1] == -np.inf
    assert np.allclose(lf[[0, 2, 3]], [math.log(0.5), math.log(0.25), math.log(0.25)])
    assert table.unigram_entropy() == pytest.approx(1.5 * math.log(2))
    uniform = FrequencyTable.from_tokens(np.arange(8).repeat(3), 8)
    assert uniform.unigram_entropy() == pytest.approx(math.log(8))
    assert FrequencyTable(np.array([5, 0])).unigram_entropy() == 0.0


def test_entropy_matches_a_loop_on_zipf_data():
    table = FrequencyTable.from_tokens(zipf_tokens(1), 600)
    total = sum(table.counts.tolist())
    ref = -sum(c / total * math.log(c / total) for c in table.counts.tolist() if c)
    assert table.unigram_entropy() == pytest.approx(ref, rel=1e-12)


def test_empty_table_errors():
    empty = FrequencyTable(np.zeros(4, dtype=np.int64))
    for call in (empty.log_frequency, empty.unigram_entropy, empty.bins):
        with pytest.raises(ValueError, match="no token was counted"):
            call()
    with pytest.raises(ValueError, match="non-negative"):
        FrequencyTable(np.array([1, -1]))
    with pytest.raises(ValueError, match="1-D integer"):
        FrequencyTable(np.array([[1, 2]]))


def test_merge_equals_counting_the_concatenation():
    a, b = zipf_tokens(2, n=500), zipf_tokens(3, n=700)
    merged = FrequencyTable.from_tokens(a, 600).merge(FrequencyTable.from_tokens(b, 600))
    assert np.array_equal(
        merged.counts, FrequencyTable.from_tokens(np.concatenate([a, b]), 600).counts
    )
    with pytest.raises(ValueError, match="same vocab_size=600"):
        merged.merge(FrequencyTable(np.ones(3, dtype=np.int64)))


# --------------------------------------------------------------------------- bins: references


def reference_bins(counts: np.ndarray, n_bins: int) -> np.ndarray:
    """Brute force: list the occurrences sorted by log-frequency, cut the list at the mass
    quantiles, give each tie group (types of equal count) the bin holding most of its mass
    (ties: the upper bin). Integer arithmetic in units of 1 / n_bins occurrence."""
    seen = [t for t in range(len(counts)) if counts[t] > 0]
    order = sorted(seen, key=lambda t: (counts[t], t))
    total = int(sum(counts[t] for t in seen))
    position, start = {}, 0  # scaled start of each type's occurrences in the sorted list
    for t in order:
        position[t] = start
        start += int(counts[t]) * n_bins
    out = np.full(len(counts), -1, dtype=np.int64)
    for value in sorted({int(counts[t]) for t in seen}):
        members = [t for t in seen if counts[t] == value]
        lo = min(position[t] for t in members)
        hi = lo + value * len(members) * n_bins
        overlap = [max(0, min(hi, (j + 1) * total) - max(lo, j * total)) for j in range(n_bins)]
        best = max(range(n_bins), key=lambda j: (overlap[j], j))
        for t in members:
            out[t] = best
    return out


def exhaustive_cut_cost(counts: np.ndarray, n_bins: int) -> tuple[float, list[tuple[int, ...]]]:
    """Min over every strictly increasing choice of group boundaries of Σ (F_cut/T − j/n)²."""
    values = sorted({int(c) for c in counts if c > 0})
    mass = [v * int((counts == v).sum()) for v in values]
    total = sum(mass)
    upper = list(itertools.accumulate(mass))[:-1]
    scored = []
    for cuts in itertools.combinations(range(len(upper)), n_bins - 1):
        cost = sum((upper[c] / total - (j + 1) / n_bins) ** 2 for j, c in enumerate(cuts))
        scored.append((cost, cuts))
    best = min(cost for cost, _ in scored)
    return best, [cuts for cost, cuts in scored if cost <= best + 1e-12]


def bins_from_cuts(counts: np.ndarray, cuts: tuple[int, ...]) -> np.ndarray:
    values = sorted({int(c) for c in counts if c > 0})
    group_bin = {v: sum(1 for c in cuts if c < g) for g, v in enumerate(values)}
    return np.array([group_bin.get(int(c), -1) for c in counts])


# --------------------------------------------------------------------------- bins: tests


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("n_bins, vocab, s", [(3, 600, 1.05), (5, 600, 1.05), (8, 2000, 0.9)])
def test_bins_match_the_brute_force_reference_on_zipf_data(seed, n_bins, vocab, s):
    table = FrequencyTable.from_tokens(zipf_tokens(seed, vocab=vocab, s=s), vocab)
    values, types = np.unique(table.counts[table.counts > 0], return_counts=True)
    assert (values * types).max() < table.total / n_bins  # no heavy group: the main rule applies
    bins = table.bins(n_bins)
    assert np.array_equal(bins.bin_of_type, reference_bins(table.counts, n_bins))
    # equal mass up to the largest count group; ties share a bin; rare → frequent
    assert np.abs(bins.token_counts - table.total / n_bins).max() <= (values * types).max()
    assert bins.token_counts.sum() == table.total
    seen = table.counts > 0
    assert (bins.bin_of_type[~seen] == -1).all()
    for v in values:
        assert len(set(bins.bin_of_type[table.counts == v].tolist())) == 1
    order = np.argsort(table.counts[seen], kind="stable")
    assert (np.diff(bins.bin_of_type[seen][order]) >= 0).all()


def test_bins_fields_match_brute_force_counts_and_edges():
    table = FrequencyTable.from_tokens(zipf_tokens(7), 600)
    bins = table.bins(5)
    lf = table.log_frequency()
    for j in range(5):
        in_bin = bins.bin_of_type == j
        assert bins.type_counts[j] == in_bin.sum() > 0
        assert bins.token_counts[j] == table.counts[in_bin].sum()
        assert bins.edges[j] == lf[in_bin].min()
        assert (lf[in_bin] < bins.edges[j + 1]).all() or j == 4
    assert bins.edges[-1] == lf.max()
    assert isinstance(bins, FrequencyBins)
    assert bins.n_bins == 5 and bins.edges.shape == (6,) and bins.bin_of_type.dtype == np.int64


def test_bins_hand_built_case():
    # counts 1,1 | 2 | 3,3 | 4 | 6 | 8 | 12  (T = 40, quantiles 10, 20, 30)
    # group middles 1, 3, 7, 12, 17, 24, 34 → bins 0, 0, 0, 1, 1, 2, 3
    counts = np.array([0, 1, 1, 2, 3, 3, 4, 6, 8, 12])
    bins = FrequencyTable(counts).bins(4)
    assert bins.bin_of_type.tolist() == [-1, 0, 0, 0, 0, 0, 1, 1, 2, 3]
    assert bins.type_counts.tolist() == [5, 2, 1, 1]
    assert bins.token_counts.tolist() == [10, 10, 8, 12]
    assert np.allclose(bins.edges, np.log(np.array([1, 4, 8, 12, 12]) / 40))


def test_bins_group_whose_middle_falls_on_a_quantile_goes_up():
    # counts 1×8 | 4 | 5 | 6 | 7 | 10 (T = 40): the 6-group spans [17, 23), middle 20 = quantile
    counts = np.array([1] * 8 + [4, 5, 6, 7, 10])
    bins = FrequencyTable(counts).bins(4)
    assert bins.bin_of_type.tolist() == [0] * 8 + [1, 1, 2, 2, 3]
    assert bins.token_counts.tolist() == [8, 9, 13, 10]


def test_a_dominant_type_gets_a_bin_of_its_own():
    # the type with count 50 holds 5/6 of the mass; least-squares cuts after the 2-, 3-, 4-groups
    counts = np.array([1, 2, 3, 4, 50])
    bins = FrequencyTable(counts).bins(4)
    assert bins.bin_of_type.tolist() == [0, 0, 1, 2, 3]
    assert bins.token_counts.tolist() == [3, 3, 4, 50]
    _, optimal = exhaustive_cut_cost(counts, 4)
    assert optimal == [(1, 2, 3)]


def test_a_heavy_middle_group_uses_squared_not_absolute_distances():
    # masses 4 | 9 | 4 | 55 | 7 | 11 (T = 90, quantiles 22.5, 45, 67.5); boundaries 4 13 17 72 79.
    # squared: cuts at 17, 72, 79 cost 30.25 + 729 + 132.25 = 891.5 < 894.5 for 13, 17, 72
    # (absolute distances would prefer 13, 17, 72: 9.5 + 28 + 4.5 = 42 < 43).
    counts = np.array([2, 2, 3, 3, 3, 4, *[5] * 11, 7, 11])
    bins = FrequencyTable(counts).bins(4)
    assert bins.token_counts.tolist() == [17, 55, 7, 11]
    assert exhaustive_cut_cost(counts, 4)[1] == [(2, 3, 4)]


@pytest.mark.parametrize("seed", range(20))
def test_heavy_groups_fall_back_to_the_exhaustive_least_squares_cuts(seed):
    rng = np.random.default_rng(seed)
    n_bins = 4 + seed % 2
    counts = rng.integers(1, 15, size=rng.integers(12, 20))
    counts[rng.integers(len(counts))] = rng.integers(40, 200)  # a dominant type
    if seed % 3 == 0:
        counts = np.concatenate([counts, np.ones(rng.integers(30, 80), dtype=np.int64)])  # hapaxes
    if seed % 3 == 1:  # a large tie group in the middle
        counts = np.concatenate([counts, np.full(rng.integers(20, 60), rng.integers(3, 12))])
    bins = FrequencyTable(counts).bins(n_bins)
    _, optimal = exhaustive_cut_cost(counts, n_bins)
    assert any(np.array_equal(bins.bin_of_type, bins_from_cuts(counts, c)) for c in optimal)
    assert (bins.type_counts > 0).all()
    top = int(np.argmax(counts))
    assert bins.bin_of_type[top] == n_bins - 1


def test_too_few_distinct_frequencies_raise():
    with pytest.raises(ValueError, match="only 3 distinct frequencies"):
        FrequencyTable(np.array([1, 1, 2, 5, 0])).bins(4)
    with pytest.raises(ValueError, match="n_bins must be a positive integer"):
        FrequencyTable(np.array([1, 2])).bins(0)
    assert FrequencyTable(np.array([1, 1, 2, 5, 0])).bins(1).bin_of_type.tolist() == [
        0,
        0,
        0,
        0,
        -1,
    ]


def test_assign_maps_tokens_to_bins_for_numpy_and_torch():
    counts = np.array([0, 1, 1, 2, 3, 3, 4, 6, 8, 12])
    bins = FrequencyTable(counts).bins(4)
    tokens = np.array([[9, 0, 1], [6, 8, 3]])
    expected = [[3, -1, 0], [1, 2, 0]]
    out = bins.assign(tokens)
    assert isinstance(out, np.ndarray) and out.dtype == np.int64 and out.tolist() == expected
    out_t = bins.assign(torch.from_numpy(tokens).int())
    assert isinstance(out_t, torch.Tensor) and out_t.dtype == torch.int64
    assert out_t.tolist() == expected
    with pytest.raises(ValueError, match=r"token id 10 .*vocab_size=10"):
        bins.assign(np.array([10]))
    with pytest.raises(ValueError, match=r"token id -2 .*vocab_size=10"):
        bins.assign(torch.tensor([[3, -2]]))
    with pytest.raises(ValueError, match="integer token ids"):
        bins.assign(torch.tensor([1.0]))
