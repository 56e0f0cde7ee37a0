"""Cost of the matched-rank controls against the capture they analyse.

Ours: for every captured site and every frequency bin ("all" + 5 bins), both control families
of a rank-k proxy with the mean direction m̂ projected out — 100 exchangeable Haar frames in
span(m̂)⊥ and 100 complement frames in span(T, m̂)⊥, each seeded from (seed, step, layer, bin,
draw) — scored from the accumulated d × d gradient moment with :func:`compare_energy`.
Reference: the capture itself
— :func:`capture_statistics` of every residual site with per-bin moments over the token budget
(mini-pythia shape, 2¹⁷ tokens as in a quickstart-sized run). Goal: controls ≤ 5 % of capture.
Both rows report the mean control energy and its closed form as a check.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from benchmarks.bench_capture import SHAPES, SPECIAL, _model, _zipf_tokens
from tangentlens.capture import CaptureConfig, StatisticsConfig, capture_statistics
from tangentlens.data import FrequencyBins
from tangentlens.dictionaries import PCA
from tangentlens.metrics import compare_energy, control_frames, exclusion_basis

DRAWS = 100


def bench_controls(n_batches: int, rank: int) -> dict[str, Any]:
    shape = SHAPES["mini-pythia"]
    model = _model(shape)
    batches = [_zipf_tokens(shape, seed=i) for i in range(n_batches)]
    counts = np.bincount(torch.cat(batches).flatten().numpy(), minlength=shape["d_vocab"])
    bins = FrequencyBins.from_counts(counts, 5)
    layers = range(shape["n_layers"])
    sites = ("hook_embed", *(f"blocks.{layer}.hook_resid_post" for layer in layers))
    config = CaptureConfig(sites=sites)
    statistics = StatisticsConfig(n_bins=5, reservoir_size=0)
    start = time.perf_counter()
    stats = capture_statistics(model, batches, config, SPECIAL, statistics, bins=bins)
    capture_s = time.perf_counter() - start

    start = time.perf_counter()
    gaps = []
    d = shape["d_model"]
    for layer, site in enumerate(sites):
        s = stats.sites[site]
        m = (s.h.sum / s.h.sum.norm())[:, None].double()
        pca = PCA.from_moments(rank, s.h.count, s.h.sum, s.h.second_moment).basis()
        proxy = torch.linalg.qr(pca - m @ (m.T @ pca))[0]  # m̂ projected out, as the probe's
        families = (m, exclusion_basis(proxy, m))
        for b, moment in enumerate([s.g.second_moment] + [g.second_moment for g in s.g_bins]):
            for excluded in families:
                frames = control_frames(d, rank, DRAWS, (0, 0, layer, b), excluded=excluded)
                result = compare_energy(moment, proxy, frames, excluded)
                gaps.append(abs(result.control_mean - result.null_mean) / result.null_mean)
    controls_s = time.perf_counter() - start
    n_tokens = n_batches * shape["batch"][0] * shape["batch"][1]
    return {
        "benchmark": f"2 × {DRAWS} controls × {len(sites)} sites × 6 bins",
        "shape": f"mini-pythia, {n_tokens} tokens, k={rank}",
        "reference_name": "capture (fwd+bwd+moments)",
        "ours_s": controls_s,
        "reference_s": capture_s,
        "ours": float(np.mean(gaps)),
        "reference": 0.0,
        "difference": float(np.mean(gaps)),
        "difference_kind": "relative",
        "goal": "≤ 5 % of capture; ours = |sampled − closed-form null| / null",
    }


def run(quick: bool = False) -> list[dict[str, Any]]:
    """The controls-vs-capture row (quick: 8 batches instead of 64)."""
    return [bench_controls(8 if quick else 64, rank=16)]
