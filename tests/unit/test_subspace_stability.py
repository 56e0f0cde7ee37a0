"""Subspace-stability rows on bases with known principal angles."""

import math

import pytest
import torch

from tangentlens.probes import subspace_stability
from tangentlens.results import StepLabel


def _rotated(theta: float) -> torch.Tensor:
    """Span of e0 and (cos θ e1 + sin θ e2) in 4-d."""
    e = torch.eye(4, dtype=torch.float64)
    return torch.stack([e[0], math.cos(theta) * e[1] + math.sin(theta) * e[2]], dim=1)


def test_angles_between_methods_steps_and_seeds():
    data = StepLabel("s", 10, 0, layers={"site": 2})
    q = _rotated(0.0)
    proxies = {"site": {"pca": q, "seminmf": _rotated(math.radians(30))}}
    previous = {"site": {"pca": _rotated(math.radians(10)), "seminmf": _rotated(math.radians(30))}}
    reseeded = {"site": {"seminmf": {0: q, 1: _rotated(math.radians(45))}}}
    config = subspace_stability.SubspaceStabilityConfig(seeds=2)
    rows = subspace_stability.rows(data, proxies, reseeded, config)
    rows += subspace_stability.transition_rows(data, proxies, previous)
    got = {(r["method"], r["metric"]): r["value"] for r in rows}
    assert got[("pca~seminmf", "principal_angle_max")] == pytest.approx(30)
    assert got[("pca~seminmf", "principal_angle_mean")] == pytest.approx(15)
    assert got[("pca@prev", "principal_angle_max")] == pytest.approx(10)
    assert got[("seminmf@prev", "principal_angle_max")] == pytest.approx(0, abs=1e-6)
    assert got[("seminmf~seed1", "principal_angle_max")] == pytest.approx(45)
    assert all(r["layer"] == 2 for r in rows)
    with pytest.raises(ValueError, match="seeds"):
        subspace_stability.SubspaceStabilityConfig(seeds=0)


def test_frozen_early_compares_each_refit_with_the_frozen_proxy():
    data = StepLabel("s", 10, 0, layers={"site": 2})
    frozen = {"site": {"pca": _rotated(0.0)}}
    refit = {"site": {"pca": _rotated(math.radians(20))}}
    config = subspace_stability.SubspaceStabilityConfig()
    rows = subspace_stability.rows(data, refit, {}, config, frozen=frozen)
    got = {(r["method"], r["metric"]): r["value"] for r in rows}
    assert got[("pca@frozen", "principal_angle_max")] == pytest.approx(20)
    assert got[("pca@frozen", "principal_angle_mean")] == pytest.approx(10)
    assert subspace_stability.rows(data, refit, {}, config) == []  # no frozen, no @frozen


def test_every_angle_has_its_random_subspace_baseline_beside_it():
    """issue 33, item 5: an angle between proxies is read against two random subspaces of the
    same ranks in ℝ^d, which are already far apart, not against 90°."""
    from tangentlens.metrics import random_principal_angles

    data = StepLabel("s", 10, 0, layers={"site": 2})
    proxies = {"site": {"pca": _rotated(0.0), "seminmf": _rotated(math.radians(30))}}
    rows = subspace_stability.rows(data, proxies, {}, subspace_stability.SubspaceStabilityConfig())
    got = {(r["method"], r["metric"]): r["value"] for r in rows}
    mean, largest = random_principal_angles(4, 2, 2)
    assert got[("pca~seminmf", "principal_angle_mean_random")] == mean
    assert got[("pca~seminmf", "principal_angle_max_random")] == largest
    assert [r["metric"] for r in rows] == [
        "principal_angle_mean",
        "principal_angle_mean_random",
        "principal_angle_max",
        "principal_angle_max_random",
    ]


