"""Sweep throughput with every probe on, against a plain training forward+backward.

Ours: one step of the quickstart recipe (every per-step probe; the untrained block, which reads
no checkpoint, left out) run by :func:`run_sweep` into a temporary directory — data preparation,
capture, proxy fitting, controls, bootstrap, TwoNN, curvature and the parquet write included.
Reference: training forward+backward passes of the same model over the same token rows. Needs
the mini-pythia suite (trained into the cache on first use, ~4 min). The ratio is recorded, no
goal is set.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from typing import Any

import torch

from benchmarks.bench_capture import _training_step
from tangentlens.models.suites import ensure_mini_suite
from tangentlens.sweep.data import prepare_analysis_data
from tangentlens.sweep.recipe import load_recipe
from tangentlens.sweep.runner import run_sweep


def run(quick: bool = False) -> list[dict[str, Any]]:
    budget = 8192 if quick else 32768
    suite = ensure_mini_suite("mini-pythia")
    recipe = load_recipe("quickstart", ["suite.steps=last", f"data.max_tokens={budget}"])
    probes = {k: v for k, v in recipe.probes.items() if k != "untrained_block"}
    recipe = dataclasses.replace(recipe, probes=probes)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        run_sweep(recipe, f"{tmp}/run")
        ours_s = time.perf_counter() - start
    model = suite.load(suite.steps[-1])
    rows = torch.from_numpy(prepare_analysis_data(suite, recipe).rows)
    start = time.perf_counter()
    loss = sum(_training_step(model, batch) for batch in rows.split(recipe.data.batch_size))
    ref_s = time.perf_counter() - start
    return [
        {
            "benchmark": f"sweep step, {len(probes)} probes",
            "shape": f"mini-pythia, {rows.numel()} tokens",
            "reference_name": "training fwd+bwd",
            "ours_s": ours_s,
            "reference_s": ref_s,
            "ours": ours_s / ref_s,
            "reference": 1.0,
            "difference": ours_s / ref_s,
            "difference_kind": "relative",
            "goal": f"recorded (train loss sum {loss:.0f})",
        }
    ]
