"""Each model-free probe has a unit of its own, named by it, whose rows are that probe's alone
and at the model-free step whatever the probe wrote; a step unit reads its capture passes from
the resolved recipe's memory plans instead of planning again."""

from __future__ import annotations

import pyarrow.parquet as pq

from tangentlens.contract import MODEL_FREE_STEP
from tangentlens.core import memory
from tangentlens.core.recipe import CaptureSpec, Recipe, SuiteSpec
from tangentlens.core.resolve import resolve
from tangentlens.models.configs import UntrainedBlockConfig
from tangentlens.sweep import units
from tangentlens.sweep.plan import make_plan

HAAR = "tangentlens_scopes:HAAR"  # the fixture package's model-free probe: it writes step 0


def test_each_model_free_probe_runs_in_its_own_unit(tmp_path):
    from tangentlens_scopes import HaarConfig

    block = UntrainedBlockConfig(
        d_model=8, n_heads=2, d_mlp=16, n_sequences=2, seq_len=4, vocab_size=11, bias_norms=(0.0,)
    )
    recipe = Recipe(
        name="model-free",
        suite=SuiteSpec(name="micro-pythia"),
        capture=CaptureSpec(threads=1),
        probes={"untrained_block": block, HAAR: HaarConfig(d=8, k=2, draws=10)},
    )
    run = resolve(recipe)
    plan = make_plan(run)
    free = [u for u in plan.units if u.kind == "model_free"]
    assert [(u.name, u.output) for u in free] == [
        ("untrained-block", "results/untrained-block.parquet"),
        ("haar-energy", "results/haar-energy.parquet"),
    ]
    for unit in free:
        units.run_unit(run, tmp_path, unit)
    block_rows = pq.read_table(tmp_path / "results" / "untrained-block.parquet").to_pylist()
    haar_rows = pq.read_table(tmp_path / "results" / "haar-energy.parquet").to_pylist()
    assert {r["probe"] for r in block_rows} == {"untrained_block"}
    assert [r["probe"] for r in haar_rows] == ["haar_energy"]
    assert {r["step"] for r in block_rows + haar_rows} == {MODEL_FREE_STEP}


def test_a_step_unit_reads_its_passes_from_the_plan(monkeypatch):
    run = resolve(Recipe(name="p", probes=_cosine()))

    def no_planning(*args, **kwargs):
        raise AssertionError("a unit planned again")

    monkeypatch.setattr(memory, "memory_plan", no_planning)
    monkeypatch.setattr(memory, "memory_plans", no_planning)
    assert units._capture_passes(run) == 1


def _cosine() -> dict:
    from tangentlens.registry import builtin_probes

    return {"cosine_drift": builtin_probes()["cosine_drift"].config()}
