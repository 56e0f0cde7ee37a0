"""The CUDA path (skipped without a GPU): capture on the GPU equals capture on the CPU, and a
sweep runs with ``suite.device = "cuda"``."""

from __future__ import annotations

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from tangentlens.capture import CaptureConfig, StatisticsConfig, capture_batch, capture_statistics
from tangentlens.data import SpecialTokens

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SPECIAL = SpecialTokens(bos_id=0, eos_id=0, pad_id=1)
SITES = ("hook_embed", "blocks.0.hook_resid_post", "blocks.1.hook_resid_post")


def _model(device: str) -> HookedTransformer:
    torch.manual_seed(0)
    cfg = HookedTransformerConfig(
        n_layers=2, d_model=32, n_heads=4, d_head=8, d_mlp=64, d_vocab=100, n_ctx=16,
        act_fn="gelu", normalization_type="LN", positional_embedding_type="rotary",
        rotary_dim=4, parallel_attn_mlp=True, dtype=torch.float64, device="cpu",
    )  # fmt: skip
    return HookedTransformer(cfg).to(device)


def test_capture_on_cuda_equals_cpu():
    tokens = torch.randint(2, 100, (4, 16), generator=torch.Generator().manual_seed(1))
    config = CaptureConfig(sites=SITES, attention_layers=(1,))
    cpu = capture_batch(_model("cpu"), tokens, config, SPECIAL)
    gpu = capture_batch(_model("cuda"), tokens, config, SPECIAL)
    for site in SITES:
        torch.testing.assert_close(
            gpu.gradients[site].cpu(), cpu.gradients[site], rtol=1e-9, atol=1e-12
        )
        torch.testing.assert_close(gpu.activations[site].cpu(), cpu.activations[site])
    statistics = StatisticsConfig(reservoir_size=32)
    a = capture_statistics(_model("cpu"), [tokens], config, SPECIAL, statistics)
    b = capture_statistics(_model("cuda"), [tokens], config, SPECIAL, statistics)
    assert b.device.type == "cuda"  # the statistics stay where the model is
    for site in SITES:
        torch.testing.assert_close(
            b.sites[site].g.second_moment.cpu(), a.sites[site].g.second_moment
        )
        assert torch.equal(b.sites[site].reservoir.ids, a.sites[site].reservoir.ids)
        assert b.sites[site].reservoir.columns()["G"].is_cuda
    torch.testing.assert_close(b.attention[1].entropy().cpu(), a.attention[1].entropy())


def test_sweep_runs_on_cuda(tmp_path, monkeypatch):
    """The micro sweep on the GPU gives the CPU's energy fractions. Compared in float64 (the
    models loaded in float64 on the host, rotary tables included, then moved; the recipe offers
    float32 and half precisions only): in float32 the GPU's kernels sum in other orders than the
    CPU's, which no tolerance bounds on every pair of machines. Then the PCA and mean-direction
    proxies' fractions — closed forms of float64 moments — agree within float64 rounding
    (:data:`tests.numerics.FLOAT64_PARITY`; Davis–Kahan for the PCA subspaces, whose gaps are far
    above it). Semi-NMF's are not compared: its float32 loop runs on other hardware on the two
    sides, and its stopping point moves by degrees with the last bits (its loops are compared in
    tests/unit/test_dictionaries.py)."""
    from pathlib import Path

    from tangentlens.core.recipe import load_recipe
    from tangentlens.sweep import units
    from tangentlens.sweep.runner import run_sweep
    from tangentlens.sweep.store import read_results
    from tests.numerics import FLOAT64_PARITY

    monkeypatch.setenv("TANGENTLENS_CACHE", str(tmp_path / "cache"))  # micro suite: ~1 s

    def float64(recipe, suite, step):
        model = suite.load(step, dtype=torch.float64)  # on the host: the same rotary tables
        return model.to(recipe.suite.resolved_device())

    monkeypatch.setattr(units, "_load_model", float64)
    micro = Path(__file__).parents[1] / "e2e" / "recipes" / "micro.toml"
    rows = {}
    for device in ("cpu", "cuda"):
        recipe = load_recipe(micro, [f"suite.device='{device}'"])
        table = read_results(run_sweep(recipe, tmp_path / device)).to_pylist()
        rows[device] = {
            (r["step"], r["site"], r["method"], r["freq_bin"], r["metric"]): r["value"]
            for r in table
            if r["probe"] == "tangent_energy"
        }
    assert rows["cpu"].keys() == rows["cuda"].keys()
    compared = 0
    for key, value in rows["cpu"].items():
        if key[-1] == "energy_fraction" and "seminmf" not in key[2]:
            assert rows["cuda"][key] == pytest.approx(value, rel=FLOAT64_PARITY, abs=1e-12), key
            compared += 1
    assert compared > 0
