"""A published SAE is checked against the suite's model when the sweep is planned: SAELens'
registry gives the release's model, TransformerLens' alias table matches it with the suite's
(both read offline, nothing downloaded), widths are compared where known. A release of another
model is one line, exit code 2, before a suite is trained or a run directory made.

Expected values come from the installed registry (``pythia-70m-deduped-res-sm`` holds SAEs of
``pythia-70m-deduped``) and the published Pythia configs (d_model 512 at 70m, 768 at 160m); the
mini-pythia suite is 128 wide (its config).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tangentlens.cli import main
from tangentlens.core.recipe import load_recipe
from tangentlens.core.resolve import resolve
from tangentlens.models.shapes import PYTHIA_CONFIGS
from tangentlens.sweep.runner import check_pretrained_sae, run_sweep

RELEASE = "pythia-70m-deduped-res-sm"
TABLE = "proxies.pretrained_sae"
PRETRAINED = f"{TABLE}={{release='{RELEASE}', ids=['blocks.3.hook_resid_post']}}"
TRAIN = "train an SAE on the suite's activations with method 'sae' in proxies.methods"
MINI_REFUSAL = (
    f"{TABLE}: release {RELEASE!r} holds SAEs of model 'pythia-70m-deduped' (d_model 512), not "
    "of suite 'mini-pythia' (d_model 128); SAELens' registry has no release for 'mini-pythia': "
    f"{TRAIN}"
)


def _recipe(*overrides: str):
    return load_recipe("quickstart", [PRETRAINED, *overrides])


def _refused(recipe, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        check_pretrained_sae(resolve(recipe))


def test_names_match_through_transformer_lens_aliases_and_pythia_widths_are_known():
    from tangentlens.models.naming import model_key, model_width

    assert model_key("gpt2-small") == model_key("gpt2") == "gpt2"
    assert model_key("EleutherAI/pythia-70m-deduped") == model_key("pythia-70m-deduped")
    assert model_key("pythia-70m") != model_key("pythia-70m-deduped")
    assert model_key("mini-pythia") == "mini-pythia"  # unknown to TransformerLens: itself
    assert (model_width("pythia-70m-deduped"), model_width("EleutherAI/pythia-160m")) == (512, 768)
    assert model_width("gpt2-small") is None  # no offline config table for other models


def test_the_quickstart_on_mini_pythia_refuses_a_pythia_70m_release():
    _refused(_recipe(), MINI_REFUSAL)


def test_the_release_of_the_suites_model_passes():
    check_pretrained_sae(resolve(_recipe("suite.name='EleutherAI/pythia-70m-deduped'")))
    check_pretrained_sae(resolve(load_recipe("quickstart")))  # no table: nothing to check


@pytest.mark.parametrize(
    ("suite", "width"), [("EleutherAI/pythia-160m-deduped", 768), ("EleutherAI/pythia-70m", 512)]
)
def test_another_pythia_model_is_refused_even_at_the_same_width(suite, width):
    message = (
        f"{TABLE}: release {RELEASE!r} holds SAEs of model 'pythia-70m-deduped' (d_model 512), "
        f"not of suite {suite!r} (d_model {width}); SAELens' registry has no release for "
        f"{suite!r}: {TRAIN}"
    )
    _refused(_recipe(f"suite.name='{suite}'"), message)


def test_a_refusal_lists_the_registry_releases_of_the_suites_model():
    from sae_lens.loading.pretrained_saes_directory import get_pretrained_saes_directory

    recipe = load_recipe(
        "quickstart",
        [
            f"{TABLE}={{release='gpt2-small-res-jb', ids=['blocks.0.hook_resid_pre']}}",
            "suite.name='EleutherAI/pythia-70m-deduped'",
        ],
    )
    with pytest.raises(ValueError) as caught:
        check_pretrained_sae(resolve(recipe))
    head = (
        f"{TABLE}: release 'gpt2-small-res-jb' holds SAEs of model 'gpt2-small', not of suite "
        "'EleutherAI/pythia-70m-deduped' (d_model 512); choose a release of "
        "'EleutherAI/pythia-70m-deduped' ("
    )
    message = str(caught.value)
    assert message.startswith(head) and message.endswith(f") or {TRAIN}")
    listed = message[len(head) :].split(")")[0].split(", ")
    directory = get_pretrained_saes_directory()
    ours = {r for r, e in directory.items() if e.model == "pythia-70m-deduped"}
    assert listed[:-1] == [r for r in directory if r in ours][:4]  # the registry's order
    assert listed[-1] == f"… {len(ours) - 4} more"


def _local_suite(root: Path, name: str, width: int, model_name: str | None = None) -> str:
    """A local suite folder with one checkpoint's config.json (Pythia-70m's, at ``width``)."""
    folder = root / name
    (folder / "step0").mkdir(parents=True)
    config = {**PYTHIA_CONFIGS["EleutherAI/pythia-70m-deduped"], "hidden_size": width}
    (folder / "step0" / "config.json").write_text(json.dumps(config))
    if model_name is not None:
        (folder / "suite.json").write_text(json.dumps({"model_name": model_name}))
    return f"local:{folder}"


def test_a_local_copy_of_the_model_passes_when_named_so(tmp_path):
    named = _local_suite(tmp_path, "my-copy", 512, model_name="pythia-70m-deduped")
    check_pretrained_sae(resolve(_recipe(f"suite.name='{named}'")))
    by_folder = _local_suite(tmp_path / "checkpoints", "pythia-70m-deduped", 512)
    check_pretrained_sae(resolve(_recipe(f"suite.name='{by_folder}'")))


def test_a_local_suite_of_another_name_or_width_is_refused(tmp_path):
    unnamed = _local_suite(tmp_path, "ckpts", 512)
    message = (
        f"{TABLE}: release {RELEASE!r} holds SAEs of model 'pythia-70m-deduped' (d_model 512), not "
        f"of suite {unnamed!r} (model 'ckpts', d_model 512); SAELens' registry has no release for "
        f"'ckpts': {TRAIN}; if they are checkpoints of 'pythia-70m-deduped', say so in its "
        'suite.json ("model_name": "pythia-70m-deduped")'
    )
    _refused(_recipe(f"suite.name='{unnamed}'"), message)
    narrow = _local_suite(tmp_path / "checkpoints", "pythia-70m-deduped", 32)
    message = (
        f"{TABLE}: release {RELEASE!r} holds SAEs of model 'pythia-70m-deduped' (d_model 512), "
        f"but the checkpoints of suite {narrow!r} (model 'pythia-70m-deduped') have d_model 32: "
        f"they are not that model's; {TRAIN}"
    )
    _refused(_recipe(f"suite.name='{narrow}'", "proxies.rank=8"), message)


@pytest.fixture
def nothing_runs(monkeypatch):
    """Training or opening a suite, or starting a sweep, fails the test: the refusal must come
    before all of them."""
    import tangentlens.models.suites

    def ran(*args, **kwargs):
        raise AssertionError("a suite was trained or opened, or a sweep started, before the check")

    monkeypatch.setattr(tangentlens.models.suites, "ensure_mini_suite", ran)
    monkeypatch.setattr("tangentlens.models.open_suite", ran)
    return ran


def test_run_sweep_refuses_before_any_unit_and_leaves_no_run_directory(nothing_runs, tmp_path):
    with pytest.raises(ValueError, match=f"^{re.escape(MINI_REFUSAL)}$"):
        run_sweep(_recipe(), tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("plan_only", [False, True])
def test_the_cli_exits_2_with_one_line_and_no_run_directory(
    nothing_runs, monkeypatch, capsys, tmp_path, plan_only
):
    monkeypatch.setattr("tangentlens.sweep.runner.run_sweep", nothing_runs)
    out = tmp_path / "run"
    argv = ["sweep", "--recipe", "quickstart", "--set", PRETRAINED, "--out", str(out)]
    assert main([*argv, *(["--plan-only"] if plan_only else [])]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == f"error: {MINI_REFUSAL}"
    assert "pretrained-sae" not in captured.out  # refused before the plan is printed
    assert not out.exists()


def test_the_cli_plans_the_release_of_the_suites_model(capsys, tmp_path):
    argv = ["sweep", "--recipe", "quickstart", "--set", PRETRAINED, "--plan-only"]
    suite = "--set", "suite.name='EleutherAI/pythia-70m-deduped'"
    assert main([*argv, *suite, "--out", str(tmp_path / "run")]) == 0
    assert "pretrained-sae" in capsys.readouterr().out
    assert not (tmp_path / "run").exists()
