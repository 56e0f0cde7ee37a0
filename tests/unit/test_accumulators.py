"""Streaming accumulators and the row reservoir against brute force on the whole stream."""

import dataclasses

import numpy as np
import pytest
import torch

from tangentlens.capture import (
    MomentAccumulator,
    RowReservoir,
    SiteStatistics,
    StatisticsConfig,
    TypeSums,
    row_priorities,
)
from tangentlens.metrics import (
    centred_anisotropy,
    centred_anisotropy_from_moments,
    drift_regression,
)
from tests.numerics import assert_reordered_sums


def _stream(seed=0, n=600, d=12):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=torch.float32) + 3.0
    x[5] = 0.0  # a zero row has no direction
    return x


def _magnitudes(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """``Σ|terms|`` of each of a MomentAccumulator's sums over the rows of ``x``."""
    h = x.double()
    norms = torch.linalg.vector_norm(h, dim=1)
    unit = h.abs() / torch.where(norms > 0, norms, 1.0)[:, None]
    return {
        "sum": h.abs().sum(0),
        "sum_unit": unit.sum(0),
        "sum_norms": norms.sum(),
        "sum_sq_norms": norms.pow(2).sum(),
        "second_moment": h.abs().T @ h.abs(),
    }


def _terms(x: torch.Tensor) -> tuple[int, str]:
    """Roundings per sum: the n rows' terms, each carrying at most d + 3 of its own (a norm
    over d entries, its square root, a reciprocal and a product; the float32 rows' products
    are exact in float64)."""
    n, d = x.shape
    return n + d + 3, "moments"


def test_moments_match_numpy():
    x = _stream()
    acc = MomentAccumulator(12)
    for chunk in x.split(97):
        acc.update(chunk)
    ref = x.double().numpy()
    norms = np.linalg.norm(ref, axis=1)
    nz = norms > 0
    assert acc.count == 600 and acc.n_nonzero == 599
    np.testing.assert_allclose(acc.sum.numpy(), ref.sum(0), rtol=1e-12)
    np.testing.assert_allclose(acc.second_moment.numpy(), ref.T @ ref, rtol=1e-12)
    np.testing.assert_allclose(float(acc.sum_norms), norms.sum(), rtol=1e-12)
    np.testing.assert_allclose(float(acc.sum_sq_norms), (norms**2).sum(), rtol=1e-12)
    np.testing.assert_allclose(acc.sum_unit.numpy(), (ref[nz] / norms[nz, None]).sum(0), rtol=1e-12)
    np.testing.assert_allclose(acc.covariance().numpy(), np.cov(ref.T), rtol=1e-9, atol=1e-12)
    assert centred_anisotropy_from_moments(acc.count, acc.sum, acc.second_moment) == pytest.approx(
        centred_anisotropy(x), rel=1e-9
    )


def test_two_halves_merge_to_the_whole():
    x = _stream(1)
    whole, first, second = (MomentAccumulator(12) for _ in range(3))
    whole.update(x)
    first.update(x[:250])
    second.update(x[250:])
    first.merge(second)
    assert (first.count, first.n_nonzero) == (whole.count, whole.n_nonzero)
    for name, magnitudes in _magnitudes(x).items():  # the same sums in another order
        assert_reordered_sums(getattr(first, name), getattr(whole, name), magnitudes, *_terms(x))


def test_saved_moments_restore_exactly_and_keep_accumulating(tmp_path):
    """What a sweep's window unit saves is what the fit unit pools: every sum, bit for bit."""
    x = _stream(2)
    whole, saved = MomentAccumulator(12), MomentAccumulator(12)
    whole.update(x)
    saved.update(x[:300])
    torch.save(saved.state_dict(), tmp_path / "m.pt")
    back = MomentAccumulator.from_state_dict(torch.load(tmp_path / "m.pt", weights_only=True))
    back.update(x[300:])
    assert (back.count, back.n_nonzero) == (whole.count, whole.n_nonzero)
    for name, magnitudes in _magnitudes(x).items():  # the same sums in another order
        assert_reordered_sums(getattr(back, name), getattr(whole, name), magnitudes, *_terms(x))
    first = MomentAccumulator(12, second_moment=False)
    first.update(x)
    assert MomentAccumulator.from_state_dict(first.state_dict()).second_moment is None


def test_moment_accumulator_rejects_bad_input():
    acc = MomentAccumulator(4, second_moment=False)
    with pytest.raises(ValueError, match=r"\(n, 4\)"):
        acc.update(torch.ones(3, 5))
    with pytest.raises(ValueError, match="no second moment"):
        acc.covariance()
    with pytest.raises(ValueError, match="undefined"):
        _ = acc.mean
    with pytest.raises(ValueError, match="merge only"):
        acc.merge(MomentAccumulator(4))


@pytest.mark.parametrize("tracked", [list(range(10)), [1, 4, 5, 9], []])
def test_type_sums_match_brute_force(tracked):
    """Sums of the tracked types only (the rest skipped), row ``i`` of type ``ids[i]``."""
    x = _stream(2, n=200, d=6)
    tokens = torch.randint(10, (200,), generator=torch.Generator().manual_seed(0))
    sums = TypeSums(tracked, 6, vocab_size=10)
    half = TypeSums(torch.tensor(tracked, dtype=torch.int64), 6, vocab_size=10)
    sums.update(tokens[:120], x[:120])
    half.update(tokens[120:], x[120:])
    sums.merge(half)
    assert sums.ids.tolist() == tracked and sums.sum.shape == (len(tracked), 6)
    for row, t in enumerate(tracked):
        rows = x[tokens == t].double()
        assert int(sums.count[row]) == rows.shape[0]
        torch.testing.assert_close(sums.sum[row], rows.sum(0))
        torch.testing.assert_close(sums.sum_sq_norms[row], (rows**2).sum())
    assert int(sums.count.sum()) == int(torch.isin(tokens, torch.tensor(tracked)).sum())
    if tracked:
        assert sums.rows_of(torch.tensor(tracked[::-1])).tolist() == list(range(len(tracked)))[::-1]
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        sums.update(torch.tensor([10]), x[:1])


def test_type_sums_refuse_other_types_and_bad_ids():
    sums = TypeSums([1, 4], 3, vocab_size=10)
    with pytest.raises(ValueError, match="same tracked type ids"):
        sums.merge(TypeSums([1, 5], 3, vocab_size=10))
    with pytest.raises(ValueError, match="equal tracked types"):
        sums.merge(TypeSums([1, 4, 5], 3, vocab_size=10))
    with pytest.raises(ValueError, match="not tracked"):
        sums.rows_of(torch.tensor([4, 2]))
    with pytest.raises(ValueError, match="strictly increasing"):
        TypeSums([4, 1], 3, vocab_size=10)
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        TypeSums([1, 10], 3, vocab_size=10)
    with pytest.raises(ValueError, match="strictly increasing"):
        StatisticsConfig(type_sums=True, vocab_size=10, type_ids=(3, 3))
    with pytest.raises(ValueError, match="type_sums=True"):
        StatisticsConfig(vocab_size=10, type_ids=(3,))


def test_priorities_are_uniform_and_seeded():
    ids = torch.arange(200_000)
    p = row_priorities(0, ids)
    assert float(p.min()) >= 0 and float(p.max()) < 1
    counts = np.histogram(p.numpy(), bins=20, range=(0, 1))[0]
    expected = 200_000 / 20
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 45  # 19 dof: p ≈ 0.001
    assert torch.equal(row_priorities(0, ids[:10]), p[:10])
    assert not torch.equal(row_priorities(1, ids[:10]), p[:10])


def _fill(reservoir, ids, splits):
    for chunk in ids.split(splits):
        reservoir.add(chunk, {"x": chunk.double()[:, None] * 2, "id": chunk})


def test_reservoir_is_independent_of_batching_and_merges():
    ids = torch.arange(5000)
    a, b = RowReservoir(300, seed=3), RowReservoir(300, seed=3)
    _fill(a, ids, 1000)
    _fill(b, ids, 37)
    left, right = RowReservoir(300, seed=3), RowReservoir(300, seed=3)
    _fill(left, ids[:1234], 100)
    _fill(right, ids[1234:], 500)
    left.merge(right)
    expected = torch.topk(row_priorities(3, ids), 300, largest=False).indices.sort().values
    for r in (a, b, left):
        assert len(r) == 300
        assert torch.equal(r.ids, expected)
        cols = r.columns()
        assert torch.equal(cols["id"], expected)
        assert torch.equal(cols["x"][:, 0], expected.double() * 2)


def test_reservoir_below_capacity_keeps_everything_and_checks_columns():
    r = RowReservoir(100, seed=0)
    r.add(torch.arange(10), {"x": torch.zeros(10, 2)})
    assert torch.equal(r.ids, torch.arange(10))
    with pytest.raises(ValueError, match="columns must stay"):
        r.add(torch.arange(10, 12), {"y": torch.zeros(2)})
    with pytest.raises(ValueError, match="rows but"):
        r.add(torch.arange(3), {"x": torch.zeros(2, 2)})
    with pytest.raises(ValueError, match="capacity"):
        RowReservoir(0, seed=0)
    with pytest.raises(ValueError, match="equal capacity"):
        r.merge(RowReservoir(5, seed=0))


def test_site_statistics_per_bin_and_merge():
    gen = torch.Generator().manual_seed(4)
    h, g = torch.randn(300, 8, generator=gen), torch.randn(300, 8, generator=gen)
    tokens = torch.randint(20, (300,), generator=gen)
    bins = tokens % 3
    bins[:7] = -1  # unseen types belong to no bin, but to the overall moments
    ids = torch.arange(300)
    config = StatisticsConfig(
        n_bins=3, type_sums=True, vocab_size=20, type_ids=(0, 2, 3, 19), reservoir_size=50
    )
    whole, part = SiteStatistics(8, config), SiteStatistics(8, config)
    whole.update(h, g, tokens, ids, bins)
    rest = SiteStatistics(8, config)
    part.update(h[:100], g[:100], tokens[:100], ids[:100], bins[:100])
    rest.update(h[100:], g[100:], tokens[100:], ids[100:], bins[100:])
    part.merge(rest)
    for b in range(3):
        rows = g[bins == b].double()
        torch.testing.assert_close(whole.g_bins[b].second_moment, rows.T @ rows)
        torch.testing.assert_close(part.g_bins[b].second_moment, rows.T @ rows)
        assert whole.h_bins[b].count == int((bins == b).sum())
        assert whole.h_bins[b].second_moment is None  # nothing reads H's per-bin d × d
        torch.testing.assert_close(part.h_bins[b].sum, h[bins == b].double().sum(0))
    for stats in (whole, part):
        torch.testing.assert_close(stats.g.second_moment, g.double().T @ g.double())
        torch.testing.assert_close(stats.h.second_moment, h.double().T @ h.double())
        assert stats.h.count == 300
    assert torch.equal(part.reservoir.ids, whole.reservoir.ids)
    torch.testing.assert_close(part.types.sum, whole.types.sum)
    assert whole.types.ids.tolist() == [0, 2, 3, 19]
    torch.testing.assert_close(whole.types.sum[3], h[tokens == 19].double().sum(0))
    unmoved = SiteStatistics(8, dataclasses.replace(config, gradient_bin_moments=False))
    unmoved.update(h, g, tokens, ids, bins)
    assert all(acc.second_moment is None for acc in unmoved.g_bins)
    torch.testing.assert_close(unmoved.g.second_moment, whole.g.second_moment)
    torch.testing.assert_close(unmoved.g_bins[1].sum, whole.g_bins[1].sum)
    assert sorted(whole.reservoir.columns()) == ["G", "H", "bin", "token"]
    with pytest.raises(ValueError, match="bins are required"):
        whole.update(h, g, tokens, ids)
    with pytest.raises(ValueError, match="exactly when"):
        whole.update(h, None, tokens, ids, bins)
    with pytest.raises(ValueError, match="vocab_size"):
        StatisticsConfig(type_sums=True)
    with pytest.raises(ValueError, match="n_bins"):
        StatisticsConfig(n_bins=-1)


# ------------------------------------------------------- per-sequence energy sums


def _orthonormal(d, k, seed):
    gen = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(d, k, generator=gen, dtype=torch.float64))
    return q


