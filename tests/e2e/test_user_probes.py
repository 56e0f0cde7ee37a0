"""A researcher's own probe, with no edit to tangentlens: the README's example package (installed
by ``make setup``, registered through the ``tangentlens.probes`` entry point) in a sweep on Ray
workers and in ``measure``; a probe from a temporary module named by import path in a recipe;
refusals before any unit runs, and rows outside the schema refused with the unit's name."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import pytest
import torch

import tangentlens as tl
from tangentlens.cli import main
from tangentlens.sweep.store import read_results

STEP = 40
_KEY = ("site", "freq_bin", "metric")


def _recipe_with(sweeps, tmp_path: Path, table: str) -> Path:
    """The micro recipe plus one more probe table."""
    path = tmp_path / "with_probe.toml"
    path.write_text(Path(sweeps.recipe).read_text(encoding="utf-8") + f"\n{table}\n")
    return path


def _measure_step(probes: dict) -> list[dict]:
    """``measure`` on the micro suite's step 40 with the micro recipe's data settings."""
    suite = tl.open_suite("micro-pythia")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the sweep's units run on capture.threads = 1
    try:
        table = tl.measure(
            suite.load(STEP),
            suite.analysis_corpus().texts(),
            probes=probes,
            suite="micro-pythia",
            tokens_seen=suite.tokens_seen(STEP),
            seq_len=32,
            max_tokens=2048,
            batch_size=16,
            n_bins=3,
            sites=["resid_post"],
            embed=True,
            reservoir=512,
        )
    finally:
        torch.set_num_threads(threads)
    return table.to_pylist()


@pytest.mark.slow
def test_the_readme_example_runs_on_ray_workers_and_in_measure(executor_runs, units_env):
    run = executor_runs("ray")  # the cut micro sweep on 2 Ray workers, with grad_norm added
    assert run.added == ("grad_norm",)
    out = run.out
    rows = [r for r in read_results(out).to_pylist() if r["probe"] == "grad_norm"]
    sites = {"hook_embed", "blocks.0.hook_resid_post", "blocks.1.hook_resid_post"}
    assert {r["site"] for r in rows} == sites and {r["step"] for r in rows} == {0, STEP}
    assert {r["freq_bin"] for r in rows} == {"all", "0", "1", "2"}
    for step in (0, STEP):
        for site in sites:
            by_bin = {r["freq_bin"]: r for r in rows if r["step"] == step and r["site"] == site}
            # the pooled mean square is the count-weighted mean of the bins' mean squares
            pooled = sum(r["value"] ** 2 * r["n_tokens"] for b, r in by_bin.items() if b != "all")
            assert by_bin["all"]["n_tokens"] == sum(
                r["n_tokens"] for b, r in by_bin.items() if b != "all"
            )
            assert by_bin["all"]["value"] == pytest.approx(
                math.sqrt(pooled / by_bin["all"]["n_tokens"]), rel=1e-12
            )
            assert by_bin["all"]["value"] > 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["probes"]["grad_norm"] == {
        "name": "grad_norm",
        "module": "tangentlens_gradnorm",
        "distribution": "tangentlens-gradnorm",
        "version": "0.1.0",
    }
    assert manifest["probes"]["tangent_energy"]["distribution"] == "tangentlens"
    # measure gives the sweep's rows of that step, value for value
    want = {tuple(r[k] for k in _KEY): r["value"] for r in rows if r["step"] == STEP}
    got = {
        tuple(r[k] for k in _KEY): r["value"]
        for r in _measure_step({"grad_norm": {}})
        if r["probe"] == "grad_norm"
    }
    assert got == want


PROBE_SOURCE = """
    from dataclasses import dataclass

    from tangentlens.results import make_row
    from tangentlens.registry import Probe


    @dataclass(frozen=True)
    class KeptConfig:
        scale: float = 1.0


    def rows(inputs, config):
        return [
            make_row(inputs.capture, "kept_tokens", "kept", config.scale * stats.h.count,
                     site=site, n_tokens=stats.h.count)
            for site, stats in inputs.capture.statistics.sites.items()
        ]


    PROBE = Probe(name="kept_tokens", config=KeptConfig, scope="step",
                  metrics={"kept": "kept positions times scale"}, rows=rows)
"""


@pytest.fixture
def module_probe(tmp_path, monkeypatch):
    """A probe in a temporary module (``kept_tokens_probe:PROBE``), importable here."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "kept_tokens_probe.py").write_text(textwrap.dedent(PROBE_SOURCE))
    monkeypatch.syspath_prepend(str(folder))
    return "kept_tokens_probe:PROBE"


def test_a_probe_from_a_temporary_module_runs_with_no_other_edit(
    module_probe, sweeps, units_env, tmp_path, capsys
):
    recipe = _recipe_with(sweeps, tmp_path, f'[probes."{module_probe}"]\nscale = 2.0')
    out = tmp_path / "run"
    assert main(["sweep", "--recipe", str(recipe), "--out", str(out), *sweeps.units]) == 0
    table = read_results(out).to_pylist()
    kept = {(r["step"], r["site"]): r for r in table if r["probe"] == "kept_tokens"}
    n_tokens = {
        r["step"]: r["value"]
        for r in table
        if r["probe"] == "capture" and r["metric"] == "n_tokens"
    }
    assert {step for step, _ in kept} == {0, STEP} and len(kept) == 6
    for (step, _), row in kept.items():
        assert row["value"] == 2.0 * n_tokens[step] and row["n_tokens"] == n_tokens[step]
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    assert "kept_tokens: kept" in capsys.readouterr().out  # the report's table of it
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["probes"][module_probe]["module"] == "kept_tokens_probe"
    assert manifest["recipe"]["probes"][module_probe] == {"scale": 2.0}
    got = _measure_step({module_probe: {"scale": 2.0}})
    assert {r["value"] for r in got if r["probe"] == "kept_tokens"} == {2.0 * n_tokens[STEP]}


def test_a_bad_probe_is_refused_in_one_line_before_any_unit_runs(
    module_probe, sweeps, units_env, tmp_path, capsys
):
    out = tmp_path / "run"
    for table, message in [
        ('[probes."not_installed_here:PROBE"]', "cannot import 'not_installed_here'"),
        (f'[probes."{module_probe}"]\nscale = "big"', f"probes.{module_probe}.scale must be a"),
        (f'[probes."{module_probe}"]\ncolour = 1', f"unknown key probes.{module_probe}.colour"),
    ]:
        recipe = _recipe_with(sweeps, tmp_path, table)
        assert main(["sweep", "--recipe", str(recipe), "--out", str(out)]) == 2
        error = capsys.readouterr().err.strip()
        assert message in error and len(error.splitlines()) == 1, error
        assert not out.exists()


def test_rows_outside_the_schema_are_refused_with_the_unit(
    tmp_path, monkeypatch, sweeps, units_env, capsys
):
    folder = tmp_path / "bad"
    folder.mkdir()
    source = textwrap.dedent(PROBE_SOURCE).replace('"kept", config', '"undeclared", config')
    (folder / "bad_rows_probe.py").write_text(source)
    monkeypatch.syspath_prepend(str(folder))
    recipe = _recipe_with(sweeps, tmp_path, '[probes."bad_rows_probe:PROBE"]')
    out = tmp_path / "run"
    argv = ["sweep", "--recipe", str(recipe), "--out", str(out), *sweeps.units]
    assert main(argv) != 0
    error = capsys.readouterr().err
    assert "probe 'bad_rows_probe:PROBE' at step 0" in error
    assert "metric 'undeclared'; it declares the metrics ['kept']" in error
