"""The sweep's plan: which units, what each reads, printable; built without model libraries."""

from __future__ import annotations

import dataclasses

import pytest

from tangentlens.core.recipe import Recipe, load_recipe
from tangentlens.core.resolve import resolve
from tangentlens.models.facts import suite_facts
from tangentlens.sweep.plan import make_plan, model_free_unit

STEPS = (0, 1, 2, 4, 8, 16, 32, 64, 100, 200, 400, 1200)


def _planned(recipe: Recipe):
    """The plan of ``recipe`` over a suite whose checkpoints are ``STEPS``."""
    return make_plan(resolve(recipe, dataclasses.replace(suite_facts("mini-pythia"), steps=STEPS)))


def _plan(*overrides: str, selected: str = "0,64,400,1200"):
    return _planned(load_recipe("quickstart", [*overrides, f"suite.steps='{selected}'"]))


def test_frozen_early_plan_reads_window_then_fit_then_steps():
    plan = _plan()
    kinds = [u.kind for u in plan.units]
    window = [u for u in plan.units if u.kind == "window"]
    assert plan.window == tuple(u.step for u in window) and plan.window[-1] <= 0.3 * 1200
    assert kinds[0] == "data" and kinds.count("step") == 4
    assert all(u.deps == ("data",) and u.model for u in window)
    assert plan["fit-proxies"].deps == tuple(u.name for u in window)
    assert plan["fit-proxies"].step == plan.window[-1]  # fit rows keyed at the window's end
    assert plan["step-00000064"].deps == ("data", "fit-proxies")
    assert plan["across-steps"].deps == tuple(f"step-{s:08d}" for s in (0, 64, 400, 1200))
    assert plan["untrained-block"].deps == () and not plan["untrained-block"].model
    # every unit comes after what it reads, and names are unique
    seen: set[str] = set()
    for unit in plan.units:
        assert set(unit.deps) <= seen, unit
        seen.add(unit.name)
    assert len(seen) == len(plan.units)


def test_per_checkpoint_plan_has_no_window_and_across_steps_follows_the_probes():
    plan = _plan("proxies.fit_policy='per_checkpoint'")
    assert plan.window == () and {u.kind for u in plan.units} >= {"step", "across"}
    assert "fit-proxies" not in {u.name for u in plan.units}
    assert plan["step-00000064"].deps == ("data",)
    geometry = _planned(load_recipe("razzhigaev2023", ["suite.steps='0,64'"]))
    assert [u.kind for u in geometry.units] == ["data", "step", "step", "across"]
    recipe = load_recipe("quickstart", ["suite.steps='0,64'"])
    only_energy = {"tangent_energy": recipe.probes["tangent_energy"]}
    bare = _planned(dataclasses.replace(recipe, probes=only_energy))
    assert [u.kind for u in bare.units] == ["data", *["window"] * 8, "fit", "step", "step"]


def test_plan_renders_and_reports_what_is_done(tmp_path):
    plan = _plan()
    text = plan.render()
    assert "plan quickstart: mini-pythia, 4 steps (0, 64, 400, 1200)" in text
    assert "step-<step> × 4" in text and "after data, fit-proxies" in text
    assert text.endswith(f"{len(plan.units)} units")
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "data.npz").write_bytes(b"")
    assert "data" not in {u.name for u in plan.pending(tmp_path)}
    assert "1/1 done" in plan.render(tmp_path)
    assert plan.to_dict()["units"][0] == {"name": "data", "kind": "data", "step": None, "deps": []}
    with pytest.raises(KeyError):
        plan["step-00000001"]


def test_each_model_free_probe_has_a_unit_named_by_it():
    """The built-in model-free probe's unit keeps the name earlier runs gave it (they resume);
    a probe whose name is another unit's gets a prefix."""
    plan = _plan()
    (unit,) = [u for u in plan.units if u.kind == "model_free"]
    assert (unit.name, unit.output) == ("untrained-block", "results/untrained-block.parquet")
    assert model_free_unit("haar_energy") == "haar-energy"
    assert model_free_unit("data") == "model-free-data"
    assert model_free_unit("step_1") == "model-free-step-1"
    assert model_free_unit("across_steps") == "model-free-across-steps"
    bare = _plan("probes.untrained_block=false")
    assert "model_free" not in {u.kind for u in bare.units}
