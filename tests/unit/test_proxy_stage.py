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


def test_a_run_written_before_the_stage_has_this_recipe_s_identity(caplog):
    """The manifest of a run made by the code before the stage (tests/fixtures/pre_proxies_run,
    written by e6a78c2) records the stage's keys under ``probes.tangent_energy``; comparing it
    is silent (the notice is the recipe's, not the manifest's)."""
    recorded = json.loads((PRE / "run" / "manifest.json").read_text())["recipe"]
    assert "proxies" not in recorded and "rank" in recorded["probes"]["tangent_energy"]
    recipe = load_recipe(PRE / "recipe.toml")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert recipe.same_identity(recorded)
    assert _notices(caplog) == []
    assert recipe.identity() == move_legacy_keys(recorded, notice=False)
    assert not load_recipe(PRE / "recipe.toml", ["proxies.rank=3"]).same_identity(recorded)
    assert not recipe.same_identity(None)


def test_the_stage_refuses_each_bad_value_at_its_boundary():
    """Each refusal the stage carries (its own, the dictionaries' and the fit policy's): the
    first bad value is refused with the message naming it, the last good one is taken."""
    assert ProxiesSpec(draws=1).draws == 1
    with pytest.raises(ValueError, match=r"^draws must be an integer ≥ 1, got 0$"):
        ProxiesSpec(draws=0)
    assert ProxiesSpec(window_checkpoints=1).window_checkpoints == 1
    with pytest.raises(ValueError, match=r"^window_checkpoints must be an integer ≥ 1, got 0$"):
        ProxiesSpec(window_checkpoints=0)
    assert ProxiesSpec(early_fraction=1.0).early_fraction == 1.0
    with pytest.raises(ValueError, match=r"^early_fraction must be a number in \(0\.0, 1\.0\]"):
        ProxiesSpec(early_fraction=0.0)
    with pytest.raises(ValueError, match=r"^early_fraction must be a number in \(0\.0, 1\.0\]"):
        ProxiesSpec(early_fraction=1.01)
    assert ProxiesSpec(rank=1).rank == 1
    with pytest.raises(ValueError, match=r"^rank must be an integer ≥ 1, got 0$"):
        ProxiesSpec(rank=0)
    assert ProxiesSpec(seed=0).seed == 0
    with pytest.raises(ValueError, match=r"^seed must be an integer ≥ 0, got -1$"):
        ProxiesSpec(seed=-1)
    assert ProxiesSpec(held_out=True).held_out  # per_checkpoint, the default
    with pytest.raises(
        ValueError, match=r"^held_out = true .* needs fit_policy = 'per_checkpoint'"
    ):
        ProxiesSpec(held_out=True, fit_policy="frozen_early")
    with pytest.raises(ValueError, match=r"^fit_policy must be one of .*got 'frozen'"):
        ProxiesSpec(fit_policy="frozen")


def test_the_stage_refuses_bad_methods_naming_them_and_keeps_a_tuple():
    spec = ProxiesSpec(methods=["pca", "sae"])
    assert spec.methods == ("pca", "sae") and isinstance(spec.methods, tuple)
    assert spec.proxy_config().methods == ("pca", "sae")
    with pytest.raises(ValueError, match=r"^methods: unknown method 'pcaa'; allowed: .*'pca'"):
        ProxiesSpec(methods=("pcaa",))
    with pytest.raises(ValueError, match=r"^methods: 'pretrained_sae' is not fitted; enable it"):
        ProxiesSpec(methods=("pca", "pretrained_sae"))
    for bad in ((), ("pca", "pca")):
        with pytest.raises(ValueError, match=r"^methods must be distinct names from"):
            ProxiesSpec(methods=bad)


def test_the_stage_hands_every_fit_key_to_the_fit_and_says_whether_it_is_frozen():
    spec = ProxiesSpec(
        methods=("sae",),
        rank=3,
        seed=4,
        seminmf_max_iter=5,
        sae_samples=6,
        sae_k=7,
        centre=False,
        mean_direction=False,
        fit_policy="frozen_early",
    )
    config = spec.proxy_config()
    assert (config.methods, config.rank, config.seed, config.seminmf_max_iter) == (
        ("sae",),
        3,
        4,
        5,
    )
    assert (config.sae_samples, config.sae_k, config.centre, config.mean_direction) == (
        6,
        7,
        False,
        False,
    )
    assert spec.frozen and not ProxiesSpec().frozen
    assert ProxiesSpec().draws == 100 and ProxiesSpec().fit_policy == "per_checkpoint"


def test_legacy_keys_are_moved_only_when_there_are_some(caplog):
    plain = {"probes": {"tangent_energy": {"bootstrap": 20}}}
    assert move_legacy_keys(plain) is plain
    switched = {"probes": {"tangent_energy": True}}
    assert move_legacy_keys(switched) is switched
    assert move_legacy_keys({"suite": {}}) == {"suite": {}}
    old = {
        "probes": {"tangent_energy": {"rank": 4, "bootstrap": 20}, "qk_drift": {}},
        "proxies": {"draws": 20, "rank": 4},
    }
    with caplog.at_level(logging.WARNING):
        new = move_legacy_keys(old, "the manifest", notice=False)
    assert _notices(caplog) == []
    assert new == {
        "probes": {"tangent_energy": {"bootstrap": 20}, "qk_drift": {}},
        "proxies": {"draws": 20, "rank": 4},
    }
    assert old["probes"]["tangent_energy"] == {"rank": 4, "bootstrap": 20}  # not changed
    given = {"probes": {"tangent_energy": {"seed": 1}}, "proxies": {"draws": 20}}
    with caplog.at_level(logging.WARNING):
        moved = move_legacy_keys(given, "the manifest")
    assert moved["proxies"] == {"draws": 20, "seed": 1}
    assert given["proxies"] == {"draws": 20}  # the caller's section is not changed
    assert _notices(caplog) == [
        "the manifest: probes.tangent_energy.{seed} now live in [proxies] (read from there; "
        "move them to silence this)"
    ]
    with pytest.raises(ValueError) as error:
        move_legacy_keys({"probes": {"tangent_energy": {"draws": 5}}, "proxies": {"draws": 6}})
    assert str(error.value) == (
        "the recipe sets draws twice: probes.tangent_energy.draws = 5 and proxies.draws = 6; "
        "keep proxies.draws only"
    )
