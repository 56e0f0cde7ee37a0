"""Every row of the tangent-energy probe against an independent recomputation (numpy sums of the
drift-regressed gradients ``r = g − b (m̂ᵀg)``, ``b`` the least-squares coefficient of the rows
on their drift coordinate, for every proxy that avoids m̂; the controls re-drawn from their
documented seed keys, the PCA span from an eigen-decomposition):
row labels, both control families, the closed forms, the data-matched frames and the
reservoir-sample intervals, per frequency bin — and the cells the probe must skip (a site without
gradients or proxies, a bin without gradient) without stopping at them."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tangentlens.capture import CaptureConfig, CaptureStatistics, SiteStatistics, StatisticsConfig
from tangentlens.capture.captured import Capture
from tangentlens.metrics import (
    bootstrap_ratio,
    control_frames,
    data_matched_frames,
    exclusion_basis,
)
from tangentlens.probes import tangent_energy

D, K, SEQ_LEN, N_SEQ, STEP, N_BINS = 10, 2, 8, 24, 5, 2
EMBED, BLOCK, SKIPPED, NO_PROXY = "hook_embed", "blocks.2.hook_resid_post", "b.0", "b.1"
LAYERS = {SKIPPED: 0, NO_PROXY: 1, EMBED: None, BLOCK: 2}
CONFIG = tangent_energy.TangentEnergyConfig(bootstrap=50, data_matched_m=7, interval="percentile")
#: The proxies stage's control frames per measurement and their seed.
DRAWS, SEED = 15, 4
HEADLINE = (
    "energy_fraction",
    "energy_control_mean",
    "energy_control_std",
    "energy_control_min",
    "energy_control_max",
    "energy_null_mean",
    "energy_enrichment",
    "energy_enrichment_null",
    "energy_z",
    "energy_p_value",
    "energy_ratio",
    "energy_complement_control_mean",
    "energy_complement_null_mean",
    "energy_complement_ratio",
    "energy_complement_p_value",
)
MATCHED = (
    "data_matched_energy_ratio",
    "data_matched_energy_p_value",
    "data_matched_complement_energy_ratio",
    "data_matched_complement_energy_p_value",
)


def _basis(k: int, seed: int, excluded: torch.Tensor | None = None) -> torch.Tensor:
    g = torch.randn(D, k, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    if excluded is not None:
        g = g - excluded @ (excluded.T @ g)
    return torch.linalg.qr(g)[0]


M_HAT = _basis(1, 1)
PROXIES = {
    "pca": _basis(K, 2, M_HAT),
    "seminmf": _basis(K, 3, M_HAT),
    "mean_direction": M_HAT,
}


def _site_rows(seed: int, scale: float, zero_bin: int | None):
    """Activations, gradients (anisotropic, a share along m̂, ``scale`` small: traces below 1),
    tokens, row ids (whole sequences) and bins (``zero_bin``'s gradients all zero)."""
    gen = torch.Generator().manual_seed(seed)
    n = N_SEQ * SEQ_LEN
    h = torch.randn(n, D, generator=gen, dtype=torch.float64) * torch.linspace(3, 0.5, D)
    g = torch.randn(n, D, generator=gen, dtype=torch.float64) * torch.linspace(0.5, 2, D)
    g = scale * (g + 2.0 * g[:, :1] * PROXIES["pca"][:, 0] + 1.5 * M_HAT[:, 0])
    bins = torch.randint(0, N_BINS, (n,), generator=gen)
    if zero_bin is not None:
        g[bins == zero_bin] = 0.0
    ids = torch.arange(n)
    return h, g, torch.zeros(n, dtype=torch.int64), ids, bins


def _capture() -> tuple[Capture, dict[str, tuple]]:
    statistics = StatisticsConfig(n_bins=N_BINS, reservoir_size=N_SEQ * SEQ_LEN)
    raw = {EMBED: _site_rows(10, 1e-2, None), BLOCK: _site_rows(11, 1.0, 0)}
    sites = {}
    for name in LAYERS:
        if name in raw:
            site = SiteStatistics(D, statistics, site=name)
            site.update(*raw[name])
        else:  # SKIPPED: activations only; NO_PROXY: gradients but no proxy given
            site = SiteStatistics(D, StatisticsConfig(n_bins=N_BINS, gradients=name != SKIPPED))
            rows = _site_rows(12, 1.0, None)
            site.update(*(rows if name != SKIPPED else (rows[0], None, *rows[2:])))
        sites[name] = site
    stats = CaptureStatistics(
        config=CaptureConfig(sites=tuple(LAYERS)), statistics=statistics, sites=sites
    )
    return Capture("planted", STEP, 50, stats, LAYERS, SEQ_LEN), raw


@pytest.fixture
def table():
    data, raw = _capture()
    proxies = {EMBED: PROXIES, BLOCK: PROXIES, SKIPPED: PROXIES}
    rows = tangent_energy.rows(data, proxies, CONFIG, draws=DRAWS, seed=SEED)
    return {(r["site"], r["method"], r["freq_bin"], r["metric"]): r for r in rows}, raw


def _energies(g: np.ndarray, frames: torch.Tensor) -> np.ndarray:
    """``‖G Nⱼ‖² / ‖G‖²`` for every frame, in numpy."""
    f = frames.numpy()
    return np.array([(g @ f[j]) ** 2 for j in range(len(f))]).sum(axis=(1, 2)) / (g**2).sum()


def _pca_span(h: np.ndarray) -> torch.Tensor:
    values, vectors = np.linalg.eigh(np.cov(h.T, bias=True))
    return torch.from_numpy(vectors[:, np.argsort(values)[::-1][: CONFIG.data_matched_m]].copy())


def _expected(site: str, method: str, b: int | None, raw: dict) -> dict[str, tuple]:
    """``metric → (value, ci)`` recomputed from the raw rows."""
    h, g, _, ids, bins = (t.numpy() if torch.is_tensor(t) else t for t in raw[site])
    keep = np.ones(len(g), bool) if b is None else bins == b
    g_b = g[keep]
    proxy = PROXIES[method]
    excluded = None if method == "mean_direction" else M_HAT
    complement = exclusion_basis(proxy, excluded)
    key = (
        SEED,
        STEP,
        0 if LAYERS[site] is None else LAYERS[site] + 1,
        0 if b is None else b + 1,
    )
    energy = float((g_b**2).sum())
    b_coef = np.zeros(D)
    if excluded is not None:  # the rows' least-squares coefficient on their drift coordinate
        drift = g_b @ M_HAT.numpy()[:, 0]
        b_coef = (g_b.T @ drift) / (drift @ drift)
    r_b = g_b - np.outer(g_b @ M_HAT.numpy()[:, 0], b_coef) if excluded is not None else g_b
    e_t = float(((r_b @ proxy.numpy()) ** 2).sum() / energy)
    out: dict[str, tuple] = {
        "energy_fraction": (e_t, None),
        "energy_enrichment": (e_t / (K / D), None),
    }
    if method == "mean_direction":
        out["energy_enrichment"] = (e_t / (1 / D), None)
    k = proxy.shape[1]
    exact = {}  # the families' exact mean projectors k/(d − r)·(I − XXᵀ)
    for infix, x in (("", excluded), ("complement_", complement)):
        frames = control_frames(D, k, DRAWS, key, excluded=x)
        e_n = _energies(r_b, frames) * (r_b**2).sum() / energy
        outside = (r_b**2).sum() - (0.0 if x is None else ((r_b @ x.numpy()) ** 2).sum())
        e_x = 1 - float(outside / energy)
        r = 0 if x is None else x.shape[1]
        null = k / (D - r) * (1 - e_x)
        exact[infix] = k / (D - r) * (np.eye(D) - (0 if x is None else x.numpy() @ x.numpy().T))
        out[f"energy_{infix}control_mean"] = (e_n.mean(), None)
        out[f"energy_{infix}null_mean"] = (null, None)
        out[f"energy_{infix}ratio"] = (e_t / null, None)
        out[f"energy_{infix}p_value"] = ((1 + (e_n >= e_t).sum()) / (1 + DRAWS), None)
        if not infix:
            out["energy_control_std"] = (e_n.std(ddof=1), None)
            out["energy_control_min"] = (e_n.min(), None)
            out["energy_control_max"] = (e_n.max(), None)
            out["energy_z"] = ((e_t - e_n.mean()) / e_n.std(ddof=1), None)
            out["energy_enrichment_null"] = ((1 - e_x) * D / (D - r), None)
        matched = data_matched_frames(_pca_span(h), k, DRAWS, key, excluded=x)
        e_m = _energies(r_b, matched) * (r_b**2).sum() / energy
        out[f"data_matched_{infix}energy_ratio"] = (e_t / e_m.mean(), None)
        out[f"data_matched_{infix}energy_p_value"] = (
            (1 + (e_m >= e_t).sum()) / (1 + DRAWS),
            None,
        )
    # the intervals: per-sequence sums of the reservoir's rows (here every row, kept in
    # float32) — with the families' exact mean projectors, not the frames' — bootstrapped
    sequence = ids[keep] // SEQ_LEN
    g_b = g_b.astype(np.float32).astype(np.float64)
    r_b = g_b - np.outer(g_b @ M_HAT.numpy()[:, 0], b_coef) if excluded is not None else g_b
    sums = [
        np.bincount(sequence, weights=w, minlength=N_SEQ)
        for w in (
            ((r_b @ proxy.numpy()) ** 2).sum(1),
            (g_b**2).sum(1),
            ((r_b @ exact[""]) * r_b).sum(1),
            ((r_b @ exact["complement_"]) * r_b).sum(1),
        )
    ]
    seen = np.bincount(sequence, minlength=N_SEQ) > 0
    inside, total, control, outside = (torch.from_numpy(s[seen]) for s in sums)
    kwargs = {"replicates": CONFIG.bootstrap, "seed": SEED, "method": CONFIG.interval}
    for metric, den, bounds in (
        ("energy_fraction", total, (0.0, 1.0)),
        ("energy_ratio", control, (0.0, math.inf)),
        ("energy_complement_ratio", outside, (0.0, math.inf)),
    ):
        value = out[metric][0]
        interval = bootstrap_ratio(inside, den, centre=value, bounds=bounds, **kwargs)
        out[metric] = (value, (interval.ci_low, interval.ci_high))
    return out  # fmt: skip


def test_every_row_equals_its_independent_recomputation(table):
    """One test over every cell (the rows are computed once per test: a mutation test run
    selects tests by the calls they make)."""
    rows, raw = table
    cells = [
        (name, method, b)
        for name in (EMBED, BLOCK)
        for method in PROXIES
        for b in ([None, 1] if name == BLOCK else [None, 0, 1])  # BLOCK's bin 0: no gradient
    ]
    for site, method, b in cells:
        label = "all" if b is None else str(b)
        expected = _expected(site, method, b, raw)
        assert set(expected) == set(HEADLINE) | set(MATCHED)
        n_tokens = int(((raw[site][4] == b) if b is not None else raw[site][4] >= 0).sum())
        for metric, (value, ci) in expected.items():
            row = rows[(site, method, label, metric)]
            assert row["value"] == pytest.approx(value, rel=1e-9, abs=1e-12), (site, b, metric)
            assert row["probe"] == "tangent_energy" and row["layer"] == LAYERS[site]
            assert row["rank"] == PROXIES[method].shape[1] and row["n_tokens"] == n_tokens
            assert row["step"] == STEP and row["tokens_seen"] == 50
            if ci is None:
                assert row["ci_low"] is None and row["ci_high"] is None, metric
            else:
                assert (row["ci_low"], row["ci_high"]) == pytest.approx(ci, rel=1e-9), metric


def test_cells_without_gradient_or_proxies_are_skipped_not_stopped_at(table):
    rows, _ = table
    # a site without gradients and a site without proxies: no rows, later sites still scored
    assert {key[0] for key in rows} == {EMBED, BLOCK}
    # BLOCK's bin 0 holds only zero gradients: one NaN energy_fraction row, then bin 1 goes on
    empty = [key for key in rows if key[0] == BLOCK and key[2] == "0"]
    assert sorted(empty) == [(BLOCK, m, "0", "energy_fraction") for m in sorted(PROXIES)]
    for key in empty:
        assert math.isnan(rows[key]["value"]) and rows[key]["n_tokens"] > 0
    counts = {}
    for site, method, label, _ in rows:
        counts[(site, method, label)] = counts.get((site, method, label), 0) + 1
    n_metrics = len(HEADLINE) + len(MATCHED)
    assert all(counts[(EMBED, m, b)] == n_metrics for m in PROXIES for b in ("all", "0", "1"))
    assert all(counts[(BLOCK, m, b)] == n_metrics for m in PROXIES for b in ("all", "1"))
