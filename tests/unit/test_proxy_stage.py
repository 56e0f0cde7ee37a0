"""The ``[proxies]`` stage: read from its own section, defaulted for a tangent probe, and read from
``[probes.tangent_energy]`` (recipes, ``--set``, manifests from before the stage) with one line
saying where the keys live now."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from tangentlens.core.proxy_stage import ProxiesSpec, move_legacy_keys
from tangentlens.core.recipe import Recipe, load_recipe
from tangentlens.core.resolve import resolve
from tangentlens.probes.anisotropy_share import AnisotropyShareConfig
from tangentlens.probes.tangent_energy import TangentEnergyConfig
from tangentlens.registry import ProbeEntry, builtin_probes

PRE = Path(__file__).parents[1] / "fixtures" / "pre_proxies_run"

LEGACY = """
[suite]
name = "micro-pythia"
[probes.tangent_energy]
methods = ["pca"]
rank = 4
draws = 20
bootstrap = 20
"""
NEW = """
[suite]
name = "micro-pythia"
[proxies]
methods = ["pca"]
rank = 4
draws = 20
[probes.tangent_energy]
bootstrap = 20
"""


def _write(tmp_path: Path, text: str, name: str = "r.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _notices(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_old_keys_are_read_from_where_they_were_with_one_line(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        old = load_recipe(_write(tmp_path, LEGACY))
    assert _notices(caplog) == [
        "recipe r.toml: probes.tangent_energy.{methods, rank, draws} now live in [proxies] (read "
        "from there; move them to silence this)"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        new = load_recipe(_write(tmp_path, NEW))
    assert _notices(caplog) == []
    assert old.proxies == new.proxies == ProxiesSpec(methods=("pca",), rank=4, draws=20)
    assert old.config("tangent_energy") == TangentEnergyConfig(bootstrap=20)
    assert old.identity() == new.identity()
    assert "rank" not in new.identity()["probes"]["tangent_energy"]


def test_a_key_given_in_both_places_with_different_values_is_refused(tmp_path):
    both = NEW + "rank = 8\n"  # under [probes.tangent_energy]
    with pytest.raises(ValueError, match=r"sets rank twice: probes\.tangent_energy\.rank = 8 and "):
        load_recipe(_write(tmp_path, both))
    same = load_recipe(_write(tmp_path, NEW + "rank = 4\n", "same.toml"))
    assert same.proxies.rank == 4


def test_set_on_the_old_path_sets_the_stage(caplog):
    with caplog.at_level(logging.WARNING):
        recipe = load_recipe("quickstart", ["probes.tangent_energy.rank=32"])
    assert recipe.proxies.rank == 32
    assert _notices(caplog) == [
        "--set probes.tangent_energy.rank: rank now lives in [proxies] (set proxies.rank)"
    ]
    assert load_recipe("quickstart", ["proxies.rank=32"]).identity() == recipe.identity()


def test_a_tangent_probe_without_the_section_gets_the_stage_defaults(tmp_path):
    alone = load_recipe(_write(tmp_path, "[probes.anisotropy_share]\n[capture]\nembed = true\n"))
    assert alone.proxies == ProxiesSpec()
    assert alone.identity()["proxies"]["draws"] == 100
    plain = load_recipe("razzhigaev2023")  # no tangent probe, no section: no proxies fitted
    assert plain.proxies is None and "proxies" not in plain.identity()
    assert load_recipe("razzhigaev2023", ["proxies=true"]).proxies == ProxiesSpec()
    assert load_recipe("quickstart", ["probes.tangent_energy=false"]).proxies.rank == 16
    made = Recipe("r", probes={"anisotropy_share": AnisotropyShareConfig()})
    assert made.proxies == ProxiesSpec()


def test_the_recipe_holds_resolved_entries():
    recipe = load_recipe("quickstart")
    entry = recipe.probes["tangent_energy"]
    assert isinstance(entry, ProbeEntry) and entry.probe is builtin_probes()["tangent_energy"]
    assert entry.key == "tangent_energy" and entry.config == recipe.config("tangent_energy")
    assert recipe.config("not_enabled") is None
    scoped = [e.key for e in recipe.scoped("tangent")]
    assert scoped == [
        "tangent_energy",
        "anisotropy_share",
        "subspace_stability",
        "update_alignment",
    ]
    needs = resolve(recipe).capture.needs  # what a step's capture keeps for them
    assert needs.gradients and needs.reservoir


def test_published_saes_need_the_reservoir(tmp_path):
    text = NEW + '[proxies.pretrained_sae]\nrelease = "r"\nids = ["a"]\n[capture]\nreservoir = 0\n'
    with pytest.raises(ValueError, match=r"^proxies\.pretrained_sae chooses its latents"):
        load_recipe(_write(tmp_path, text))


def test_bad_stage_values_name_the_key():
    with pytest.raises(ValueError, match=r"proxies\.fit_policy must be one of .*frozen_early"):
        load_recipe("quickstart", ["proxies.fit_policy='frozen'"])
    with pytest.raises(ValueError, match=r"proxies\.draws must be an integer ≥ 1"):
        load_recipe("quickstart", ["proxies.draws=0"])
    with pytest.raises(ValueError, match=r"unknown key proxies\.rnak.*did you mean 'rank'"):
        load_recipe("quickstart", ["proxies.rnak=3"])


def test_a_run_written_before_the_stage_has_this_recipe_s_identity():
    """The manifest of a run made by the code before the stage (tests/fixtures/pre_proxies_run,
    written by e6a78c2) records the stage's keys under ``probes.tangent_energy``."""
    recorded = json.loads((PRE / "run" / "manifest.json").read_text())["recipe"]
    assert "proxies" not in recorded and "rank" in recorded["probes"]["tangent_energy"]
    recipe = load_recipe(PRE / "recipe.toml")
    assert recipe.same_identity(recorded)
    assert recipe.identity() == move_legacy_keys(recorded, notice=False)
    assert not load_recipe(PRE / "recipe.toml", ["proxies.rank=3"]).same_identity(recorded)
    assert not recipe.same_identity(None)
