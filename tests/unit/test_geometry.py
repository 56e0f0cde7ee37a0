"""Cosine anisotropy, drift, correlations and centred anisotropy against brute force and numpy."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy import stats

from tangentlens.capture.accumulators import MomentAccumulator
from tangentlens.capture.captured import Capture
from tangentlens.metrics.geometry import (
    Correlation,
    centred_anisotropy,
    centred_anisotropy_from_moments,
    centred_singular_anisotropy,
    centred_singular_anisotropy_from_moments,
    correlations,
    cosine_anisotropy,
    cosine_anisotropy_from_sums,
    cosine_anisotropy_sampled,
    covariance,
    drift_norm,
    drift_norm_from_sums,
    relative_drift,
    relative_drift_from_sums,
    unit_row_sum,
)
from tangentlens.probes import shape_of_learning
from tests.numerics import U64, gamma


def _pair_cosines(H: np.ndarray) -> np.ndarray:
    """All n(n − 1) cosines of distinct ordered pairs, by brute force."""
    U = H / np.linalg.norm(H, axis=1, keepdims=True)
    G = U @ U.T
    return G[~np.eye(len(H), dtype=bool)]


def _drifted(n: int, d: int, seed: int, offset: float = 1.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, d)) + offset * rng.standard_normal(d)


# ------------------------------------------------------------------------ cosine anisotropy


@pytest.mark.parametrize("kind", ["numpy64", "numpy32", "torch32"])
def test_cosine_equals_all_pairs_brute_force(kind: str) -> None:
    H = _drifted(250, 16, seed=0)
    expected = _pair_cosines(H).mean()
    X = {"numpy64": H, "numpy32": H.astype(np.float32), "torch32": torch.tensor(H).float()}[kind]
    tol = 1e-13 if kind == "numpy64" else 1e-6
    assert cosine_anisotropy(X) == pytest.approx(expected, abs=tol)


def test_cosine_known_answers() -> None:
    v = np.random.default_rng(1).standard_normal(8)
    assert cosine_anisotropy(np.tile(v, (30, 1))) == pytest.approx(1.0, abs=1e-14)
    assert cosine_anisotropy(np.stack([v, -v])) == pytest.approx(-1.0, abs=1e-14)
    # m antipodal pairs: Σ ûᵢ = 0, so the mean over i ≠ j is −n / (n(n − 1)) = −1/(n − 1).
    V = np.random.default_rng(2).standard_normal((50, 8))
    assert cosine_anisotropy(np.concatenate([V, -V])) == pytest.approx(-1 / 99, abs=1e-14)
    # Scaling rows by positive factors changes nothing.
    H = _drifted(40, 5, seed=3)
    scaled = H * np.random.default_rng(4).uniform(0.1, 10, (40, 1))
    assert cosine_anisotropy(scaled) == pytest.approx(cosine_anisotropy(H), abs=1e-14)


def test_cosine_of_isotropic_gaussian_is_zero_within_derived_bound() -> None:
    # Unit vectors uniform on the sphere: E[ûᵢ·ûⱼ] = 0, Var = 1/d, and distinct pair products are
    # uncorrelated, so Var(Σ_{i≠j} ûᵢ·ûⱼ) = 2n(n − 1)/d and sd(mean) = √(2 / (d n (n − 1))).
    n, d = 2000, 64
    sd = math.sqrt(2 / (d * n * (n - 1)))
    H = torch.randn(n, d, generator=torch.Generator().manual_seed(0))
    assert abs(cosine_anisotropy(H)) < 5 * sd
    # …and a common offset is detected far outside that bound.
    assert cosine_anisotropy(H + 0.5) > 100 * sd


def test_sampled_agrees_with_exact_within_standard_errors() -> None:
    H = _drifted(400, 8, seed=5, offset=0.7)
    cos = _pair_cosines(H)
    exact = cosine_anisotropy(H)
    assert exact == pytest.approx(cos.mean(), abs=1e-13)
    n_pairs = 20000
    se = cos.std() / math.sqrt(n_pairs)
    estimates = [cosine_anisotropy_sampled(H, n_pairs, seed) for seed in range(3)]
    for est in estimates:
        assert abs(est - exact) < 4 * se
    assert len(set(estimates)) == 3  # seeds matter…
    assert cosine_anisotropy_sampled(H, n_pairs, 1) == estimates[1]  # …and reproduce


def test_sampled_pairs_are_distinct() -> None:
    v = np.array([1.0, 2.0, 3.0])
    # With i = j allowed, some pairs would score +1; distinct pairs of {v, −v} are all −1.
    assert cosine_anisotropy_sampled(np.stack([v, -v]), 500, 0) == -1.0


def test_cosine_from_streaming_sums_equals_direct() -> None:
    H = _drifted(1000, 12, seed=6)
    total = sum(unit_row_sum(chunk) for chunk in np.array_split(H, 7))
    assert cosine_anisotropy_from_sums(total, 1000) == pytest.approx(
        cosine_anisotropy(H), abs=1e-14
    )


def test_cosine_validation() -> None:
    with pytest.raises(ValueError, match="zero rows"):
        cosine_anisotropy(np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]]))
    with pytest.raises(ValueError, match="zero rows"):
        cosine_anisotropy_sampled(np.array([[1.0, 0.0], [0.0, 0.0]]), 10, 0)
    with pytest.raises(ValueError, match="NaN or inf"):
        cosine_anisotropy(np.array([[1.0, np.inf], [1.0, 2.0]]))
    with pytest.raises(ValueError, match="2-D"):
        cosine_anisotropy(np.ones(5))
    with pytest.raises(ValueError, match="at least 2 rows"):
        cosine_anisotropy(np.ones((1, 5)))
    with pytest.raises(ValueError, match="n must be an integer ≥ 2"):
        cosine_anisotropy_from_sums(np.ones(3), 1)
    with pytest.raises(ValueError, match="exceeds n²"):
        cosine_anisotropy_from_sums(np.array([3.0, 0.0]), 2)
    with pytest.raises(ValueError, match="n_pairs"):
        cosine_anisotropy_sampled(np.eye(3), 0, 0)
    with pytest.raises(ValueError, match="real-valued"):
        cosine_anisotropy(torch.ones(3, 3, dtype=torch.bool))


# ----------------------------------------------------------------------------------- drift


def test_drift_against_numpy_and_known_answers() -> None:
    H = _drifted(300, 10, seed=7, offset=2.0)
    (n, d), mean = H.shape, H.mean(axis=0)
    # both sides sum the same n rows in other orders (numpy, torch's chunks): each column within
    # γ_n Σ|h| of the exact sum, the norms of d entries within γ_{d+2} (Higham)
    rounding = gamma(n + 2, U64) * np.abs(H).sum(axis=0) / n
    drift_tol = 2 * (np.linalg.norm(rounding) + gamma(d + 2, U64) * np.linalg.norm(mean))
    assert drift_norm(H) == pytest.approx(np.linalg.norm(mean), abs=drift_tol)
    expected = np.linalg.norm(mean) / np.linalg.norm(H, axis=1).mean()
    ratio_tol = drift_tol / np.linalg.norm(mean) + 2 * gamma(n + d + 3, U64)
    assert relative_drift(H) == pytest.approx(expected, rel=ratio_tol)
    v = np.array([3.0, 4.0])
    assert drift_norm(np.tile(v, (5, 1))) == pytest.approx(5.0)
    assert relative_drift(np.tile(v, (5, 1))) == pytest.approx(1.0)
    V = np.random.default_rng(8).standard_normal((20, 4))
    assert relative_drift(np.concatenate([V, -V])) == pytest.approx(0.0, abs=1e-15)


def test_drift_from_sums_equals_direct() -> None:
    H = torch.tensor(_drifted(500, 6, seed=9)).float()
    s = H.double().sum(0)
    norms = float(torch.linalg.vector_norm(H.double(), dim=1).sum())
    assert drift_norm_from_sums(s, norms, 500) == pytest.approx(drift_norm(H), rel=1e-12)
    assert drift_norm_from_sums(s, None, 500) == pytest.approx(drift_norm(H), rel=1e-12)
    assert relative_drift_from_sums(s, norms, 500) == pytest.approx(relative_drift(H), rel=1e-12)


def test_drift_validation() -> None:
    with pytest.raises(ValueError, match="all rows are zero"):
        relative_drift(np.zeros((4, 3)))
    with pytest.raises(ValueError, match="sum_norms"):
        relative_drift_from_sums(np.ones(3), -1.0, 4)
    with pytest.raises(ValueError, match="n must be"):
        drift_norm_from_sums(np.ones(3), None, 0)


# ----------------------------------------------------------------------------- correlations


def test_correlations_equal_scipy_with_ties() -> None:
    rng = np.random.default_rng(10)
    x = rng.integers(0, 6, 80).astype(float)  # many ties
    y = 0.5 * x + rng.normal(0, 1, 80).round(1)
    c = correlations(x, y)
    assert isinstance(c, Correlation) and c.n == 80
    assert c.pearson == pytest.approx(stats.pearsonr(x, y).statistic, abs=1e-14)
    assert c.spearman == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-14)


def test_correlations_known_answers() -> None:
    # x = 1, 2, 3 and y = 1, 3, 2 (already ranks): deviations dx = (−1, 0, 1), dy = (−1, 1, 0),
    # Σ dx·dy = 1, Σ dx² = Σ dy² = 2 → Pearson = Spearman = 1/2.
    c = correlations(torch.tensor([1, 2, 3]), np.array([1.0, 3.0, 2.0]))
    assert (c.pearson, c.spearman) == pytest.approx((0.5, 0.5), abs=1e-15)
    x = np.linspace(0.1, 3, 30)
    c = correlations(x, x**3)
    assert c.spearman == pytest.approx(1.0, abs=1e-15) and c.pearson < 0.95
    assert correlations(x, -np.exp(x)).spearman == pytest.approx(-1.0, abs=1e-15)


def test_correlations_validation() -> None:
    with pytest.raises(ValueError, match="same length"):
        correlations(np.arange(4.0), np.arange(5.0))
    with pytest.raises(ValueError, match="constant"):
        correlations(np.ones(5), np.arange(5.0))
    with pytest.raises(ValueError, match="at least 2"):
        correlations(np.ones(1), np.ones(1))


# ----------------------------------------------------------------------- centred anisotropy


def _numpy_share(H: np.ndarray, power: int = 1) -> float:
    s = np.linalg.svd(H - H.mean(axis=0), compute_uv=False)
    return float(s[0] ** power / (s**power).sum())


def _planted(n: int, singular_values: np.ndarray, seed: int, offset: float = 5.0) -> np.ndarray:
    """Rows whose centred matrix has exactly the given singular values (orthonormal design)."""
    rng = np.random.default_rng(seed)
    d = len(singular_values)
    A = rng.standard_normal((n, d))
    U = np.linalg.qr(A - A.mean(axis=0))[0]  # orthonormal columns, each orthogonal to 1
    V = np.linalg.qr(rng.standard_normal((d, d)))[0]
    return U @ np.diag(singular_values) @ V.T + offset * rng.standard_normal(d)


@pytest.mark.parametrize(("n", "d"), [(400, 12), (10, 30)])
def test_centred_anisotropy_equals_numpy_svd(n: int, d: int) -> None:
    H = _drifted(n, d, seed=11) * np.linspace(3, 0.2, d)
    assert centred_anisotropy(H) == pytest.approx(_numpy_share(H, power=2), rel=1e-12)
    as_float = torch.tensor(H).float()
    assert centred_anisotropy(as_float) == pytest.approx(_numpy_share(H, power=2), rel=1e-5)
    assert centred_singular_anisotropy(H) == pytest.approx(_numpy_share(H), rel=1e-10)
    assert centred_singular_anisotropy(as_float) == pytest.approx(_numpy_share(H), rel=1e-5)


def test_centred_anisotropy_planted_spectra() -> None:
    d = 10
    s = np.ones(d)
    s[0] = 3.0  # singular values (3, 1 × 9): σ₁²/Σσ² = 9/18, σ₁/Σσ = 3/12
    planted = _planted(200, s, seed=12)
    assert centred_anisotropy(planted) == pytest.approx(0.5, rel=1e-12)
    assert centred_singular_anisotropy(planted) == pytest.approx(0.25, rel=1e-10)
    isotropic = _planted(200, np.ones(d), seed=13)
    assert centred_anisotropy(isotropic) == pytest.approx(1 / d, rel=1e-10)
    assert centred_singular_anisotropy(isotropic) == pytest.approx(1 / d, rel=1e-10)
    line = np.outer(np.random.default_rng(14).standard_normal(50), np.arange(1.0, 6.0)) + 7.0
    assert centred_anisotropy(line) == pytest.approx(1.0, rel=1e-12)
    assert centred_singular_anisotropy(line) == pytest.approx(1.0, rel=1e-12)


@pytest.mark.parametrize(("offset", "rel"), [(0.0, 1e-13), (1e2, 1e-10), (1e3, 1e-7)])
def test_centred_anisotropy_from_moments_equals_direct(offset: float, rel: float) -> None:
    # Uncentred moments cancel: the documented error is ~10 ε ‖mean‖² / tr(cov) — about 3e-11 at
    # offset 1e2 (‖mean‖²/tr ≈ 1.4e4) and 3e-9 at 1e3 (≈ 1.4e6).
    H = _drifted(3000, 16, seed=15, offset=offset) * np.linspace(2, 0.5, 16)
    sums, second = np.zeros(16), np.zeros((16, 16))
    for chunk in np.array_split(H, 5):
        sums += chunk.sum(axis=0)
        second += chunk.T @ chunk
    direct = centred_anisotropy(H)
    assert direct == pytest.approx(_numpy_share(H, power=2), rel=1e-12)
    streamed = centred_anisotropy_from_moments(3000, sums, second)
    assert streamed == pytest.approx(direct, rel=rel)
    singular = centred_singular_anisotropy_from_moments(3000, sums, second)
    assert singular == pytest.approx(centred_singular_anisotropy(H), rel=max(rel, 1e-10))


def _llm_microscope_functions():
    """``llm_microscope/functions.py`` loaded by path: the package's ``__init__`` does
    ``from logit_lens import *`` (an absolute import of its own module) and fails."""
    try:
        files = importlib.metadata.files("llm-microscope") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(
            "llm-microscope is not installed (make setup installs it: "
            "pip install --no-deps 'llm-microscope==0.0.7'); it is the reference for "
            "centred_anisotropy"
        )
    (path,) = [f for f in files if str(f).replace("\\", "/") == "llm_microscope/functions.py"]
    spec = importlib.util.spec_from_file_location("llm_microscope_functions", path.locate())
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imports torch, urllib and matplotlib.pyplot (a dependency)
    return module


@pytest.mark.parametrize(("n", "d", "seed"), [(500, 24, 21), (40, 64, 22)])
def test_centred_anisotropy_equals_llm_microscope(n: int, d: int, seed: int) -> None:
    """The authors' own code (Razzhigaev et al.; llm-microscope 0.0.7) is the definition."""
    reference = _llm_microscope_functions().calculate_anisotropy_torch
    H = _drifted(n, d, seed=seed, offset=3.0) * np.geomspace(4, 0.1, d)
    expected = reference(torch.tensor(H))  # float64 SVD of the centred rows
    assert centred_anisotropy(H) == pytest.approx(expected, rel=1e-12)
    sums, second = H.sum(axis=0), H.T @ H
    assert centred_anisotropy_from_moments(n, sums, second) == pytest.approx(expected, rel=1e-10)
    # the paper text's σ₁/Σσ is another number (and has another name)
    assert abs(centred_singular_anisotropy(H) - expected) > 0.05


