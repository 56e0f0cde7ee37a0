"""The README's Python examples run as written."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def _python_blocks(section: str) -> list[str]:
    text = README.read_text(encoding="utf-8")
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", body, flags=re.S)


def test_metrics_example_runs(capsys):
    block = _python_blocks("Metrics on your own tensors")[0]
    exec(compile(block, "README.md", "exec"), {})
    printed = capsys.readouterr().out.split("\n")
    assert 0 < float(printed[0]) < 1  # a drifted cloud is anisotropic


@pytest.mark.slow
def test_capture_example_runs_on_the_default_suite(capsys):
    block = _python_blocks("Metrics on your own tensors")[1]
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    stats = namespace["stats"]
    assert stats.n_sequences == 64 and 0.95 * 64 * 126 < stats.n_tokens <= 64 * 126
    assert namespace["site"].g.count == stats.n_tokens


@pytest.mark.slow
def test_sweep_example_runs_on_the_default_suite(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the example writes runs/readme-example here
    block = _python_blocks("Sweeps: recipes over checkpoints")[0]
    exec(compile(block, "README.md", "exec"), {})
    n_rows, step, ratio = capsys.readouterr().out.split()
    assert int(n_rows) > 100 and int(step) == 0 and float(ratio) > 0


@pytest.mark.slow
def test_suite_example_runs_on_the_default_suite(capsys):
    block = _python_blocks("Checkpoint suites")[0]
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    assert len(namespace["steps"]) == 8 and namespace["steps"][0] == 0
    assert int(capsys.readouterr().out.strip()) == 1200 * 2048  # tokens seen at the last step
