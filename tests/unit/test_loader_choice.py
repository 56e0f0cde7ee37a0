"""The loader choice (``suite.loader``): validated in one line with the allowed values, resolved
per family ("auto" → :data:`DEFAULT_LOADERS`), part of the recipe's identity and recorded in the
sweep manifest — all without torch or a model library."""

from __future__ import annotations

import json

import pytest

from tangentlens.core.recipe import SuiteSpec, load_recipe
from tangentlens.models.catalog import (
    DEFAULT_LOADERS,
    ENCODER_MODEL_TYPES,
    HF_MODEL_TYPES,
    LOADER_CHOICES,
    LOADERS,
    resolve_loader,
    suite_family,
)
from tangentlens.sweep.manifest import initial_manifest
from tangentlens.sweep.runner import plan_sweep


def test_the_loaders_and_their_defaults() -> None:
    assert LOADERS == ("hooked", "bridge", "hf")
    assert LOADER_CHOICES == ("auto", "hooked", "bridge", "hf")
    assert set(DEFAULT_LOADERS) == {"decoder", "encoder"}
    assert set(DEFAULT_LOADERS.values()) <= set(LOADERS)
    for family, default in DEFAULT_LOADERS.items():
        assert resolve_loader(None, family) == resolve_loader("auto", family) == default
        for loader in LOADERS:
            assert resolve_loader(loader, family) == loader


def test_model_types_only_the_hf_loader_loads() -> None:
    """EuroBERT / ModernBERT: "auto" is "hf" and another loader one line naming it; "hf" on
    another known model type is refused, on an unknown one left to the loading."""
    assert sorted(HF_MODEL_TYPES) == ["eurobert", "modernbert"]
    assert HF_MODEL_TYPES <= ENCODER_MODEL_TYPES
    for model_type in HF_MODEL_TYPES:
        assert resolve_loader("auto", "encoder", model_type) == "hf"
        assert resolve_loader("hf", "encoder", model_type) == "hf"
        with pytest.raises(ValueError, match=rf"^checkpoints of model type '{model_type}' load "):
            resolve_loader("bridge", "encoder", model_type)
    assert resolve_loader("auto", "encoder", "bert") == DEFAULT_LOADERS["encoder"]
    with pytest.raises(ValueError, match=r"^loader 'hf' loads model types .*'gpt_neox'"):
        resolve_loader("hf", "decoder", "gpt_neox")


def test_unknown_loaders_and_families_are_refused_naming_the_allowed_ones() -> None:
    with pytest.raises(
        ValueError, match=r"^loader must be one of \('auto', 'hooked', 'bridge', 'hf'\)"
    ):
        resolve_loader("Bridge", "decoder")
    with pytest.raises(ValueError, match=r"family must be one of \['decoder', 'encoder'\]"):
        resolve_loader("auto", "seq2seq")


def test_recipe_suite_loader_is_validated_in_one_line() -> None:
    assert SuiteSpec().loader == "auto"
    assert load_recipe("quickstart", ["suite.loader='bridge'"]).suite.loader == "bridge"
    with pytest.raises(ValueError) as error:
        load_recipe("quickstart", ["suite.loader='brige'"])
    message = str(error.value)
    assert "\n" not in message
    assert "suite.loader must be one of ('auto', 'hooked', 'bridge', 'hf'), got 'brige'" in message
    assert "did you mean 'bridge'" in message


def test_the_loader_is_part_of_the_recipe_identity() -> None:
    hooked = load_recipe("quickstart", ["suite.loader='hooked'"])
    bridge = load_recipe("quickstart", ["suite.loader='bridge'"])
    assert hooked.to_dict()["suite"]["loader"] == "hooked"
    assert hooked.identity() != bridge.identity()  # --resume refuses a change of loader


def test_suite_families_are_known_without_opening_the_suite(tmp_path) -> None:
    assert suite_family("micro-pythia") == "decoder"
    assert suite_family("mini-bert") == "encoder"
    assert suite_family("EleutherAI/pythia-70m") == "decoder"
    (tmp_path / "step3").mkdir()
    (tmp_path / "step3" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert suite_family(str(tmp_path)) == "encoder"


@pytest.mark.parametrize(
    ("suite", "loader", "recorded"),
    [
        ("micro-pythia", "auto", DEFAULT_LOADERS["decoder"]),
        ("micro-bert", "auto", DEFAULT_LOADERS["encoder"]),
        ("micro-pythia", "bridge", "bridge"),
        ("micro-bert", "hooked", "hooked"),
    ],
)
def test_the_manifest_records_the_loader_every_unit_uses(suite, loader, recorded) -> None:
    overrides = [f"suite.name='{suite}'", f"suite.loader='{loader}'", "proxies.rank=8"]
    recipe = load_recipe("quickstart", overrides)  # d = 32: k ≤ 15
    manifest = initial_manifest(recipe, plan_sweep(recipe), "cpu")
    assert manifest["loader"] == recorded
    assert manifest["recipe"]["suite"]["loader"] == loader
