"""PCA of centred activations: the baseline tangent proxy.

``components_`` (k × d) are the top-``k`` eigenvectors of the covariance of ``H`` (float64, from
a chunked two-pass scatter, or from streamed moments with :meth:`PCA.from_moments`), in
decreasing variance order with deterministic signs. ``H ≈ Z D + mean`` with ``D = components_``.
"""

from __future__ import annotations

import torch

from tangentlens.checks import check_count, check_matrix, check_square, check_vector, to_float64
from tangentlens.dictionaries.base import check_fitted, check_rank
from tangentlens.metrics.geometry import centred_scatter
from tangentlens.metrics.subspace import DEFAULT_RANK_RTOL
from tangentlens.typing import Activations, ArrayLike, Basis, Codes, Moment

__all__ = ["PCA"]


class PCA:
    """Top-``rank`` principal directions of centred activations.

    Fitted attributes: ``mean_`` (d,), ``components_`` (rank × d, orthonormal rows),
    ``explained_variance_`` (rank,), ``explained_variance_ratio_`` (rank,), ``n_samples_``.
    """

    def __init__(self, rank: int) -> None:
        self.rank = check_count(rank, "rank", minimum=1)

    def fit(self, H: ArrayLike) -> PCA:
        """Fit on ``H`` (n × d), n ≥ 2."""
        X = check_matrix(H, "H", min_rows=2)
        check_rank(self.rank, X.shape[1], X.shape[0])
        mean, scatter = centred_scatter(X)
        return self._fit_scatter(X.shape[0], mean, scatter)

    @classmethod
    def from_moments(cls, rank: int, n: int, sum: ArrayLike, second_moment: ArrayLike) -> PCA:
        """Fit from streamed moments: ``n`` rows, ``Σh`` (d,), ``Σhhᵀ`` (d × d) in float64."""
        n = check_count(n, "n", minimum=2)
        s = to_float64(check_vector(sum, "sum"))
        M = to_float64(check_square(second_moment, "second_moment", size=s.shape[0]))
        pca = cls(rank)
        check_rank(rank, s.shape[0], n)
        return pca._fit_scatter(n, s / n, M - torch.outer(s, s) / n)

    def _fit_scatter(self, n: int, mean: torch.Tensor, scatter: Moment) -> PCA:
        values, vectors = torch.linalg.eigh((scatter + scatter.T) / 2)
        values, vectors = values.flip(0).clamp(min=0) / (n - 1), vectors.flip(1)
        top = vectors[:, : self.rank]
        top = top * torch.sign(top.gather(0, top.abs().argmax(dim=0, keepdim=True)))
        total = float(values.sum())
        if not total > 0:
            raise ValueError("H has zero variance (all rows equal): no principal direction")
        self.mean_ = mean
        self.components_ = top.T.contiguous()
        self.explained_variance_ = values[: self.rank]
        self.explained_variance_ratio_ = values[: self.rank] / total
        self.n_samples_ = n
        return self

    @property
    def effective_rank_(self) -> int:
        """Components whose variance exceeds ``1e-6 ×`` the largest."""
        check_fitted(self, "fit(H) or PCA.from_moments")
        v = self.explained_variance_
        return int((v > DEFAULT_RANK_RTOL * v[0]).sum())

    def encode(self, H: ArrayLike) -> Codes:
        """Coordinates ``(H − mean) Dᵀ`` (n × rank), float64."""
        check_fitted(self, "fit(H) or PCA.from_moments")
        X = to_float64(check_matrix(H, "H", min_cols=self.components_.shape[1]))
        return (X - self.mean_) @ self.components_.T

    def decode(self, Z: ArrayLike) -> Activations:
        """Reconstruction ``Z D + mean`` (n × d), float64."""
        check_fitted(self, "fit(H) or PCA.from_moments")
        return to_float64(check_matrix(Z, "Z")) @ self.components_ + self.mean_

    def basis(self) -> Basis:
        """The principal directions as an orthonormal basis (d × rank), float64."""
        check_fitted(self, "fit(H) or PCA.from_moments")
        return self.components_.T.contiguous()
