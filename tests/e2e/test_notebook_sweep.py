"""One code path: ``tangentlens.measure`` on a checkpoint gives exactly the rows the sweep's step
unit writes for it, given the same model, tokens and settings — with the sweep's recipe objects
passed as they are, and with the settings given as keywords."""

from __future__ import annotations

import dataclasses
import math

import torch

import tangentlens as tl
from tangentlens.core.recipe import load_recipe
from tangentlens.sweep.runner import run_sweep
from tangentlens.sweep.store import RunStore, read_parts

STEP = 40
_KEY = ("site", "probe", "method", "rank", "freq_bin", "metric")


def _same(a, b) -> bool:
    return a == b or (
        isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    )


def test_measure_gives_the_sweep_steps_rows(sweeps, units_env, tmp_path) -> None:
    overrides = [f"suite.steps='{STEP}'", "proxies.fit_policy='per_checkpoint'"]
    recipe = load_recipe(sweeps.recipe, overrides)
    per_step = {k: e for k, e in recipe.probes.items() if e.probe.per_step}
    recipe = dataclasses.replace(recipe, probes=per_step)
    out = run_sweep(recipe, tmp_path / "run")
    (part,) = RunStore(out).results.glob("step-*.parquet")  # the one step unit's rows
    want = {tuple(r[k] for k in _KEY): r for r in read_parts([part]).to_pylist()}

    suite = tl.open_suite("micro-pythia")
    model = suite.load(STEP)
    caller = torch.get_num_threads()
    torch.set_num_threads(1 if recipe.capture.threads != 1 else 2)  # not the recipe's count
    try:
        table = tl.measure(
            model,
            suite.analysis_corpus().texts(),
            probes=recipe.probes,
            fit=recipe.proxies,
            suite=recipe.suite.name,
            tokens_seen=suite.tokens_seen(STEP),
            seq_len=32,
            max_tokens=2048,
            batch_size=16,
            n_bins=3,
            sites=["resid_post"],
            embed=True,
            reservoir=512,
            threads=recipe.capture.threads,  # pinned inside, as the step unit pins it
        )
        assert torch.get_num_threads() == (1 if recipe.capture.threads != 1 else 2)  # restored
    finally:
        torch.set_num_threads(caller)
    got = {tuple(r[k] for k in _KEY): r for r in table.to_pylist()}
    assert len(got) == len(table) and got.keys() == want.keys()
    assert {k[1] for k in want} >= {"tangent_energy", "anisotropy_share", "frequency_geometry"}
    for key, row in want.items():
        assert all(_same(row[f], got[key][f]) for f in row), key