def test_the_random_baseline_against_scipy_and_closed_forms():
    """Reference: the same seeded draws through scipy's ``subspace_angles``. Closed forms: two
    random lines in the plane meet at a uniform angle (mean 45°); in ℝ³ ``|cos θ|`` is uniform
    (mean arccos = 1 rad = 57.30°). Null: an independent random pair reads near the baseline;
    planted: subspaces 10° apart read far below it."""
    from scipy.linalg import subspace_angles

    from tangentlens.metrics import principal_angles, random_principal_angles
    from tangentlens.seeding import seeded_generator

    generator = seeded_generator(0, 32, 8, 3)  # (seed, d, larger rank, smaller rank)
    a = torch.linalg.qr(torch.randn(50, 32, 8, generator=generator, dtype=torch.float64))[0]
    b = torch.linalg.qr(torch.randn(50, 32, 3, generator=generator, dtype=torch.float64))[0]
    degrees = [
        subspace_angles(x.numpy(), y.numpy()) * 180 / math.pi for x, y in zip(a, b, strict=True)
    ]
    mean, largest = random_principal_angles(32, 8, 3, pairs=50)
    assert mean == pytest.approx(sum(x.mean() for x in degrees) / 50, rel=1e-10)
    assert largest == pytest.approx(sum(x.max() for x in degrees) / 50, rel=1e-10)
    assert random_principal_angles(32, 3, 8, pairs=50) == (mean, largest)  # order-free
    assert random_principal_angles(2, 1, 1, pairs=20_000)[0] == pytest.approx(45.0, abs=0.5)
    assert random_principal_angles(3, 1, 1, pairs=20_000)[0] == pytest.approx(57.30, abs=0.5)
    gen = torch.Generator().manual_seed(1)
    x, y = (torch.linalg.qr(torch.randn(64, 16, generator=gen, dtype=torch.float64))[0]
            for _ in range(2))  # fmt: skip
    baseline = random_principal_angles(64, 16, 16)[0]
    assert float(principal_angles(x, y).mean()) * 180 / math.pi == pytest.approx(baseline, abs=3)
    planted = float(principal_angles(_rotated(0.0), _rotated(math.radians(10))).mean())
    assert planted * 180 / math.pi == pytest.approx(5.0)  # far below the baseline of 2 in ℝ⁴
    assert random_principal_angles(4, 2, 2)[0] > 35
    with pytest.raises(ValueError, match="subspace dimensions must be ≤ d = 4"):
        random_principal_angles(4, 5, 1)


