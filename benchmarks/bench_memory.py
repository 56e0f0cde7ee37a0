"""Memory stays flat in the number of tokens: peak RSS of a capture stream at 10× the token
budget against 1× (goal ≤ 1.2×).

Each budget runs in a fresh subprocess (peak RSS is per process): a mini-pythia-shaped decoder
(random weights) captures every residual site with gradients, 5 frequency-bin moments, per-type
sums and a 4096-row reservoir — what the quickstart recipe keeps — over batches generated
lazily, so only the accumulators could grow.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

BASE_BATCHES = {"full": 16, "quick": 4}  # 16 × 16 × 128 = 32768 tokens at 1×

_CHILD = """
import json, resource, sys
import numpy as np, torch
from benchmarks.bench_capture import SHAPES, SPECIAL, _model, _zipf_tokens
from tangentlens.capture import CaptureConfig, StatisticsConfig, capture_statistics
from tangentlens.data import FrequencyBins

n_batches = int(sys.argv[1])
shape = SHAPES["mini-pythia"]
model = _model(shape)
counts = np.bincount(_zipf_tokens(shape, seed=0).flatten().numpy(), minlength=shape["d_vocab"])
bins = FrequencyBins.from_counts(counts + 1, 5)
sites = ("hook_embed", *(f"blocks.{l}.hook_resid_post" for l in range(shape["n_layers"])))
stats = capture_statistics(
    model,
    (_zipf_tokens(shape, seed=i) for i in range(n_batches)),
    CaptureConfig(sites=sites),
    SPECIAL,
    StatisticsConfig(n_bins=5, type_sums=True, vocab_size=shape["d_vocab"], reservoir_size=4096),
    bins=bins,
)
peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"tokens": stats.n_positions, "peak_mb": peak_kb / 1024}))
"""


def _peak(n_batches: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(n_batches)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Peak RSS at 10× vs 1× the token budget."""
    base = BASE_BATCHES["quick" if quick else "full"]
    small, large = _peak(base), _peak(10 * base)
    return [
        {
            "benchmark": "peak RSS, 10× tokens vs 1×",
            "shape": f"mini-pythia, {small['tokens']} vs {large['tokens']} tokens",
            "reference_name": "the same capture at 1×",
            "ours_s": large["peak_mb"],
            "reference_s": small["peak_mb"],
            "ours": large["peak_mb"],
            "reference": small["peak_mb"],
            "difference": large["peak_mb"] / small["peak_mb"] - 1,
            "difference_kind": "relative",
            "goal": "≤ 1.2× (the 's' columns hold MB here)",
        }
    ]
