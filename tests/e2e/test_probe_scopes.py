"""A researcher's probe of each scope alone in a recipe, installed from a package
(``tests/fixtures/gradnorm_probe``: the README's ``grad_norm`` by entry point, the others by
import path, ``tangentlens_scopes:…``): each gets its rows, measured against what they must
equal; the step probe appears in the report, the figures and ``compare``; a run whose step
states were written before each probe had its own namespace resumes to the same across rows."""

from __future__ import annotations

import math
import shutil
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from tangentlens.cli import main
from tangentlens.drawing.tables import fmt_value
from tangentlens.sweep.store import read_results

BASE = """
    [suite]
    name = "micro-pythia"
    steps = "{steps}"
    [data]
    corpus = "analysis"
    seq_len = 32
    max_tokens = 512
    batch_size = 16
    n_bins = 3
    [capture]
    threads = 1
"""


def _sweep(tmp_path: Path, probes: str, steps: str = "0,40") -> Path:
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(textwrap.dedent(BASE.format(steps=steps)) + textwrap.dedent(probes))
    out = tmp_path / "run"
    assert main(["sweep", "--recipe", str(recipe), "--out", str(out)]) == 0
    return out


def _rows(out: Path, probe: str) -> list[dict]:
    return [r for r in read_results(out).to_pylist() if r["probe"] == probe]


def test_a_step_probe_alone_is_reported_drawn_and_compared(units_env, tmp_path, capsys):
    out = _sweep(tmp_path, "[probes.grad_norm]\n")
    rows = _rows(out, "grad_norm")
    assert {r["step"] for r in rows} == {0, 40} and {r["freq_bin"] for r in rows} == {
        "all", "0", "1", "2"
    }  # fmt: skip
    for step in (0, 40):
        for site in {r["site"] for r in rows}:
            by_bin = {r["freq_bin"]: r for r in rows if r["step"] == step and r["site"] == site}
            pooled = sum(r["value"] ** 2 * r["n_tokens"] for b, r in by_bin.items() if b != "all")
            assert by_bin["all"]["value"] == pytest.approx(
                math.sqrt(pooled / by_bin["all"]["n_tokens"]), rel=1e-12
            )
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    shown = capsys.readouterr().out
    # its default table (step × layer, frequency bin "all"), the step-40 row's value at L0
    table = shown.split("grad_norm: gradient_rms", 1)[1]
    cell = next(r["value"] for r in rows if r["step"] == 40 and r["layer"] == 0
                and r["freq_bin"] == "all")  # fmt: skip
    line = next(line for line in table.splitlines() if line.split()[:1] == ["40"])
    assert line.split()[1] == fmt_value(cell)
    assert (out / "figures" / "grad_norm.png").stat().st_size > 0  # its default figure
    other = tmp_path / "again"
    shutil.copytree(out, other)
    folder = tmp_path / "compare"
    assert main(["compare", str(out), str(other), "--out", str(folder)]) == 0
    assert "grad_norm: gradient_rms" in capsys.readouterr().out
    compared = [r for r in pq.read_table(folder / "compare.parquet").to_pylist()
                if r["probe"] == "grad_norm"]  # fmt: skip
    differences = [r["value"] for r in compared if r["difference"] == "difference"]
    assert differences and set(differences) == {0.0}  # a run against its own copy