def _nonnegative_mixture(n: int = 400, d: int = 12, k: int = 3, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    codes = torch.rand(n, k, generator=gen, dtype=torch.float64)
    directions = torch.randn(k, d, generator=gen, dtype=torch.float64)
    return codes @ directions + 0.05 * torch.randn(n, d, generator=gen, dtype=torch.float64)


def test_seminmf_is_exactly_scale_equivariant_so_the_floor_is_rounding_alone():
    """The floor compares fits of H and of c·H: with c a power of two every operation of the fit
    scales exactly (no rounding differs), so the directions are bit for bit c times the others —
    what makes the angles at c = 1 + 2⁻²⁰ rounding alone, not a different problem."""
    from tangentlens.dictionaries import ROUNDING_SCALE, SemiNMF, rounding_angles

    H = _nonnegative_mixture()
    one = SemiNMF(3, seed=1).fit(H)
    two = SemiNMF(3, seed=1).fit(H * 4)
    assert one.n_iter_ == two.n_iter_
    assert torch.equal(two.components_, 4 * one.components_)
    assert float(rounding_angles(H, 3, seed=1, scale=4.0).max()) < 1e-6  # degrees
    floor = rounding_angles(H, 3, seed=1)  # eight ulps: the fit moves, a little
    assert floor.shape == (3,) and bool(((floor >= 0) & (floor <= 90)).all())
    assert ROUNDING_SCALE == 1 + 2**-20


def test_angles_that_involve_a_semi_nmf_fit_carry_its_rounding_floor():
    """``principal_angle_max_floor``: the sum of the compared fits' floors (PCA's 0), the frozen
    fit counting this step's refit only, the previous step's added for ``@prev``; none for
    PCA-only pairs and for seeds (their other fits have no floor measured)."""
    data = StepLabel("s", 10, 0, layers={"site": 2})
    proxies = {"site": {"pca": _rotated(0.0), "seminmf": _rotated(math.radians(30))}}
    frozen = {"site": {"pca": _rotated(0.0), "seminmf": _rotated(0.0)}}
    reseeded = {"site": {"seminmf": {0: _rotated(0.0), 1: _rotated(math.radians(45))}}}
    floors = {"site": {"seminmf": 1.5}}
    config = subspace_stability.SubspaceStabilityConfig(seeds=2)
    rows = subspace_stability.rows(data, proxies, reseeded, config, frozen, floors)
    rows += subspace_stability.transition_rows(
        data, proxies, frozen, floors, {"site": {"seminmf": 0.25}}
    )
    got = {(r["method"], r["metric"]): r["value"] for r in rows}
    floor = "principal_angle_max_floor"
    assert got[("pca~seminmf", floor)] == 1.5
    assert got[("seminmf@frozen", floor)] == 1.5
    assert got[("seminmf@prev", floor)] == 1.75
    assert {m for m, metric in got if metric == floor} == {
        "pca~seminmf",
        "seminmf@frozen",
        "seminmf@prev",
    }
    plain = subspace_stability.rows(data, proxies, reseeded, config, frozen)
    assert floor not in {r["metric"] for r in plain}  # no floors measured: no floor rows


def test_a_steps_semi_nmf_refit_reports_its_rounding_floor():
    """``rounding_floors`` fits the stage's semi-NMF on the site's centred sampled rows and on
    the same rows scaled: its angles are those of ``rounding_angles`` on those rows."""
    from types import SimpleNamespace

    from tangentlens.capture import MomentAccumulator
    from tangentlens.dictionaries import rounding_angles

    H = _nonnegative_mixture(seed=2) + 3.0  # a mean the stage centres away
    moments = MomentAccumulator(H.shape[1])
    moments.update(H)
    site = SimpleNamespace(h=moments, reservoir=_Reservoir(H.float()))
    stage = SimpleNamespace(methods=("pca", "seminmf"), rank=3, seed=0, seminmf_max_iter=500,
                            centre=True)  # fmt: skip
    floors = subspace_stability.rounding_floors(SimpleNamespace(sites={"b.0": site}), stage)
    centred = H.float().double() - H.mean(0)
    assert torch.equal(floors["b.0"]["seminmf"], rounding_angles(centred, 3, seed=0))
    data = StepLabel("s", 10, 0, layers={"b.0": 0})
    rows = subspace_stability.floor_rows(data, floors)
    got = {r["metric"]: r["value"] for r in rows}
    assert got == {
        "rounding_angle_mean": float(floors["b.0"]["seminmf"].mean()),
        "rounding_angle_max": float(floors["b.0"]["seminmf"].max()),
    }
    pca_only = SimpleNamespace(**{**vars(stage), "methods": ("pca",)})
    assert subspace_stability.rounding_floors(SimpleNamespace(sites={"b.0": site}), pca_only) == {}


class _Reservoir:
    """A reservoir stand-in: its sampled activation rows and their count."""

    def __init__(self, H: torch.Tensor) -> None:
        self.H = H

    def columns(self) -> dict[str, torch.Tensor]:
        return {"H": self.H}

    def __len__(self) -> int:
        return len(self.H)


def test_the_rounding_floor_can_be_left_out_and_is_a_flag():
    assert subspace_stability.SubspaceStabilityConfig().rounding_floor is True
    with pytest.raises(ValueError, match="rounding_floor must be true or false"):
        subspace_stability.SubspaceStabilityConfig(rounding_floor=1)


def test_a_run_from_before_the_rounding_floor_keeps_its_recipe_table():
    """The floor's key is in the recipe table only when false: a run recorded before it (whose
    table has no such key) resumes; the table reads back to the same config."""
    from tangentlens.checks import build_section

    config = subspace_stability.SubspaceStabilityConfig
    assert config(seeds=2).to_table() == {"seeds": 2}
    off = config(rounding_floor=False)
    assert off.to_table() == {"seeds": 1, "rounding_floor": False}
    for value in (config(seeds=2), off):
        assert build_section(config, value.to_table(), "probes.subspace_stability") == value


def test_a_seed_whose_fit_collapsed_is_left_out_of_the_seed_comparisons(monkeypatch):
    """A refit that collapsed and was fitted again from another seed is not that seed's (left
    out); one that collapsed from every seed is left out too; without the recipe's own seed
    there is nothing to compare."""
    from types import SimpleNamespace

    import tangentlens.proxies as proxies
    from tangentlens.proxies import FittedProxies

    def fit(site_stats, config):
        if config.seed == site_stats.refused:
            raise ValueError("the semi-NMF directions span only 3 of 4 dimensions")
        restarted = {"seminmf_restarts": 1.0} if config.seed == site_stats.restarted else {}
        return FittedProxies({"seminmf": _rotated(config.seed / 10)}, {"seminmf": restarted})

    monkeypatch.setattr(proxies, "fit_proxies", fit)
    stage = SimpleNamespace(
        methods=("pca", "seminmf"), seed=3, proxy_config=lambda: proxies.ProxyConfig()
    )
    sites = {
        "a": SimpleNamespace(refused=None, restarted=4),
        "b": SimpleNamespace(refused=5, restarted=None),
        "c": SimpleNamespace(refused=3, restarted=None),
    }
    got = subspace_stability.reseeded_proxies(SimpleNamespace(sites=sites), stage, 3)
    assert {s: {m: sorted(by) for m, by in ms.items()} for s, ms in got.items()} == {
        "a": {"seminmf": [3, 5]},
        "b": {"seminmf": [3, 4]},
        "c": {},
    }


def test_a_collapsed_fit_has_no_rounding_floor(monkeypatch):
    from types import SimpleNamespace

    from tangentlens import dictionaries

    def collapsed(*args, **kwargs):
        raise ValueError("the semi-NMF directions span only 2 of 3 dimensions")

    monkeypatch.setattr(dictionaries, "rounding_angles", collapsed)
    H = _nonnegative_mixture()
    moments = SimpleNamespace(sum=H.sum(0), count=len(H))
    site = SimpleNamespace(h=moments, reservoir=_Reservoir(H))
    stage = SimpleNamespace(methods=("seminmf",), rank=3, seed=0, seminmf_max_iter=50, centre=True)
    assert subspace_stability.rounding_floors(SimpleNamespace(sites={"b.0": site}), stage) == {}