def _shape_step(H: np.ndarray) -> Capture:
    acc = MomentAccumulator(H.shape[1])
    acc.update(torch.tensor(H))
    site = SimpleNamespace(h=acc, reservoir=None)
    statistics = SimpleNamespace(sites={"blocks.0.hook_resid_post": site})
    return Capture("planted", 7, 0, statistics, {"blocks.0.hook_resid_post": 0}, seq_len=8)


def test_shape_of_learning_rows_report_the_variance_share_under_centred_anisotropy() -> None:
    s = np.ones(10)
    s[0] = 3.0  # σ₁²/Σσ² = 0.5, σ₁/Σσ = 0.25
    data = _shape_step(_planted(300, s, seed=23, offset=40.0))
    plain = shape_of_learning.rows(data, shape_of_learning.ShapeOfLearningConfig())
    got = {r["metric"]: r["value"] for r in plain}
    assert got["centred_anisotropy"] == pytest.approx(0.5, rel=1e-9)
    assert "centred_singular_anisotropy" not in got
    both = shape_of_learning.rows(
        data, shape_of_learning.ShapeOfLearningConfig(singular_anisotropy=True)
    )
    got = {r["metric"]: r["value"] for r in both}
    assert got["centred_anisotropy"] == pytest.approx(0.5, rel=1e-9)
    assert got["centred_singular_anisotropy"] == pytest.approx(0.25, rel=1e-9)
    assert {r["n_tokens"] for r in both} == {300} and {r["layer"] for r in both} == {0}
    with pytest.raises(ValueError, match="singular_anisotropy must be true or false"):
        shape_of_learning.ShapeOfLearningConfig(singular_anisotropy="singular")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="spectrum"):
        shape_of_learning.ShapeOfLearningConfig(spectrum="singular")  # type: ignore[call-arg]


