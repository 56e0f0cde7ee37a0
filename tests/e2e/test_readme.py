"""The README's and the reference pages' Python examples run as written: the README's are
copies of the pages' (checked here), run where they live; those that take a suite, on a mini
suite and on a hub suite (a fake Hugging Face cache, offline).

Both suites are ``readme-pythia``: mini-pythia's shape where the examples read it (4 blocks,
rows of 128 tokens, 9 checkpoints on the log-spaced schedule) at half its width, with a
512-token vocabulary, trained in seconds. The mini variant registers it as a built-in mini suite;
the hub variant publishes the same checkpoints as revisions of a catalogue suite in a fake
cache. An example's only edit is the suite's name (``"mini-pythia"`` → the variant's), and, for
the sweep from Python (its recipe names its suite), a ``suite.name`` override."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.pages import DOCS, README, blocks, page

#: mini-pythia's shape where the examples read it (4 blocks, rows of 128 tokens; 64 wide, so
#: the default rank-16 proxy has complement controls), trained in seconds on 60 documents (a
#: held-out split of ~24k tokens: the 64 rows of 128 the capture example packs, and more).
READMESIZED = {
    "d_model": 64, "n_layers": 4, "n_heads": 4, "d_mlp": 128, "vocab_size": 512,
    "seq_len": 128, "batch_size": 4, "total_steps": 40, "checkpoint_every": 10,
    "warmup_steps": 5, "eval_sequences": 8, "max_documents": 60,
}  # fmt: skip
MINI = "readme-pythia"
HUB_ID = "tangentlens-tests/readme-pythia"
HUB = "readme-hub"


#: The README's front door: at most this many lines, the rest in the pages.
FRONT_DOOR_LINES = 250


def _run(block: str, suite: str, namespace: dict | None = None) -> dict:
    """Execute a page's block with its suite swapped for ``suite``."""
    namespace = {} if namespace is None else namespace
    source = block.replace('"mini-pythia"', repr(suite))
    source = source.replace('["suite.steps=', f'["suite.name={suite!r}", "suite.steps=')
    exec(compile(source, "<docs example>", "exec"), namespace)
    return namespace


def test_the_readme_is_a_front_door_whose_examples_are_the_pages():
    """Every code block of the README but its set-up commands is a block of a page (run there:
    the tests below, the probe example in tests/unit/test_registry.py), and every page it links
    to exists."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= FRONT_DOOR_LINES
    setup, *examples = blocks(text, "bash")
    assert [line.split()[:2] for line in setup.splitlines()] == [["make", "run"], ["make", "test"]]
    pages = {p.stem: p.read_text(encoding="utf-8") for p in DOCS.glob("*.md")}
    for language, found in (
        ("python", blocks(text)),
        ("bash", examples),
        ("toml", blocks(text, "toml")),
    ):
        shown = {b for body in pages.values() for b in blocks(body, language)}
        assert set(found) <= shown, language
    assert len(blocks(text)) == 3  # measure, the probe, compare
    linked = set(re.findall(r"\]\(docs/([\w-]+)\.md\)", text))
    assert linked <= set(pages) and {"gpu", "clusters", "glossary"} <= linked


@pytest.fixture(scope="session")
def readme_suite(tmp_path_factory):
    """``readme-pythia`` trained into a cache of its own, and a Hugging Face hub cache holding
    its checkpoints as the revisions ``step-<N>`` of ``tangentlens-tests/readme-pythia``."""
    from tangentlens.models.configs import MiniSuiteConfig
    from tangentlens.models.suites import ensure_mini_suite
    from tests.integration.fake_hub import publish_folders

    root = tmp_path_factory.mktemp("readme")
    config = MiniSuiteConfig(architecture="pythia", **READMESIZED)
    suite = ensure_mini_suite(MINI, config=config, cache_dir=root / "cache" / "suites")
    hub = root / "hub"
    revisions = {f"step-{step}": suite.folder(step) for step in suite.steps}
    publish_folders(hub, HUB_ID, revisions)
    return suite, config, root / "cache", hub


@pytest.fixture(params=["mini", "hub"])
def suite_name(request, readme_suite, monkeypatch):
    """The variant's suite name, registered where ``open_suite`` finds it; offline."""
    from tangentlens.models.configs import MINI_SUITE_CONFIGS
    from tangentlens.models.hub_suites import HUB_ALIASES, HUB_SUITES, HubSuiteEntry
    from tests.integration.conftest import use_hub_cache

    suite, config, cache, hub = readme_suite
    monkeypatch.setenv("TANGENTLENS_CACHE", str(cache))
    monkeypatch.setenv("TANGENTLENS_OFFLINE", "1")
    monkeypatch.setitem(MINI_SUITE_CONFIGS, MINI, config)
    use_hub_cache(monkeypatch, hub)
    published = suite.folder(suite.steps[-1]) / "config.json"
    entry = HubSuiteEntry(
        hub_id=HUB_ID,
        short_name=HUB,
        family="decoder",
        loader="hooked",
        revisions=tuple((step, f"step-{step}") for step in suite.steps),
        tokens_per_step=suite.tokens_per_step,
        config=json.loads(published.read_text()),
        verified=True,
        source="tests/e2e/test_readme.py: readme-pythia's checkpoints in a fake cache",
    )
    monkeypatch.setitem(HUB_SUITES, HUB_ID, entry)
    monkeypatch.setitem(HUB_ALIASES, HUB, HUB_ID)
    return MINI if request.param == "mini" else HUB


