"""The offline plan of a sweep's downloads, at its edges: up to INLINE missing downloads are named
in the refusal line itself, one more goes to a shell file (its name and content); what the plan
asks a suite for (each checkpoint a unit loads, and why) and a published SAE's files."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tangentlens.models.hub import Download
from tangentlens.sweep import downloads
from tangentlens.sweep.downloads import INLINE, check_downloads, sae_downloads, sweep_downloads


def _missing(n: int) -> list[Download]:
    return [Download(f"repo revision r{i}", f"hf download repo --revision r{i}") for i in range(n)]


def _recipe(name: str = "quick", suite: str = "org/model", **proxies) -> SimpleNamespace:
    return SimpleNamespace(
        name=name,
        suite=SimpleNamespace(name=suite, offline=True),
        proxies=SimpleNamespace(**proxies),
    )


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TANGENTLENS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_nothing_missing_is_no_refusal(cache):
    assert check_downloads([], _recipe()) is None
    assert not cache.exists()


def test_exactly_inline_missing_downloads_are_named_in_the_line(cache):
    assert INLINE == 3
    with pytest.raises(ValueError) as error:
        check_downloads(_missing(INLINE), _recipe())
    message = str(error.value)
    assert message.startswith(f"{INLINE} download(s) this sweep needs are not in the local ")
    listed = "; ".join(f"repo revision r{i}: `hf download repo --revision r{i}`" for i in range(3))
    assert f"and the hub is offline: {listed}; fetch them where the hub is reachable" in message
    assert "\n" not in message and "every command is in" not in message
    assert not (cache / "downloads").exists()  # no file below the edge


def test_one_more_than_inline_goes_to_a_file_named_after_the_recipe_and_suite(cache):
    missing = _missing(INLINE + 1)
    with pytest.raises(ValueError) as error:
        check_downloads(missing, _recipe("my recipe", "org/model"))
    message = str(error.value)
    path = cache / "downloads" / "my--recipe-org--model.sh"
    assert message.startswith(f"{INLINE + 1} downloads this sweep needs are not in the local ")
    assert (
        ", e.g. repo revision r0: `hf download repo --revision r0`; every command is in "
        f"{path} (run it where the hub is reachable, then copy the cache here) — or run online"
    ) in message
    assert "r1" not in message and "\n" not in message
    assert path.read_text(encoding="utf-8").splitlines() == [
        "#!/bin/sh",
        "# what `tangentlens sweep --recipe my recipe` loads that the Hugging Face cache lacked; "
        "run where the hub is reachable",
        *[line for i in range(4) for line in (f"# repo revision r{i}", missing[i].command)],
    ]


def test_a_file_name_keeps_no_leading_or_trailing_separator(cache):
    with pytest.raises(ValueError, match="every command is in"):
        check_downloads(_missing(INLINE + 2), _recipe("/quick", "org/model/"))
    assert [p.name for p in (cache / "downloads").iterdir()] == ["quick-org--model.sh"]


def test_file_names_keep_their_case_and_a_second_plan_writes_beside_the_first(cache):
    for recipe in (_recipe("Xmas", "EleutherAI/Pythia"), _recipe("quick", "org/model")):
        with pytest.raises(ValueError, match="every command is in"):
            check_downloads(_missing(INLINE + 1), recipe)
    names = sorted(p.name for p in (cache / "downloads").iterdir())
    assert names == ["Xmas-EleutherAI--Pythia.sh", "quick-org--model.sh"]


#: ``café``, ``org/modèle`` and ``révision`` spelt in ASCII (the command line is ASCII there too)
_ASCII_LOCALE_WRITE = """
from types import SimpleNamespace
from tangentlens.models.hub import Download
from tangentlens.sweep.downloads import check_downloads
suite = SimpleNamespace(name="org/mod\\u00e8le", offline=True)
recipe = SimpleNamespace(name="caf\\u00e9", suite=suite)
missing = [Download(f"r\\u00e9vision r{i}", f"hf download repo --revision r{i}") for i in range(4)]
try:
    check_downloads(missing, recipe)
except ValueError as error:  # the refusal, not an encoding error (also a ValueError)
    if not str(error).startswith("4 downloads this sweep needs"):
        raise
else:
    raise SystemExit("not refused")
"""


def test_the_file_is_utf_8_whatever_the_locale(cache):
    """Under an ASCII locale (no UTF-8 mode) the file is still written, in UTF-8."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    done = subprocess.run(
        [sys.executable, "-c", _ASCII_LOCALE_WRITE], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    path = cache / "downloads" / "caf---org--mod--le.sh"  # the name keeps ASCII only
    lines = path.read_bytes().decode("utf-8").splitlines()
    assert lines[1].startswith("# what `tangentlens sweep --recipe café` loads")
    assert lines[2] == "# révision r0"


class _Suite:
    """A suite that says what is missing of the steps it is asked for."""

    def __init__(self) -> None:
        self.asked: dict[int, list[str]] | None = None

    def missing_downloads(self, steps: dict[int, list[str]]) -> list[Download]:
        self.asked = steps
        return [Download(f"step {s}", f"get {s}") for s in steps]


def _unit(kind: str, step: int | None, model: bool = True) -> SimpleNamespace:
    return SimpleNamespace(kind=kind, step=step, model=model)


def test_the_plan_asks_for_each_loaded_checkpoint_with_what_it_is_for(monkeypatch):
    plan = SimpleNamespace(
        units=[
            _unit("step", 5),
            _unit("window", 5),
            _unit("pretrained", 0),  # step 0 is a step (not None)
            _unit("step", None),  # no checkpoint
            _unit("model_free", 9, model=False),  # no model
        ]
    )
    suite = _Suite()
    recipe = _recipe()  # no published SAE
    assert sweep_downloads(recipe, plan, suite) == [
        Download("step 5", "get 5"),
        Download("step 0", "get 0"),
    ]
    assert suite.asked == {5: ["scored", "fit window"], 0: ["chooses the SAE latents"]}
    assert sweep_downloads(recipe, plan, object()) == []  # a suite with nothing to download


def test_a_published_sae_is_missing_unless_its_folder_holds_files(tmp_path, monkeypatch):
    import tangentlens.dictionaries as dictionaries

    spec = SimpleNamespace(release="rel", ids=("a", "b", "c"))
    recipe = _recipe(pretrained_sae=spec)
    snapshot = tmp_path / "snap"
    (snapshot / "folder-a").mkdir(parents=True)
    (snapshot / "folder-a" / "cfg.json").write_text("{}")
    (snapshot / "folder-b").mkdir()  # empty: not downloaded
    monkeypatch.setattr(
        dictionaries, "pretrained_location", lambda r, i: (f"repo-{i}", f"folder-{i}")
    )
    snapshots = {"repo-a": str(snapshot), "repo-b": str(snapshot), "repo-c": None}
    monkeypatch.setattr(downloads, "cached_snapshot", snapshots.get)
    assert sae_downloads(recipe) == [
        Download(
            "SAE 'b' of release 'rel' (repo-b, folder folder-b)",
            "hf download repo-b --include 'folder-b/*'",
        ),
        Download(
            "SAE 'c' of release 'rel' (repo-c, folder folder-c)",
            "hf download repo-c --include 'folder-c/*'",
        ),
    ]
    recipe.suite.offline = False  # online: nothing is checked
    monkeypatch.setattr(downloads, "offline_requested", lambda offline: bool(offline))
    assert sae_downloads(recipe) == []
    assert sae_downloads(_recipe()) == []  # no published SAE
