"""Recipe input as a user types it: ``suite.steps=1500`` unquoted (the shell removed the quotes),
a hub id with a wrong letter case, a probe dropped from a built-in recipe with
``probes.NAME=false``."""

from __future__ import annotations

import pytest

from tangentlens.cli import main
from tangentlens.core.recipe import load_recipe
from tangentlens.models.catalog import parse_suite_spec, suite_steps


@pytest.mark.parametrize(
    ("override", "key", "expected"),
    [
        ("suite.steps=1500", "steps", "1500"),
        ("suite.steps=[0, 1000]", "steps", "0,1000"),
        ("suite.steps=0,1000", "steps", "0,1000"),
        ("capture.layers=3", "layers", "3"),
    ],
)
def test_integers_are_taken_for_the_text_they_stand_for(override, key, expected):
    recipe = load_recipe("quickstart", [override])
    section = recipe.suite if key == "steps" else recipe.capture
    assert getattr(section, key) == expected


def test_an_unquoted_step_plans(capsys):
    argv = ["sweep", "--recipe", "quickstart", "--set", "suite.steps=1200", "--plan-only"]
    assert main(argv) == 0
    assert "plan quickstart: mini-pythia, 1 steps (1200)" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"suite\.steps must be a string, got True"):
        load_recipe("quickstart", ["suite.steps=true"])


@pytest.mark.parametrize(
    ("spec", "suggested"),
    [
        ("allenai/OLMo-1b-hf", "allenai/OLMo-1B-hf"),
        ("allenai/olmo-1b-hf", "allenai/OLMo-1B-hf"),
        ("HuggingFaceTB/SmolLM2-360M-intermediate-checkpoint", "HuggingFaceTB/SmolLM2-360M-"),
        ("EuroBERT/EuroBert-210m", "EuroBERT/EuroBERT-210m"),
    ],
)
def test_a_misspelt_hub_id_suggests_the_catalogues(spec, suggested):
    with pytest.raises(ValueError) as caught:
        parse_suite_spec(spec)
    message = str(caught.value)
    assert f"unknown suite {spec!r}: no such folder, and no hub suite of that name" in message
    assert f"did you mean '{suggested}" in message and f"'local:{spec}'" in message


def test_a_misspelt_pythia_model_suggests_the_published_one():
    with pytest.raises(ValueError, match="did you mean 'EleutherAI/pythia-160m'"):
        suite_steps("EleutherAI/pythia-160M")


def test_a_folder_that_does_not_exist_is_still_a_folder(tmp_path):
    assert parse_suite_spec("runs/my-own-suite") == ("local", "runs/my-own-suite")
    assert parse_suite_spec(f"local:{tmp_path}/allenai/OLMo-1b-hf")[0] == "local"


def test_a_probe_is_dropped_from_a_builtin_recipe_or_enabled_with_its_defaults():
    assert "qk_drift" in load_recipe("quickstart").probes
    dropped = load_recipe("quickstart", ["probes.qk_drift=false"])
    assert "qk_drift" not in dropped.probes and "cosine_drift" in dropped.probes
    assert "qk_drift" not in dropped.identity()["probes"]
    enabled = load_recipe("eurobert_210m", ["probes.update_alignment=true"])
    assert "update_alignment" in enabled.probes
    with pytest.raises(ValueError, match=r"unknown probe 'qk_drfit'.*did you mean 'qk_drift'"):
        load_recipe("quickstart", ["probes.qk_drfit=false"])
    # the other tangent probes still score the proxies stage
    without = load_recipe("quickstart", ["probes.tangent_energy=false"])
    assert "tangent_energy" not in without.probes and without.proxies.rank == 16


def test_the_cli_drops_a_probe_with_set(capsys):
    argv = ["sweep", "--recipe", "quickstart", "--plan-only"]
    argv += ["--set", "probes.untrained_block=false"]
    assert main(argv) == 0
    assert "untrained-block" not in capsys.readouterr().out
