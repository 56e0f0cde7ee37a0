"""A sweep whose units load every checkpoint through TransformerLens' ``TransformerBridge``
(``suite.loader = "bridge"``) gives the hooked sweep's table — every unit kind: window captures,
the frozen-early fit, per-step probes, update alignment across steps, the untrained block —
within the parity tolerances (:mod:`tests.integration.bridge_parity`), and records its loader.

Both sweeps run in this process with their models in float64 (``units._load_model`` wrapped;
the recipe offers float32 and half precisions only): in float32 the two loaders differ by
float32 rounding in another operation order, which no tolerance bounds on every CPU. The parts
Hugging Face computes in float32 in any dtype run in float64, and the hooked models get the
bridge's rotary tables once theirs are checked against them (:mod:`tests.numerics`)."""

from __future__ import annotations

import json

import torch

from tangentlens.core.recipe import load_recipe
from tangentlens.core.resolve import resolve
from tangentlens.sweep import units
from tangentlens.sweep.runner import run_sweep
from tangentlens.sweep.store import read_results
from tests.integration.bridge_parity import (
    TOLERANCES,
    SampleRecorder,
    keyed,
    mismatches,
    tolerance_class,
)
from tests.numerics import hugging_face_in_float64, share_rotary_tables


def test_a_bridge_sweep_gives_the_hooked_sweeps_table(
    sweeps, units_env, tmp_path, monkeypatch
) -> None:
    overrides = [arg for arg in sweeps.units if arg != "--set"]
    recipes = {
        loader: load_recipe(sweeps.recipe, [*overrides, f"suite.loader='{loader}'"])
        for loader in ("hooked", "bridge")
    }
    load = units._load_model
    plan = resolve(recipes["bridge"])
    suite = units._suite(plan)
    bridge = load(plan, suite, suite.steps[-1]).to(torch.float64)
    rotary = bridge.original_model.base_model.rotary_emb  # float32 tables in any dtype

    def float64(run, suite, step):
        model = load(run, suite, step).to(torch.float64)
        if run.recipe.suite.loader == "hooked":
            with torch.no_grad():
                share_rotary_tables(model, rotary, model.cfg.n_ctx)
        return model

    monkeypatch.setattr(units, "_load_model", float64)
    recorder = SampleRecorder(monkeypatch)
    runs = {}
    with hugging_face_in_float64(bridge.original_model):
        for loader, recipe in recipes.items():
            with recorder.run(loader):
                runs[loader] = run_sweep(recipe, tmp_path / loader)
    manifest = json.loads((runs["bridge"] / "manifest.json").read_text())
    assert manifest["loader"] == "bridge" and manifest["recipe"]["suite"]["loader"] == "bridge"
    assert manifest["memory_plan"]["modelled_loader"] == "hooked"  # not measured for the bridge
    reference = json.loads((runs["hooked"] / "manifest.json").read_text())
    assert reference["loader"] == "hooked"

    def site_key(site: str) -> str:  # a decoder: both loaders name every site alike
        return site

    hooked = keyed(read_results(runs["hooked"]).to_pylist(), site_key)
    bridged = keyed(read_results(runs["bridge"]).to_pylist(), site_key)
    assert {k[1] for k in hooked} >= {"update_alignment", "tangent_energy", "untrained_block"}
    assert {tolerance_class(row) for row in hooked.values()} == set(TOLERANCES)
    assert mismatches(hooked, bridged, sampled=recorder.same("hooked", "bridge")) == []
