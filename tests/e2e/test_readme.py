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


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)


@pytest.mark.slow
def test_notebook_examples_run_and_equal_the_sweep(tmp_path, monkeypatch, capsys):
    """The shortest notebook example gives the sweep's step rows value for value (the same
    model, tokens and default settings, per-checkpoint proxies); the second one scores a user
    basis, saves a capture that reloads to the same rows, and writes the per-bin figure."""
    import torch

    import tangentlens as tl
    from tangentlens.core.recipe import Recipe, SuiteSpec
    from tangentlens.probes.cosine_drift import CosineDriftConfig
    from tangentlens.probes.tangent_energy import TangentSpec
    from tangentlens.sweep.runner import run_sweep
    from tangentlens.sweep.store import read_parts

    monkeypatch.chdir(tmp_path)  # the examples write their files here
    first, second = _python_blocks("In a notebook")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # as a sweep's unit pins capture.threads (default 2)
    try:
        namespace: dict = {}
        exec(compile(first, "README.md", "exec"), namespace)
        measured = namespace["table"]
        printed = float(capsys.readouterr().out)
        suite = SuiteSpec(name="mini-pythia", steps=str(namespace["suite"].steps[-1]))
        probes = {"tangent_energy": TangentSpec(), "cosine_drift": CosineDriftConfig()}
        run = run_sweep(Recipe("readme-notebook", suite, probes=probes), tmp_path / "run")
        (part,) = (run / "results").glob("step-*.parquet")
        exec(compile(second, "README.md", "exec"), namespace)
    finally:
        torch.set_num_threads(threads)
    key = ("site", "probe", "method", "rank", "freq_bin", "metric")
    want = {tuple(r[k] for k in key): r for r in read_parts([part]).to_pylist()}
    got = {tuple(r[k] for k in key): r for r in measured.to_pylist()}
    assert got.keys() == want.keys() and len(got) == len(measured)
    for k, row in want.items():
        # every field but tokens_seen: a label the model does not carry
        assert all(_same(v, got[k][f]) for f, v in row.items() if f != "tokens_seen"), k
    site = "blocks.3.hook_resid_post"
    assert printed == want[(site, "tangent_energy", "pca", 16, "all", "energy_ratio")]["value"]
    table = namespace["table"]
    mine = table.where(method="unembed_frequent", metric="energy_fraction", freq_bin="all")
    assert len(mine) == 4 and all(0 < r["value"] < 1 for r in mine.to_pylist())  # 4 blocks
    assert (tmp_path / "energy_by_bin.png").stat().st_size > 0
    reloaded = tl.Capture.load(tmp_path / "mini-pythia-final.pt")
    again = tl.measure(
        reloaded,
        probes={"tangent_energy": {"methods": ["pca"]}},
        proxies={"unembed_frequent": namespace["unembedding"]},
    )
    assert len(again) == len(table)
    assert all(
        all(_same(a[f], b[f]) for f in a)
        for a, b in zip(again.to_pylist(), table.to_pylist(), strict=True)
    )