def _projectors(d=6):
    """Two proxies, one whose controls avoid a unit direction m̂ (orthogonal to it) and one whose
    controls fill ℝ^d."""
    from tangentlens.capture import EnergyProjectors

    m = _orthonormal(d, 1, 7)
    a = _orthonormal(d, 2, 1)
    a = torch.linalg.qr(a - m @ (m.T @ a))[0]
    proxies = {"a": a, "b": _orthonormal(d, 3, 2)}
    excluded = {"a": m, "b": None}
    return proxies, excluded, EnergyProjectors.from_proxies(proxies, excluded)


def _energy_stream(seed=0, n_seq=7, seq_len=9, d=6, n_bins=2):
    """Kept rows of ``n_seq`` sequences: gradients, row ids (some positions dropped) and bins
    (some rows outside every bin)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.arange(n_seq * seq_len)
    ids = ids[torch.rand(ids.shape, generator=gen) > 0.3]
    g = torch.randn(len(ids), d, generator=gen, dtype=torch.float64)
    bins = torch.randint(-1, n_bins, (len(ids),), generator=gen)
    return g, ids, bins


def _brute_force(g, ids, bins, proxies, excluded, seq_len, n_slots=3):
    """Per sequence, per slot, written out row by row: Σ‖g‖², Σ‖gQ‖² and the drift sums
    Σ (m̂ᵀg) g."""
    sequences = sorted({int(i) // seq_len for i in ids})
    d = g.shape[1]
    total = np.zeros((len(sequences), n_slots))
    inside = np.zeros((len(sequences), len(proxies), n_slots))
    drift = np.zeros((len(sequences), n_slots, d))
    m = excluded["a"].numpy()[:, 0]
    for row, i, b in zip(g.numpy(), ids.tolist(), bins.tolist(), strict=True):
        s = sequences.index(i // seq_len)
        for slot in {0, b + 1 if 0 <= b < n_slots - 1 else 0}:
            total[s, slot] += row @ row
            drift[s, slot] += (row @ m) * row
            for j, q in enumerate(proxies.values()):
                inside[s, j, slot] += np.sum((row @ q.numpy()) ** 2)
    return sequences, total, inside, drift


def _brute_sums(g, ids, bins, q, x, b, seq_len, slot):
    """One method's per-sequence sums in ``slot``, row by row: of ``r = g − b (m̂ᵀg)`` where its
    controls avoid ``x`` = m̂ — ``Σ‖Qᵀr‖²``, ``Σ‖g‖²``, ``k/(d − 1) Σ‖r‖²``, ``k/(d − 1 − k)
    Σ(‖r‖² − ‖Qᵀr‖²)`` — else of ``g`` with ``k/d`` and ``k/(d − k)``."""
    sequences = sorted({int(i) // seq_len for i in ids})
    d, k = q.shape
    out = np.zeros((4, len(sequences)))
    for row, i, bin_ in zip(g.numpy(), ids.tolist(), bins.tolist(), strict=True):
        if slot and bin_ != slot - 1:
            continue
        r = row if x is None else row - (row @ x.numpy()[:, 0]) * b
        inside, outside = np.sum((r @ q.numpy()) ** 2), r @ r
        shift = 0 if x is None else 1
        values = (inside, row @ row, k / (d - shift) * outside)
        out[:3, sequences.index(i // seq_len)] += values
        out[3, sequences.index(i // seq_len)] += k / (d - shift - k) * (outside - inside)
    return out


def test_sequence_energy_matches_explicit_rows_and_ignores_batching():
    from tangentlens.capture import SequenceEnergy

    seq_len = 9
    proxies, excluded, projectors = _projectors()
    g, ids, bins = _energy_stream(seq_len=seq_len)
    whole = SequenceEnergy(projectors, seq_len, 3)
    whole.update(g, ids, bins)
    sequences, *expected = _brute_force(g, ids, bins, proxies, excluded, seq_len)
    assert whole.sequences.tolist() == sequences and whole.n_sequences == len(sequences)
    names = ("total", "inside", "drift")
    for name, want in zip(names, expected, strict=True):
        np.testing.assert_allclose(getattr(whole, name).numpy(), want, rtol=1e-12, err_msg=name)
    # split at odd places (a sequence cut in two) and merged from two accumulators
    parts = [SequenceEnergy(projectors, seq_len, 3) for _ in range(2)]
    for k, (gc, ic, bc) in enumerate(zip(g.split(10), ids.split(10), bins.split(10), strict=True)):
        parts[k % 2].update(gc, ic, bc)
    parts[0].merge(parts[1])
    assert torch.equal(parts[0].sequences, whole.sequences)
    for name in names:
        torch.testing.assert_close(
            getattr(parts[0], name), getattr(whole, name), rtol=1e-12, atol=0
        )
    # each method's sums for a coefficient b: drift-regressed where its controls avoid m̂
    b = torch.linspace(-1.0, 2.0, 6, dtype=torch.float64)
    for method, coefficient in (("a", b), ("b", None)):
        sums = whole.sums(method, 1, coefficient)
        want = _brute_sums(g, ids, bins, proxies[method], excluded[method], b.numpy(), seq_len, 2)
        for got, expect in zip(sums, want, strict=True):
            np.testing.assert_allclose(got.numpy(), expect, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="no projectors for method"):
        whole.sums("c")
    with pytest.raises(ValueError, match="bin_index must be None or in"):
        whole.sums("a", 2)
    with pytest.raises(ValueError, match="its sums need the drift regression's coefficient"):
        whole.sums("a", 1)
    other = SequenceEnergy(_projectors()[2], seq_len, 3)
    with pytest.raises(ValueError, match="same projectors"):
        whole.merge(other)


def test_site_statistics_gather_sequence_energy_only_for_named_sites():
    from tangentlens.capture import SequenceEnergyConfig

    seq_len = 9
    proxies, excluded, projectors = _projectors()
    spec = SequenceEnergyConfig(seq_len=seq_len, projectors={"site": projectors}, n_bins=2)
    config = StatisticsConfig(n_bins=2, reservoir_size=0, sequence_energy=spec)
    g, ids, bins = _energy_stream(seq_len=seq_len)
    h = torch.randn_like(g)
    stats = SiteStatistics(6, config, site="site")
    halves = [SiteStatistics(6, config, site="site") for _ in range(2)]
    stats.update(h, g, ids, ids, bins)
    halves[0].update(h[:20], g[:20], ids[:20], ids[:20], bins[:20])
    halves[1].update(h[20:], g[20:], ids[20:], ids[20:], bins[20:])
    halves[0].merge(halves[1])
    _, total, inside, *_ = _brute_force(g, ids, bins, proxies, excluded, seq_len)
    for s in (stats, halves[0]):
        np.testing.assert_allclose(s.sequence_energy.total.numpy(), total, rtol=1e-12)
        np.testing.assert_allclose(s.sequence_energy.inside.numpy(), inside, rtol=1e-12)
    # summed over sequences: the energies of the pooled (per-bin) second moments
    for slot, acc in enumerate([stats.g, *stats.g_bins]):
        q, m = proxies["a"], excluded["a"]
        pooled = float(torch.trace(q.T @ acc.second_moment @ q))
        assert float(stats.sequence_energy.inside[:, 0, slot].sum()) == pytest.approx(
            pooled, rel=1e-12
        )
        # the drift-regressed exchangeable mean: k/(d − 1) · tr S, S the Schur complement
        regression = drift_regression(acc.second_moment, m[:, 0])
        null = 2 / 5 * float(torch.trace(regression.moment))
        bin_index = None if slot == 0 else slot - 1
        sums = stats.sequence_energy.sums("a", bin_index, regression.coefficient)
        assert float(sums.control.sum()) == pytest.approx(null, rel=1e-10)
    assert SiteStatistics(6, config, site="other").sequence_energy is None
    assert SiteStatistics(6, config).sequence_energy is None
    with pytest.raises(ValueError, match="merge only when both keep sequence energies"):
        stats.merge(SiteStatistics(6, config, site="other"))
    with pytest.raises(ValueError, match="sequence_energy sums 2 bins; the statistics keep 1"):
        StatisticsConfig(n_bins=1, sequence_energy=spec)
    with pytest.raises(ValueError, match="needs gradients=True"):
        StatisticsConfig(gradients=False, n_bins=2, sequence_energy=spec)
    with pytest.raises(ValueError, match="6-dimensional, the site is 5-dimensional"):
        SiteStatistics(5, config, site="site")


# ------------------------------------------------------------ memory arithmetic


def _tensor_bytes(stats: SiteStatistics) -> int:
    """Bytes of every tensor a SiteStatistics holds (besides its reservoir)."""
    accumulators = [stats.h, stats.g, *stats.h_bins, *stats.g_bins]
    tensors = [
        getattr(acc, name)
        for acc in accumulators
        if acc is not None
        for name in ("_n_nonzero", "sum", "sum_unit", "sum_norms", "sum_sq_norms", "second_moment")
    ]
    if stats.types is not None:
        t = stats.types
        tensors += [t.ids, t._row, t.count, t.sum, t.sum_sq_norms]
    return sum(x.nbytes for x in tensors if x is not None)


@pytest.mark.parametrize(
    "config",
    [
        StatisticsConfig(reservoir_size=0),
        StatisticsConfig(gradients=False, n_bins=4),
        StatisticsConfig(n_bins=5, reservoir_size=10),
        StatisticsConfig(n_bins=3, gradient_bin_moments=False),
        StatisticsConfig(n_bins=2, type_sums=True, vocab_size=50),
        StatisticsConfig(gradients=False, type_sums=True, vocab_size=50, type_ids=(1, 7, 49)),
        StatisticsConfig(n_bins=1, type_sums=True, vocab_size=50, type_ids=()),
    ],
)
def test_statistics_bytes_equal_the_allocated_buffers(config):
    from tangentlens.capture.chunks import statistics_bytes

    d = 7
    stats = SiteStatistics(d, config)
    n_types = 0
    if config.type_sums:
        n_types = config.vocab_size if config.type_ids is None else len(config.type_ids)
    expected = statistics_bytes(
        d,
        gradients=config.gradients,
        n_bins=config.n_bins,
        bin_moments=config.gradient_bin_moments,
        n_types=n_types,
        vocab_size=config.vocab_size if config.type_sums else 0,
    )
    assert expected == _tensor_bytes(stats)
    with pytest.raises(ValueError, match="n_types"):
        statistics_bytes(d, gradients=True, n_bins=0, bin_moments=False, n_types=3)


def test_loss_chunk_rows_fit_the_chunk_bytes_and_import_no_torch():
    import subprocess
    import sys

    from tangentlens.capture.chunks import LOSS_CHUNK_BYTES, loss_chunk_rows

    assert loss_chunk_rows(50_304) == LOSS_CHUNK_BYTES // (4 * 50_304) == 1334
    assert loss_chunk_rows(2**40) == 1
    with pytest.raises(ValueError, match="d_vocab"):
        loss_chunk_rows(0)
    script = "import sys, tangentlens.capture.chunks; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr
