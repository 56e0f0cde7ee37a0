"""``[proxies.pretrained_sae]``: read and checked without torch, part of the
recipe's identity, planned as one ``pretrained-sae`` unit at the selection step."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

from tangentlens.core.recipe import load_recipe
from tangentlens.dictionaries.proxy_config import PretrainedSAESpec
from tangentlens.sweep.runner import plan_sweep

TABLE = "proxies.pretrained_sae"
RECIPE = """
[suite]
name = "micro-pythia"
steps = "4..40"
[capture]
reservoir = 64
[proxies]
methods = ["pca"]
rank = 3
[probes.tangent_energy]
[proxies.pretrained_sae]
release = "pythia-70m-deduped-res-sm"
ids = ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
"""


@pytest.fixture
def recipe_path(tmp_path):
    path = tmp_path / "pretrained.toml"
    path.write_text(RECIPE)
    return path


def test_the_table_is_read_and_is_part_of_the_identity(recipe_path):
    recipe = load_recipe(recipe_path)
    spec = recipe.proxies.pretrained_sae
    assert spec == PretrainedSAESpec(
        "pythia-70m-deduped-res-sm", ("blocks.0.hook_resid_post", "blocks.1.hook_resid_post")
    )
    assert recipe.identity()["proxies"]["pretrained_sae"] == {
        "release": "pythia-70m-deduped-res-sm",
        "ids": ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"],
        "select_step": None,
    }
    other = load_recipe(recipe_path, [f"{TABLE}.ids=['blocks.0.hook_resid_post']"])
    assert other.identity() != recipe.identity()
    assert (
        load_recipe(recipe_path, [f"{TABLE}.select_step=4"]).proxies.pretrained_sae.select_step == 4
    )
    assert load_recipe("quickstart").proxies.pretrained_sae is None


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (f"{TABLE}.release=''", f"{TABLE}.release must name a release of SAELens' pretrained"),
        (f"{TABLE}.ids=[]", f"{TABLE}.ids must list distinct SAE ids"),
        (f"{TABLE}.ids=['a', 'a']", f"{TABLE}.ids must list distinct SAE ids"),
        (f"{TABLE}.ids='blocks.0.hook_resid_post'", f"{TABLE}.ids must be a list"),
        (f"{TABLE}.select_step=-1", f"{TABLE}.select_step must be an integer ≥ 0, got -1"),
        (f"{TABLE}.select_step='first'", f"{TABLE}.select_step must be an integer"),
        (f"{TABLE}.relase='x'", f"unknown key {TABLE}.relase; .* \\(did you mean 'release'\\?\\)"),
        ("proxies.pretrained_sae=3", f"{TABLE} must be a table"),
        (
            "proxies.methods=['pca', 'pretrained_sae']",
            "'pretrained_sae' is not fitted; enable it with a \\[proxies.pretrained_sae\\] table",
        ),
        ("capture.reservoir=0", f"{TABLE} chooses its latents .* set capture.reservoir ≥ 1"),
    ],
)
def test_bad_tables_name_the_key_and_what_is_allowed(recipe_path, override, message):
    with pytest.raises(ValueError, match=message):
        load_recipe(recipe_path, [override])


def test_the_unit_runs_at_the_selection_step_before_what_uses_it(recipe_path):
    plan = plan_sweep(load_recipe(recipe_path))
    unit = plan["pretrained-sae"]
    assert (unit.kind, unit.step, unit.deps, unit.model) == ("pretrained", 4, ("data",), True)
    assert all(u.deps == ("data", "pretrained-sae") for u in plan.units if u.kind == "step")
    assert "pretrained-sae          after data" in plan.render()
    frozen = plan_sweep(load_recipe(recipe_path, ["proxies.fit_policy='frozen_early'"]))
    assert frozen["fit-proxies"].deps[-1] == "pretrained-sae"
    assert frozen["step-00000040"].deps == ("data", "fit-proxies", "pretrained-sae")
    stated = plan_sweep(load_recipe(recipe_path, [f"{TABLE}.select_step=2"]))
    assert stated["pretrained-sae"].step == 2
    assert "pretrained-sae" not in {u.name for u in plan_sweep(load_recipe("quickstart")).units}


def test_a_selection_step_must_be_an_earlier_checkpoint(recipe_path):
    message = f"{TABLE}.select_step = 3 is not a checkpoint of the suite; its steps: 0, 1, 2,"
    with pytest.raises(ValueError, match=re.escape(message)):
        plan_sweep(load_recipe(recipe_path, [f"{TABLE}.select_step=3"]))
    message = (
        f"{TABLE}.select_step = 10 is after the first selected step 4: the latents must be "
        "chosen on data of the scored steps or earlier"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        plan_sweep(load_recipe(recipe_path, [f"{TABLE}.select_step=10"]))


def test_reading_and_planning_import_no_heavy_library(recipe_path):
    script = textwrap.dedent(
        f"""
        import sys
        from tangentlens.core.recipe import load_recipe
        from tangentlens.sweep.runner import plan_sweep

        plan_sweep(load_recipe({str(recipe_path)!r}))
        heavy = {{"torch", "transformer_lens", "transformers", "sae_lens"}}
        print(sorted(heavy & sys.modules.keys()))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_published_saes_count_as_a_method_in_the_memory_plan(recipe_path):
    from tangentlens.core.memory import control_draw_columns
    from tangentlens.core.resolve import resolve

    inputs = resolve(load_recipe(recipe_path)).memory_inputs
    assert inputs.draw_columns == control_draw_columns(3, True, 2) == 15  # pca and the SAEs
    assert control_draw_columns(3, True, 1) < 15
    assert ("embed", None) not in inputs.sites
    embedded = resolve(load_recipe(recipe_path, ["capture.embed=true"])).memory_inputs
    assert embedded.sites == (("embed", None), *inputs.sites)


def test_a_recipe_without_type_sums_plans_none(recipe_path):
    from tangentlens.core.resolve import resolve

    run = resolve(load_recipe(recipe_path))
    assert not run.capture.needs.type_sums and run.memory_inputs.n_types == 0