def test_metrics_example_runs(capsys):
    block = blocks(page("tensors"))[0]
    exec(compile(block, "docs/tensors.md", "exec"), {})
    printed = capsys.readouterr().out.split("\n")
    assert 0 < float(printed[0]) < 1  # a drifted cloud is anisotropic


def test_suite_example_runs(suite_name, capsys):
    namespace = _run(blocks(page("suites"))[0], suite_name)
    suite, steps = namespace["suite"], namespace["steps"]
    assert len(steps) == 8 and steps[0] == 0
    assert int(capsys.readouterr().out.strip()) == suite.tokens_seen(steps[-1])
    assert type(namespace["model"]).__name__ == "HookedTransformer"


def test_capture_example_runs(suite_name, capsys):
    namespace = _run(blocks(page("tensors"))[1], suite_name)
    stats = namespace["stats"]
    assert stats.n_sequences == 64 and 0.95 * 64 * 126 < stats.n_tokens <= 64 * 126
    assert namespace["site"].g.count == stats.n_tokens


def test_sweep_and_compare_examples_run(suite_name, capsys, tmp_path, monkeypatch):
    """The sweep from Python; then the comparison from Python, of two copies of that run under
    the example's names."""
    monkeypatch.chdir(tmp_path)  # the example writes runs/readme-example here
    _run(blocks(page("sweeps"))[0], suite_name)
    n_rows, step, ratio = capsys.readouterr().out.split()
    assert int(n_rows) > 100 and int(step) == 0 and float(ratio) > 0
    for name in ("quickstart", "mini_bert"):
        shutil.copytree(tmp_path / "runs" / "readme-example", tmp_path / "runs" / name)
    namespace = _run(blocks(page("compare"))[0], suite_name)
    printed = capsys.readouterr().out
    assert "mini_bert − quickstart" in set(namespace["df"]["run"])
    assert printed.endswith("[] ()\n")  # nothing refused, nothing flagged


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)


def test_notebook_examples_run_and_equal_the_sweep(suite_name, tmp_path, monkeypatch, capsys):
    """The shortest notebook example gives the sweep's step rows value for value (the same
    model, tokens and default settings, per-checkpoint proxies; checked on the mini suite, whose
    model carries the suite's name); the second one scores a user basis, saves a capture that
    reloads to the same rows, and writes the per-bin figure."""
    import torch

    import tangentlens as tl

    monkeypatch.chdir(tmp_path)  # the examples write their files here
    first, second = blocks(page("notebook"))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # as a sweep's unit pins capture.threads (default 2)
    try:
        namespace = _run(first, suite_name)
        measured = namespace["table"]
        printed = float(capsys.readouterr().out)
        if suite_name == MINI:
            _equal_to_the_sweep(measured, namespace["suite"], printed, tmp_path)
        _run(second, suite_name, namespace)
    finally:
        torch.set_num_threads(threads)
    site = "blocks.3.hook_resid_post"
    pca = measured.where(metric="energy_ratio", method="pca", site=site, freq_bin="all")
    assert [row["value"] for row in pca.to_pylist()] == [printed]
    table = namespace["table"]
    mine = table.where(method="unembed_frequent", metric="energy_fraction", freq_bin="all")
    assert len(mine) == 4 and all(0 < r["value"] < 1 for r in mine.to_pylist())  # 4 blocks
    assert (tmp_path / "energy_by_bin.png").stat().st_size > 0
    reloaded = tl.Capture.load(tmp_path / "mini-pythia-final.pt")
    again = tl.measure(
        reloaded,
        probes=["tangent_energy"],
        fit={"methods": ["pca"]},
        proxies={"unembed_frequent": namespace["unembedding"]},
    )
    assert len(again) == len(table)
    assert all(
        all(_same(a[f], b[f]) for f in a)
        for a, b in zip(again.to_pylist(), table.to_pylist(), strict=True)
    )


def _equal_to_the_sweep(measured, suite, printed: float, tmp_path: Path) -> None:
    """``measured`` (the example's table) is the step part of a sweep of ``suite``'s last step
    with the same probes and defaults, every field but tokens_seen (a label the model does not
    carry)."""
    from tangentlens.core.recipe import Recipe, SuiteSpec
    from tangentlens.probes.cosine_drift import CosineDriftConfig
    from tangentlens.probes.tangent_energy import TangentEnergyConfig
    from tangentlens.sweep.runner import run_sweep
    from tangentlens.sweep.store import read_parts

    spec = SuiteSpec(name=suite.name, steps=str(suite.steps[-1]))
    probes = {"tangent_energy": TangentEnergyConfig(), "cosine_drift": CosineDriftConfig()}
    run = run_sweep(Recipe("readme-notebook", spec, probes=probes), tmp_path / "run")
    (part,) = (run / "results").glob("step-*.parquet")
    key = ("site", "probe", "method", "rank", "freq_bin", "metric")
    want = {tuple(r[k] for k in key): r for r in read_parts([part]).to_pylist()}
    got = {tuple(r[k] for k in key): r for r in measured.to_pylist()}
    assert got.keys() == want.keys() and len(got) == len(measured)
    for k, row in want.items():
        assert all(_same(v, got[k][f]) for f, v in row.items() if f != "tokens_seen"), k
    site = "blocks.3.hook_resid_post"
    assert printed == want[(site, "tangent_energy", "pca", 16, "all", "energy_ratio")]["value"]
