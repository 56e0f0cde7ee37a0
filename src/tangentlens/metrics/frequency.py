"""Token frequency and geometry: how widely a token type's occurrences spread around the type's
centroid (METHODS.md §1.6).

For a token type ``t`` seen ``n_t`` times over the **whole** capture stream, with occurrences
``h₁ … h_{n_t}`` (rows of ``H``) and centroid ``c_t = Σᵢ hᵢ / n_t``, the per-type *spread* is the
Bessel-corrected mean squared distance to the centroid::

    s²_t = Σᵢ ‖hᵢ − c_t‖² / (n_t − 1) = (Σᵢ ‖hᵢ‖² − n_t ‖c_t‖²) / (n_t − 1),

computed exactly, in float64, from the streamed per-type sums (``count``, ``Σh``, ``Σ‖h‖²``, as
:class:`tangentlens.capture.TypeSums` keeps them), with no sample involved. It is the sum over
coordinates of the unbiased per-coordinate variances, so ``E[s²_t] = tr Σ_t`` for every ``n_t ≥ 2``
(``Σ_t`` the covariance of the type's occurrences); types seen once have no spread (NaN).

Why Bessel: the centroid contains the occurrence being measured, so the plain mean ``Σ‖hᵢ − c_t‖²
/ n_t`` has expectation ``(n_t − 1)/n_t · tr Σ_t``. Rare types then look tighter than they are and
``corr(log f, distance)`` is pushed up even when frequency and geometry are unrelated (2000
Zipf-distributed types, all with the same isotropic spread at d = 768: Pearson ≈ +0.85, Spearman
≈ +0.99 with the ÷ n estimator, ≈ 0 with ÷ (n − 1)). Leave-one-out centroids are not used: they
inflate the squared distance by ``n_t/(n_t − 1)``, the opposite bias.

The correlation (:func:`frequency_distance_correlation`) is taken across the types with
``n_t ≥ min_count`` (``min_count ≥ 2``), of log-frequency ``log f_t`` with ``s²_t``.

**The headline is the Pearson correlation on ``s²_t``.** For occurrences that are independent
with a common mean and covariances ``Σ_i`` of their own (heteroscedastic: e.g. a variance that
falls with the position, as causal context averaging makes it),
``E Σᵢ‖hᵢ − c_t‖² = Σᵢ tr Σᵢ − (1/n_t) Σᵢ tr Σᵢ``, so ``E[s²_t] = (1/n_t) Σᵢ tr Σᵢ``, the mean
occurrence variance, whatever the count. The count changes only the noise of ``s²_t`` (larger and
right-skewed for rare types), not its mean, so ``cov(log f, s²)`` is zero when the spread does
not depend on frequency, and the Pearson correlation reads ≈ 0 there. It is taken on ``s²_t``
itself, not on ``√s²_t``, which falls short of its root mean by a relative ``≈ 1/(4k_t)`` (Jensen;
``k_t`` below), again more for rare types.

**The Spearman correlation is biased upward, and is reported against its own null.** Ranks
compare medians, not means, and a rare type's ``s²_t`` is right-skewed (median below mean), so
rare types rank low and the Spearman reads positive when spread does not depend on frequency.
For Gaussian occurrences of equal covariance ``(n_t − 1) s²_t / σ²`` is ``χ²`` with ``k_t ≈ d_eff
(n_t − 1)`` degrees of freedom (``d_eff = (tr Σ)² / tr Σ²``, median ``≈ (1 − 2/(9k_t))³`` times the
mean) and the shift shrinks with width: on 3000 Zipf types (40 000 tokens, ``min_count = 2``,
300 seeds) about +0.056 at ``d_eff = 16``, +0.016 at 256 and +0.010 at 768. It does **not** shrink
for heteroscedastic occurrences: with a per-occurrence variance ``∝ w = 1/(pos + 1)`` (positions
uniform in 0…127), ``Var(s²_t)`` keeps a term ``E[s²_t]² cv²(w) / n_t`` (``cv`` the coefficient
of variation of ``w``) whatever the width, so the skew is the position mix's, not the χ²'s: the
same 3000 Zipf types read a Spearman of +0.27 at d = 32 and at d = 128 (``min_count = 2``; +0.23
at ``min_count = 5``, +0.12 at 20) while their Pearson reads 0.00 (±0.02 over seeds). mini-pythia at
step 0 with its analysis tokens shuffled across positions (10 shuffles) reads Spearman +0.13 to
+0.19 per site, Pearson +0.005 to +0.012 (sd 0.02 over the shuffles).

The Spearman's null (:func:`frequency_spearman_null`) keeps every type's count and gives it
residuals from one shared pool: the sampled rows of the correlated types, each minus its type's
full-stream centroid and rescaled by ``√(n_t/(n_t − 1))`` so that its expected squared norm is the
mean occurrence variance (:func:`centroid_residuals`). Each replicate draws ``n_t`` residuals
with replacement per type and computes ``s²*_t`` from the drawn sums as for the data
(:func:`shuffled_spreads`); the null's Spearman replicates give a mean, a standard deviation and
the *excess* ``observed − null mean``. What the null assumes: one residual distribution for
every type (its skew, position mix and width included), i.e. a spread that depends neither on
frequency nor on the type. When spreads differ by type independently of frequency, the observed
``s²_t`` carry that extra, count-free rank noise, which dilutes the count-driven bias, while the
null's types are exchangeable: the null's bias is then the larger one and the excess leans
negative. Measured (3000 Zipf types, 40 000 tokens, d = 32, positions as above, ``min_count =
5``, 200 seeds, 20 replicates): equal spread, excess −0.002 ± 0.028 (raw Spearman +0.225 ±
0.028, null mean +0.227, Pearson +0.001 ± 0.021); per-type log-normal spread factors
``exp(τ z_t)`` independent of frequency, excess −0.079 ± 0.029 at τ = 0.5 and −0.145 ± 0.031 at
τ = 1 (Pearson −0.002 and −0.001); spread ``∝ f^−0.5``, Pearson −0.302 ± 0.012 and excess −0.683
± 0.023. So a negative excess alone does not show that spread falls with frequency; the Pearson
does, and stays the headline. A second, smaller approximation: the residuals of rare types
average over few occurrences, so their tails are a little lighter than an occurrence's and the
pool slightly understates the skew of the types whose spread is largest (spread ``∝ f^−0.5``:
null mean +0.217 against +0.234 for fresh draws from the pooled distribution, 20 seeds). On
mini-pythia's step 0 with shuffled tokens the excess reads −0.000 to +0.010 per site (raw
Spearman +0.13 to +0.19), on the real token order −0.06 to −0.07.

The pool needs at least :func:`min_pool_rows` ``(d) = max(2d, 256)`` residual rows (fewer cannot
represent a d-dimensional residual distribution, its covariance and its tail); the probe emits no
null rows below that. Each replicate costs ``Σ n_t × d`` multiply-adds, drawn in windows of
bounded size (memory does not grow with the number of tokens), from a generator of its own.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int

from tangentlens.checks import as_tensor, check_count, check_matrix, to_float64
from tangentlens.metrics.geometry import Correlation, correlations
from tangentlens.seeding import seeded_generators
from tangentlens.typing import ArrayLike

__all__ = [
    "SpearmanNull",
    "centroid_residuals",
    "centroid_spread_from_sums",
    "centroids_from_sums",
    "frequency_distance_correlation",
    "frequency_spearman_null",
    "min_pool_rows",
    "shuffled_spreads",
]

PerType = Float[torch.Tensor, " vocab"]


def _counts(count: ArrayLike) -> torch.Tensor:
    c = to_float64(as_tensor(count, "count"))
    if c.ndim != 1 or not bool(torch.isfinite(c).all()) or bool((c < 0).any()):
        raise ValueError("count must be a 1-D vector of non-negative occurrence counts per type")
    if bool((c != c.round()).any()):
        raise ValueError("count must hold whole numbers of occurrences per type")
    return c


def centroids_from_sums(count: ArrayLike, sum: ArrayLike) -> Float[torch.Tensor, "vocab d"]:
    """Per-type centroids ``sum / count`` (vocab × d) in float64; rows of unseen types are NaN."""
    c = _counts(count)
    s = to_float64(as_tensor(sum, "sum"))
    if s.ndim != 2 or s.shape[0] != c.shape[0]:
        raise ValueError(f"sum must be (vocab, d) with vocab = {c.shape[0]}, got {tuple(s.shape)}")
    c = c.to(s.device)
    return s / c[:, None]


def centroid_spread_from_sums(count: ArrayLike, sum: ArrayLike, sum_sq_norms: ArrayLike) -> PerType:
    """Bessel-corrected mean squared distance to the type's centroid, per type (float64).

    ``s²_t = (Σ‖hᵢ‖² − n_t ‖c_t‖²) / (n_t − 1)`` from the streamed sums ``count`` (vocab,),
    ``sum`` = ``Σh`` (vocab × d) and ``sum_sq_norms`` = ``Σ‖h‖²`` (vocab,) — i.e. the sum over
    coordinates of the ``ddof = 1`` variances of the type's occurrences. Unbiased for ``tr Σ_t``
    at every count; NaN for types seen fewer than 2 times. Tiny negative values left by rounding
    (a type whose occurrences are all the same vector) are clamped to 0.
    """
    c = _counts(count)
    s = to_float64(as_tensor(sum, "sum"))
    if s.ndim != 2 or s.shape[0] != c.shape[0]:
        raise ValueError(f"sum must be (vocab, d) with vocab = {c.shape[0]}, got {tuple(s.shape)}")
    sq = to_float64(as_tensor(sum_sq_norms, "sum_sq_norms")).to(s.device)
    if sq.shape != c.shape:
        raise ValueError(f"sum_sq_norms must have shape {tuple(c.shape)}, got {tuple(sq.shape)}")
    c = c.to(s.device)
    seen = c >= 2
    n = torch.where(seen, c, torch.ones_like(c))  # no 0/0 for unseen types
    scatter = sq - s.pow(2).sum(dim=1) / n  # Σ‖h − c‖² = Σ‖h‖² − ‖Σh‖²/n
    spread = scatter.clamp(min=0) / (n - 1).clamp(min=1)
    return torch.where(seen, spread, torch.full_like(spread, float("nan")))


def frequency_distance_correlation(
    log_frequency: ArrayLike,
    spread: ArrayLike,
    count: ArrayLike,
    min_count: int = 2,
) -> Correlation:
    """Pearson and Spearman correlation, across types with ``count ≥ min_count`` (≥ 2), of
    log-frequency (vocab,) with a per-type spread (vocab,), e.g. the Bessel-corrected squared
    centroid distance of :func:`centroid_spread_from_sums`. Types whose log-frequency or spread
    is not finite are left out; ``Correlation.n`` is the number of types used."""
    min_count = check_count(min_count, "min_count", minimum=2)
    values = to_float64(as_tensor(spread, "spread"))
    c = _counts(count).to(values.device)
    lf = to_float64(as_tensor(log_frequency, "log_frequency")).to(values.device)
    if lf.shape != c.shape or values.shape != c.shape:
        raise ValueError(
            "log_frequency, spread and count must all be (vocab,) vectors, got "
            f"{tuple(lf.shape)}, {tuple(values.shape)}, {tuple(c.shape)}"
        )
    keep = (c >= min_count) & torch.isfinite(values) & torch.isfinite(lf)
    if int(keep.sum()) < 3:
        raise ValueError(
            f"only {int(keep.sum())} token types have ≥ {min_count} occurrences and finite "
            "values; a correlation needs at least 3"
        )
    return correlations(lf[keep], values[keep])


# ------------------------------------------------------------------ count-preserving shuffle null

#: Float64 elements of one chunk of drawn residual rows (2²² × 8 B = 32 MiB), whatever the stream.
_CHUNK_ELEMENTS = 1 << 22


def min_pool_rows(d: int) -> int:
    """Residual rows a shuffle null needs at width ``d``: ``max(2d, 256)``."""
    return max(2 * d, 256)


def centroid_residuals(
    count: ArrayLike,
    sum: ArrayLike,
    type_rows: Int[torch.Tensor, " m"],
    H: ArrayLike,
) -> Float[torch.Tensor, "p d"]:
    """Within-type residuals of sampled rows, rescaled so that their squared norm is unbiased.

    ``count`` (T,) and ``sum`` (T × d) are the full-stream per-type sums; ``type_rows`` (m,)
    gives, for each sampled row of ``H`` (m × d), its type's row of ``count``/``sum``, or −1 for
    a row to leave out. Each kept row becomes ``r = (h − c_t) √(n_t/(n_t − 1))`` with ``c_t =
    Σh/n_t`` the type's full-stream centroid: ``h − c_t`` has ``E‖h − c_t‖² = (n_t − 1)/n_t``
    times the mean occurrence variance (the centroid contains ``h``), so ``E‖r‖²`` is that mean
    variance at every count. Rows of types seen fewer than twice are left out. Float64, (p × d),
    in the order of ``H``, on ``sum``'s device.
    """
    c = _counts(count)
    s = to_float64(as_tensor(sum, "sum"))
    if s.ndim != 2 or s.shape[0] != c.shape[0]:
        raise ValueError(f"sum must be (vocab, d) with vocab = {c.shape[0]}, got {tuple(s.shape)}")
    X = to_float64(check_matrix(H, "H")).to(s.device)
    if X.shape[1] != s.shape[1]:
        raise ValueError(f"H must have d = {s.shape[1]} columns like sum, got {X.shape[1]}")
    rows = torch.as_tensor(type_rows).to(s.device, torch.int64)
    if rows.shape != (X.shape[0],):
        raise ValueError(f"type_rows must be a ({X.shape[0]},) vector (one per row of H)")
    if rows.numel() and (int(rows.min()) < -1 or int(rows.max()) >= c.shape[0]):
        raise ValueError(f"type_rows must lie in [-1, {c.shape[0]}) (−1: leave the row out)")
    c = c.to(s.device)
    padded = torch.cat([c, c.new_zeros(1)])  # row −1 reads the 0 pad
    kept = padded[rows] >= 2
    rows = rows[kept]
    n = c[rows]
    return (X[kept] - s[rows] / n[:, None]) * (n / (n - 1)).sqrt()[:, None]


def _segments(count: torch.Tensor, chunk_rows: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The stream of ``Σ count`` draws (type 0's ``count[0]`` draws first, then type 1's …) cut
    into windows of at most ``chunk_rows``: per window, the types it covers and how many draws
    of each. Memory per window: ``chunk_rows`` whatever the stream's length."""
    ends = torch.cumsum(count, 0)
    starts = ends - count
    total = int(ends[-1]) if ends.numel() else 0
    for lo in range(0, total, chunk_rows):
        hi = min(lo + chunk_rows, total)
        first = int(torch.searchsorted(ends, torch.tensor(lo), right=True))
        last = int(torch.searchsorted(starts, torch.tensor(hi), right=False))  # exclusive
        types = torch.arange(first, last)
        sizes = torch.minimum(ends[first:last], torch.tensor(hi)) - torch.maximum(
            starts[first:last], torch.tensor(lo)
        )
        yield types, sizes