def test_covariance_equals_numpy() -> None:
    H = _drifted(100, 7, seed=16, offset=50.0)
    np.testing.assert_allclose(covariance(H).numpy(), np.cov(H.T), rtol=1e-12)
    np.testing.assert_allclose(covariance(H, ddof=0).numpy(), np.cov(H.T, ddof=0), rtol=1e-12)


def test_centred_anisotropy_validation() -> None:
    with pytest.raises(ValueError, match="zero variance"):
        centred_anisotropy(np.ones((5, 3)))
    with pytest.raises(ValueError, match="at least 2 rows"):
        centred_anisotropy(np.ones((1, 3)))
    with pytest.raises(ValueError, match="must be 3 × 3"):
        centred_anisotropy_from_moments(4, np.ones(3), np.eye(4))
    with pytest.raises(ValueError, match="NaN"):
        centred_anisotropy_from_moments(4, np.array([1.0, np.nan, 0.0]), np.eye(3))
    with pytest.raises(ValueError, match="ddof"):
        covariance(np.ones((2, 3)), ddof=2)
    with pytest.raises(ValueError, match="zero variance"):
        centred_singular_anisotropy_from_moments(2, np.full(3, 2.0), np.full((3, 3), 2.0))


def test_accepts_read_only_and_non_native_arrays_without_copying_semantics() -> None:
    H = _drifted(30, 4, seed=17)
    frozen = H.copy()
    frozen.flags.writeable = False
    expected = cosine_anisotropy(H)
    assert cosine_anisotropy(frozen) == expected
    assert cosine_anisotropy(H.astype(">f8")) == expected
    with pytest.raises(ValueError, match="numeric array"):
        drift_norm(np.array([["a", "b"]]))
