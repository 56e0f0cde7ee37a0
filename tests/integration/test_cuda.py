"""The CUDA path (skipped without a GPU): capture on the GPU equals capture on the CPU, and a
sweep runs with ``suite.device = "cuda"``, within tolerances derived from stated bounds — never
from a difference measured on one machine (another GPU, or another CPU, rounds otherwise).

The bounds (first-order rounding-error propagation, each operation's error carried through
Jacobians of norm about 1, as in a randomly initialised model): a value of the forward and
backward passes goes through at most :data:`STEPS` rounding steps, each at most ``n·u`` of the
scale of its operands (γ_n of a dot product, n ≤ :data:`INNER` the largest inner dimension;
u = 2⁻⁵³ in float64, 2⁻²⁴ in float32); on each device the error is at most ``STEPS·INNER·u`` of
the tensor's scale (its largest entry), so the two devices differ by at most twice that. A sum of
``n`` such rows (a second moment) adds ``n·u`` of the sum of the rows' squared norms; a row's
attention entropy, ``T + 4`` rounding steps of its own (T keys; the logarithm's and the
product's). Statistics accumulate in float64 on both devices (``capture.precision`` default).

Fitted subspaces are not compared value for value: a PCA proxy moves with the data by the
perturbation over the spectral gap, a semi-NMF refit by 0.5°–3.8° from rounding alone
(METHODS.md §1.8) — the CPU runs numpy's semi-NMF loop, the GPU torch's. The sweep test compares
what is a smooth function of the statistics (the loss, drift, cosine and centred anisotropy,
the query/key drift, the mean direction's energy) within the float32 bound, and checks that
every other row is there and finite on both devices.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from tangentlens.capture import CaptureConfig, StatisticsConfig, capture_batch, capture_statistics
from tangentlens.data import SpecialTokens

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SPECIAL = SpecialTokens(bos_id=0, eos_id=0, pad_id=1)
SITES = ("hook_embed", "blocks.0.hook_resid_post", "blocks.1.hook_resid_post")
#: Rounding steps a value of a 2-block forward and backward pass goes through, at most.
STEPS = 100
#: The largest inner dimension of the products (d_mlp of both models here).
INNER = 64
U64, U32 = 2.0**-53, 2.0**-24
#: How far two devices' float64 passes may differ, relative to a tensor's scale.
FLOAT64_PATH = 2 * STEPS * INNER * U64
#: The same for float32 weights (the micro suite).
FLOAT32_PATH = 2 * STEPS * INNER * U32


def _model(device: str) -> HookedTransformer:
    torch.manual_seed(0)
    cfg = HookedTransformerConfig(
        n_layers=2, d_model=32, n_heads=4, d_head=8, d_mlp=INNER, d_vocab=100, n_ctx=16,
        act_fn="gelu", normalization_type="LN", positional_embedding_type="rotary",
        rotary_dim=4, parallel_attn_mlp=True, dtype=torch.float64, device="cpu",
    )  # fmt: skip
    return HookedTransformer(cfg).to(device)


def _close(found: torch.Tensor, expected: torch.Tensor, bound: float) -> None:
    """``found`` within ``bound`` of ``expected``'s scale (its largest entry) everywhere."""
    scale = float(expected.abs().max())
    torch.testing.assert_close(found.cpu(), expected, rtol=0, atol=bound * scale)


def test_capture_on_cuda_equals_cpu():
    tokens = torch.randint(2, 100, (4, 16), generator=torch.Generator().manual_seed(1))
    config = CaptureConfig(sites=SITES, attention_layers=(1,))
    cpu = capture_batch(_model("cpu"), tokens, config, SPECIAL)
    gpu = capture_batch(_model("cuda"), tokens, config, SPECIAL)
    for site in SITES:
        _close(gpu.gradients[site], cpu.gradients[site], FLOAT64_PATH)
        _close(gpu.activations[site], cpu.activations[site], FLOAT64_PATH)
    statistics = StatisticsConfig(reservoir_size=32)
    a = capture_statistics(_model("cpu"), [tokens], config, SPECIAL, statistics)
    b = capture_statistics(_model("cuda"), [tokens], config, SPECIAL, statistics)
    assert b.device.type == "cuda"  # the statistics stay where the model is
    rows = tokens.numel()
    for site in SITES:
        expected = a.sites[site].g.second_moment
        # each row's product within 2·FLOAT64_PATH of its squared norm, the sum n·u more
        bound = (2 * FLOAT64_PATH + rows * U64) * float(torch.diagonal(expected).sum())
        found = b.sites[site].g.second_moment.cpu()
        torch.testing.assert_close(found, expected, rtol=0, atol=bound)
        assert torch.equal(b.sites[site].reservoir.ids, a.sites[site].reservoir.ids)
        assert b.sites[site].reservoir.columns()["G"].is_cuda
    keys = 16
    _close(b.attention[1].entropy(), a.attention[1].entropy(), FLOAT64_PATH * (keys + 4))


#: Rows compared value for value between the devices: smooth functions of the statistics.
_SMOOTH = {
    "capture": ("mean_loss", "n_tokens"),
    "cosine_drift": ("cosine_anisotropy", "drift_norm", "relative_drift"),
    "shape_of_learning": ("centred_anisotropy",),
    "qk_drift": ("qk_query_norm", "qk_key_norm", "qk_cosine", "qk_mean_logit"),
}


def _smooth(row: dict) -> bool:
    if row["probe"] == "tangent_energy":
        return row["method"] == "mean_direction" and row["metric"] == "energy_fraction"
    return row["metric"] in _SMOOTH.get(row["probe"], ())


def test_sweep_runs_on_cuda(tmp_path, monkeypatch):
    from pathlib import Path

    from tangentlens.core.recipe import load_recipe
    from tangentlens.sweep.runner import run_sweep
    from tangentlens.sweep.store import read_results

    monkeypatch.setenv("TANGENTLENS_CACHE", str(tmp_path / "cache"))  # micro suite: ~1 s
    micro = Path(__file__).parents[1] / "e2e" / "recipes" / "micro.toml"
    rows = {}
    for device in ("cpu", "cuda"):
        recipe = load_recipe(micro, [f"suite.device='{device}'"])
        table = read_results(run_sweep(recipe, tmp_path / device)).to_pylist()
        rows[device] = {
            (r["step"], r["site"], r["probe"], r["method"], r["freq_bin"], r["metric"]): r
            for r in table
        }
    assert rows["cpu"].keys() == rows["cuda"].keys()
    compared = 0
    for key, row in rows["cpu"].items():
        value, found = row["value"], rows["cuda"][key]["value"]
        if isinstance(value, float) and math.isnan(value):
            assert math.isnan(found), key
        elif _smooth(row):
            # quantities of order one (cosines, fractions, ratios of norms) or their own scale
            assert found == pytest.approx(value, rel=FLOAT32_PATH, abs=FLOAT32_PATH), key
            compared += 1
        else:  # a fitted subspace's rows: there, finite as on the CPU
            assert math.isfinite(found) == math.isfinite(value), key
    assert compared > 50