def shuffled_spreads(
    count: ArrayLike,
    pool: ArrayLike,
    draws: int,
    seed_key: Sequence[int],
    *,
    chunk_rows: int | None = None,
) -> Float[torch.Tensor, "draws T"]:
    """Bessel spreads of the count-preserving shuffle null, (draws × T) float64.

    For each replicate ``b`` every type ``t`` gets ``n_t = count[t]`` (≥ 2) residuals drawn
    uniformly with replacement from ``pool`` (p × d, e.g. :func:`centroid_residuals`), and
    ``s²*_t = (Σ‖r‖² − ‖Σr‖²/n_t) / (n_t − 1)`` from the drawn sums, as
    :func:`centroid_spread_from_sums` computes the observed spread. Replicate ``b`` draws from
    its own generator seeded from ``(*seed_key, b)`` (never the global RNG), type after type,
    in windows of ``chunk_rows`` drawn rows (default: 2²² float64 elements' worth), so memory
    does not grow with ``Σ n_t``; the draws, hence the values, do not depend on the window size.
    Cost: ``draws × Σ n_t × d`` multiply-adds.
    """
    draws = check_count(draws, "draws", minimum=1)
    c = _counts(count)
    if bool((c < 2).any()):
        raise ValueError("every type of a shuffle null needs a count ≥ 2 (a spread)")
    R = to_float64(check_matrix(pool, "pool", min_rows=1))
    p, d = R.shape
    if chunk_rows is None:
        chunk_rows = max(1, _CHUNK_ELEMENTS // d)
    chunk_rows = check_count(chunk_rows, "chunk_rows", minimum=1)
    n = c.long().cpu()  # the counts: the windows are planned on the host
    # rows 0..p−1: the pool's residuals and their squared norms; row p: the running sums of a
    # window's first type, which may continue from the window before
    table = torch.zeros(p + 1, d + 1, dtype=torch.float64, device=R.device)
    table[:p, :d] = R
    table[:p, d] = R.pow(2).sum(dim=1)
    carry = torch.tensor([p], device=R.device)
    out = torch.empty(draws, n.shape[0], dtype=torch.float64, device=R.device)
    nd = c.to(R.device)
    for b, generator in enumerate(seeded_generators(*seed_key, count=draws, device=R.device)):
        sums = torch.zeros(n.shape[0], d + 1, dtype=torch.float64, device=R.device)
        for types, sizes in _segments(n, chunk_rows):
            size = int(sizes.sum())
            index = torch.randint(p, (size,), generator=generator, device=R.device)
            table[p] = sums[types[0]]
            starts = torch.cat([sizes.new_zeros(1), 1 + torch.cumsum(sizes, 0)[:-1]])
            # each type's drawn rows summed in draw order, as a running sum would: the window's
            # first type starts from its carried sums, the others from zero
            sums[types.to(R.device)] = torch.nn.functional.embedding_bag(
                torch.cat([carry, index]), table, starts.to(R.device), mode="sum"
            )
        out[b] = (sums[:, d] - sums[:, :d].pow(2).sum(dim=1) / nd).clamp(min=0) / (nd - 1)
    return out


@dataclass(frozen=True)
class SpearmanNull:
    """The observed Spearman of log-frequency with the spread, and its count-preserving shuffle
    null: ``values`` (draws,) the null replicates' Spearman; ``pearson_values`` (draws,) the
    same replicates' Pearson (the headline's null, from the same draws); ``n`` types
    correlated; ``pool`` residual rows drawn from."""

    observed: float
    values: torch.Tensor
    n: int
    pool: int
    pearson_values: torch.Tensor | None = None

    @property
    def pearson_mean(self) -> float:
        """Mean Pearson of the replicates (NaN without them)."""
        values = self.pearson_values
        return float(values.mean()) if values is not None and values.numel() else math.nan

    @property
    def pearson_std(self) -> float:
        """Standard deviation of the replicates' Pearson (ddof 1; NaN with fewer than two)."""
        values = self.pearson_values
        return (
            float(values.std(correction=1))
            if values is not None and values.numel() > 1
            else math.nan
        )

    @property
    def mean(self) -> float:
        return float(self.values.mean())

    @property
    def std(self) -> float:
        """Standard deviation of the replicates (ddof 1; NaN with one replicate)."""
        return float(self.values.std(correction=1)) if self.values.numel() > 1 else math.nan

    @property
    def excess(self) -> float:
        """``observed − mean``: the rank association beyond what the null's count-dependent
        skew produces."""
        return self.observed - self.mean


def frequency_spearman_null(
    log_frequency: ArrayLike,
    spread: ArrayLike,
    count: ArrayLike,
    pool: ArrayLike,
    *,
    draws: int,
    seed_key: Sequence[int],
    min_count: int = 2,
) -> SpearmanNull:
    """The Spearman of :func:`frequency_distance_correlation` (same types: ``count ≥
    min_count``, finite spread and log-frequency) against its count-preserving shuffle null
    (:func:`shuffled_spreads` over those types' counts, residuals from ``pool``), with each
    replicate's Pearson too (``pearson_values``: the headline Pearson's null, same draws)."""
    min_count = check_count(min_count, "min_count", minimum=2)
    values = to_float64(as_tensor(spread, "spread"))
    c = _counts(count).to(values.device)
    lf = to_float64(as_tensor(log_frequency, "log_frequency")).to(values.device)
    observed = frequency_distance_correlation(lf, values, c, min_count)
    keep = (c >= min_count) & torch.isfinite(values) & torch.isfinite(lf)
    null = shuffled_spreads(c[keep], pool, draws, seed_key)
    both = [correlations(lf[keep], row) for row in null]
    rho = torch.tensor([b.spearman for b in both], dtype=torch.float64)
    r = torch.tensor([b.pearson for b in both], dtype=torch.float64)
    size = int(as_tensor(pool, "pool").shape[0])
    return SpearmanNull(observed.spearman, rho, observed.n, size, pearson_values=r)