def test_a_tangent_probe_alone_with_the_proxies_scores_them(units_env, tmp_path):
    """The only probes: the proxies' (tangent_energy) and the researcher's tangent probe, whose
    share of the gradients' second moment in each proxy is the energy fraction of m̂'s own proxy
    and, for a proxy avoiding m̂, that fraction plus the drift's part tangent_energy removes."""
    out = _sweep(
        tmp_path,
        """
        [probes.tangent_energy]
        methods = ["pca"]
        rank = 4
        fit_policy = "per_checkpoint"
        draws = 20
        bootstrap = 0
        [probes."tangentlens_scopes:PROXY_SHARE"]
        """,
    )
    shares = {(r["step"], r["site"], r["method"]): r for r in _rows(out, "proxy_share")}
    energy = {
        (r["step"], r["site"], r["method"]): r["value"]
        for r in _rows(out, "tangent_energy")
        if r["metric"] == "energy_fraction" and r["freq_bin"] == "all"
    }
    assert len(shares) == 2 * 2 * 2  # 2 steps × 2 sites × (pca, mean_direction)
    assert shares.keys() == energy.keys()
    for key, r in shares.items():
        if key[2] == "mean_direction":
            assert r["value"] == pytest.approx(energy[key], rel=1e-5), key
        else:  # scored beyond the drift: what the drift coordinate explains is not the proxy's
            assert energy[key] * (1 - 1e-9) <= r["value"], key
        assert 0 < r["value"] < 1 and r["rank"] == (1 if key[2] == "mean_direction" else 4)


def test_an_across_probe_alone_gets_its_own_state_and_resumes_an_old_layout(units_env, tmp_path):
    """A recipe whose only probe is an ``across`` probe with a per-step state (no tangent
    probe, no proxies): one row per transition and site, each the ratio of the two steps' kept
    states, read from the probe's own namespace. The same run with its states rewritten as
    they were saved before the namespaces (every probe's keys in one dict) resumes to the same
    rows."""
    out = _sweep(tmp_path, '[probes."tangentlens_scopes:GRAD_RATIO"]\n', steps="0,4,40")
    rows = _rows(out, "grad_ratio")
    states, paths = {}, {}
    for path in (out / "state").glob("*.pt"):
        saved = torch.load(path, weights_only=True)
        if "states" in saved:
            assert set(saved["states"]) == {"grad_ratio"}
            states[saved["step"]] = saved["states"]["grad_ratio"]["grad_ms"]
            paths[path] = saved
    assert sorted(states) == [0, 4, 40]
    sites = set(states[40])
    assert len(sites) == 2 and len(rows) == 2 * len(sites)  # resid_post of both blocks
    for r in rows:
        before = 0 if r["step"] == 4 else 4
        want = math.sqrt(states[r["step"]][r["site"]] / states[before][r["site"]])
        assert r["metric"] == "gradient_rms_ratio" and r["value"] == pytest.approx(want, rel=1e-12)
    for path, saved in paths.items():  # the layout before the namespaces
        flat = {k: v for k, v in saved.items() if k != "states"}
        torch.save({**flat, **saved["states"]["grad_ratio"]}, path)
    across = [p for p in (out / "results").glob("*.parquet") if "across" in p.name]
    assert len(across) == 1
    across[0].unlink()
    recipe = tmp_path / "recipe.toml"
    assert main(["sweep", "--recipe", str(recipe), "--out", str(out), "--resume"]) == 0
    again = {(r["step"], r["site"]): r["value"] for r in _rows(out, "grad_ratio")}
    assert again == {(r["step"], r["site"]): r["value"] for r in rows}


def test_a_model_free_probe_alone(units_env, tmp_path):
    from tangentlens_scopes import HAAR, HaarConfig

    from tangentlens.conformance import check_probe
    from tangentlens.contract import MODEL_FREE_STEP

    out = _sweep(tmp_path, '[probes."tangentlens_scopes:HAAR"]\nd = 16\nk = 4\n')
    (r,) = _rows(out, "haar_energy")
    # k/d within 4 standard errors (a Beta(k/2, (d − k)/2) draw: sd 0.144 over 400 draws)
    assert r["metric"] == "unit_vector_energy" and abs(r["value"] - 0.25) < 4 * 0.144 / 20
    assert r["value"] == check_probe(HAAR, HaarConfig())[0]["value"]
    # the probe writes step 0; its unit, named by it, gives its row the model-free step
    assert r["step"] == MODEL_FREE_STEP and (out / "results" / "haar-energy.parquet").is_file()
