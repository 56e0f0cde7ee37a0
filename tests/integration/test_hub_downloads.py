"""What a hub-suite sweep loads, checked whole before any unit runs (offline, fake caches with
revisions missing on purpose): every scored revision, the fit window's (drawn from the whole
catalogue, not the selection), the tokenizer's (the final revision), a published SAE's files —
each missing one named with its ``hf download`` command, all of them in a file when there are
many; and ``tangentlens suite --verify`` saying what it verified, with each cached
``config.json`` compared with the catalogue's published one."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tangentlens.cli import main
from tangentlens.core.recipe import load_recipe
from tangentlens.core.resolve import resolve
from tangentlens.models.hub_suites import HUB_SUITES
from tests.integration.conftest import use_hub_cache
from tests.integration.fake_hub import write_fake_hub

OLMO = "allenai/OLMo-1B-hf"
#: A narrow OLMo (the catalogue's is 2048 wide): what is checked here is what is cached, and
#: how a config that is not the published one is reported.
NARROW = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
          "num_key_value_heads": 4}  # fmt: skip
CACHED = (1000, 2000, 10000)
#: The olmo_1b recipe on the CPU, small enough that its memory plan never refuses it here.
SMALL = [
    "suite.device='cpu'",
    "suite.offline=true",
    "capture.layers='0'",
    "data.batch_size=1",
    "data.seq_len=64",
    "data.max_tokens=1024",
    "data.n_bins=2",
    "capture.reservoir=256",
    "executor.memory_gb=1000",
]


@pytest.fixture(scope="module")
def olmo_dir(tmp_path_factory):
    """A hub cache holding a narrow OLMo-1B-hf at steps 1000, 2000 and 10000 only."""
    hub = tmp_path_factory.mktemp("olmo-hub") / "hub"
    write_fake_hub(hub, OLMO, {step: n for n, step in enumerate(CACHED)}, vocab=512, **NARROW)
    return hub


@pytest.fixture
def olmo_hub(olmo_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("TANGENTLENS_CACHE", str(tmp_path / "cache"))
    return use_hub_cache(monkeypatch, olmo_dir)


def _sweep(tmp_path, *overrides: str) -> list[str]:
    argv = ["sweep", "--recipe", "olmo_1b", "--out", str(tmp_path / "run")]
    for override in [*SMALL, *overrides]:
        argv += ["--set", override]
    return argv


def test_every_missing_revision_is_named_in_a_file_before_any_unit_runs(olmo_hub, tmp_path, capsys):
    entry = HUB_SUITES[OLMO]
    assert main(_sweep(tmp_path, "suite.steps='1000,2000,10000'")) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and not (tmp_path / "run").exists()
    window = resolve(load_recipe("olmo_1b")).window  # over the suite's checkpoints
    assert resolve(load_recipe("olmo_1b")).suite.steps == entry.steps
    missing = [s for s in (*window, entry.steps[-1]) if s not in CACHED]
    assert len(missing) > 3
    assert f"{len(missing)} downloads this sweep needs are not in the local Hugging Face" in error
    path = re.search(r"every command is in (\S+) \(run it", error).group(1)
    script = Path(path).read_text()
    commands = [line for line in script.splitlines() if line.startswith("hf download")]
    assert commands == [f"hf download {OLMO} --revision {entry.revision(s)}" for s in missing]
    assert f"# {OLMO} revision {entry.revision(entry.steps[-1])} (the tokenizer)" in script
    assert f"(step {missing[0]}: fit window)" in script


def test_a_few_missing_revisions_are_named_in_the_line(olmo_hub, tmp_path, capsys):
    entry = HUB_SUITES[OLMO]
    policy = "proxies.fit_policy='per_checkpoint'"
    assert main(_sweep(tmp_path, "suite.steps='1000,20000'", policy)) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: 2 download(s) this sweep needs are not in the local")
    assert (
        f"{OLMO} revision step20000-tokens83B (step 20000: scored): "
        f"`hf download {OLMO} --revision step20000-tokens83B`"
    ) in error
    final = entry.revision(entry.steps[-1])
    assert f"(the tokenizer): `hf download {OLMO} --revision {final}`" in error
    assert not (tmp_path / "run").exists()


def test_a_cached_config_that_is_not_the_published_one_is_refused(
    olmo_dir, monkeypatch, tmp_path, capsys
):
    """Everything the sweep loads is cached (the final revision added for the tokenizer), but
    the checkpoints are 64 wide where OLMo-1B is 2048: refused before any unit, and by
    --verify."""
    hub = tmp_path / "hub"
    shutil.copytree(olmo_dir, hub, symlinks=True)
    use_hub_cache(monkeypatch, hub)
    monkeypatch.setenv("TANGENTLENS_CACHE", str(tmp_path / "cache"))
    final = HUB_SUITES[OLMO].steps[-1]
    write_fake_hub(hub, OLMO, {final: 9}, vocab=512, **NARROW)
    capsys.readouterr()  # what writing the cache printed
    policy = "proxies.fit_policy='per_checkpoint'"
    assert main(_sweep(tmp_path, "suite.steps='1000,2000'", policy)) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and not (tmp_path / "run").exists()
    assert "config.json at steps 1000, 2000, 738020 is not the suite's published config" in error
    assert "hidden_size 64 (published 2048)" in error
    assert "num_hidden_layers 1 (published 16)" in error
    assert main(["suite", "olmo-1b", "--offline", "--steps", "1000,2000", "--verify"]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "hidden_size 64 (published 2048)" in out and "checkpoints verified" not in out


def test_verify_says_nothing_was_verified_when_nothing_is_cached(tmp_path, monkeypatch, capsys):
    use_hub_cache(monkeypatch, tmp_path / "empty-hub")
    assert main(["suite", "olmo-1b", "--offline", "--steps", "1000,2000", "--verify"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "not on this machine, not checked: steps 1000, 2000, 738020" in out
    assert "nothing verified" in out and "checkpoints verified" not in out


def test_verify_names_what_it_verified(fake_hf_cache, capsys):
    """pythia-14m at its published shape, steps 0 and 1000 cached, the final one not."""
    argv = ["suite", "EleutherAI/pythia-14m", "--offline", "--steps", "0,1000", "--verify"]
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "not on this machine, not checked: steps 143000" in out
    assert (
        "checkpoints verified (steps 0, 1000): weights whole, configs consistent, each "
        "config.json the published one, no duplicates"
    ) in out
