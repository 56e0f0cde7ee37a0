"""The ``tangentlens`` command line on the foundation commands: suite summary and bad input."""

import subprocess
import sys

import pytest

from tangentlens.cli import main


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TANGENTLENS_CACHE", str(tmp_path))
    return tmp_path


def test_suite_trains_a_micro_suite_once_and_prints_its_summary(cache, capsys):
    assert main(["train-suite", "micro-pythia"]) == 0
    first = capsys.readouterr().out
    assert "held-out loss" in first and "micro-pythia" in first
    trained = list((cache / "suites").iterdir())
    assert len(trained) == 1 and trained[0].name.startswith("micro-pythia-")
    assert main(["suite", "micro-pythia", "--steps", "log:3"]) == 0
    out = capsys.readouterr().out
    assert "training micro-pythia" not in out  # cached: not trained again
    assert list((cache / "suites").iterdir()) == trained


@pytest.mark.parametrize(
    "argv, message",
    [
        (["suite", "gpt2"], "unknown suite 'gpt2'; allowed: 'mini-pythia'"),
        (["train-suite", "EleutherAI/pythia-70m"], "only built-in mini suites"),
        (["suite", "micro-pythia", "--steps", "7"], "not a checkpoint"),
        (["suite", "local:/nonexistent/folder"], "does not exist"),
    ],
)
def test_bad_input_is_one_red_line_and_exit_code_2(cache, capsys, argv, message):
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), captured.err
    assert message in lines[0]
    assert not (cache / "suites").exists() or all(
        not p.name.startswith(".tmp") for p in (cache / "suites").iterdir()
    )


def test_console_entry_point_exit_code(cache):
    result = subprocess.run(
        [sys.executable, "-m", "tangentlens.cli", "suite", "no-such-suite"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "unknown suite" in result.stderr
