"""Every shipped recipe loads and validates; overrides and bad keys behave."""

import pytest

from tangentlens.sweep.recipe import builtin_recipes, load_recipe


@pytest.mark.parametrize("name", sorted(builtin_recipes()))
def test_builtin_recipe_loads(name):
    recipe = load_recipe(name)
    assert recipe.name == name and recipe.probes
    assert recipe.to_dict()["suite"]["name"] == recipe.suite.name


def test_expected_recipes_ship():
    assert {
        "quickstart",
        "bernas2026",
        "razzhigaev2023",
        "godey2024",
        "mini_bert",
        "pythia_160m",
    } <= set(builtin_recipes())


def test_overrides_are_typed_and_checked():
    recipe = load_recipe("quickstart", ["probes.tangent_energy.rank=32", "suite.steps=log:3"])
    assert recipe.probes["tangent_energy"].rank == 32 and recipe.suite.steps == "log:3"
    recipe = load_recipe("quickstart", ["probes.tangent_energy.methods=['pca']"])
    assert recipe.probes["tangent_energy"].methods == ("pca",)
    with pytest.raises(ValueError, match=r"probes.tangent_energy.rank must be an integer"):
        load_recipe("quickstart", ["probes.tangent_energy.rank='big'"])
    with pytest.raises(ValueError, match="did you mean 'data'"):
        load_recipe("quickstart", ["dta.seq_len=3"])
    with pytest.raises(ValueError, match="KEY=VALUE"):
        load_recipe("quickstart", ["rank"])
    with pytest.raises(ValueError, match=r"capture\.embed"):
        load_recipe("quickstart", ["capture.embed=false"])
