"""`tangentlens sweep` end to end on a micro recipe: schema, manifest, report, SIGKILL + resume,
bad input."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import statistics
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from tangentlens.cli import main
from tangentlens.glossary import BEGIN
from tangentlens.results import SCHEMA
from tangentlens.sweep.store import read_results
from tests.pages import page

MICRO = str(Path(__file__).parent / "recipes" / "micro.toml")
KEY = ("step", "site", "probe", "method", "rank", "freq_bin", "metric")


@pytest.fixture(scope="module")
def finished_run(units_cache, sweeps, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "micro"
    units_env = {**os.environ, "TANGENTLENS_CACHE": str(units_cache)}
    result = sweeps.start(["--out", str(out)], units_env)
    assert result.wait(timeout=600) == 0, result.stderr.read()
    return out


def _rows(run_dir):
    return {tuple(r[k] for k in KEY): r for r in read_results(run_dir).to_pylist()}


def test_results_schema_manifest_and_report(finished_run, units_env, capsys):
    parts = sorted((finished_run / "results").glob("*.parquet"))
    assert [p.stem for p in parts] == [
        "across-steps",
        "fit-proxies",
        "step-00000000",
        "step-00000004",
        "step-00000010",
        "step-00000040",
        "untrained-block",
    ]
    assert pq.read_schema(parts[0]).remove_metadata() == SCHEMA
    rows = read_results(finished_run).to_pylist()
    assert len(rows) == len(_rows(finished_run))  # no duplicate measurement
    assert {r["probe"] for r in rows} == {
        "capture",
        "proxy_fit",
        "cosine_drift",
        "shape_of_learning",
        "qk_drift",
        "frequency_geometry",
        "tangent_energy",
        "anisotropy_share",
        "subspace_stability",
        "update_alignment",
        "untrained_block",
    }
    metrics = {(r["probe"], r["method"], r["metric"]) for r in rows}
    assert ("subspace_stability", "seminmf~seed1", "principal_angle_max") in metrics
    assert ("update_alignment", "pca", "embedding_update_energy_ratio") in metrics
    # 0 → 4 and 4 → 10 start inside the fit window (0 … 10); 10 → 40 starts at its end
    in_window = {r["step"] for r in rows if "_in_window_" in r["metric"]}
    headline = {r["step"] for r in rows if r["metric"] == "centroid_update_energy_ratio"}
    assert in_window == {4, 10} and headline == {40}
    assert ("update_alignment", "seminmf", "centroid_update_energy_p_value") in metrics
    energy = [r for r in rows if r["metric"] == "energy_p_value"]
    assert energy and all(1 / 21 <= r["value"] <= 1 for r in energy)
    assert {r["freq_bin"] for r in energy} == {"all", "0", "1", "2"}
    manifest = json.loads((finished_run / "manifest.json").read_text())
    assert manifest["finished"] and manifest["steps"] == [0, 4, 10, 40]
    assert manifest["recipe"]["proxies"]["fit_policy"] == "frozen_early"
    assert manifest["versions"]["torch"].startswith("2.13")
    assert set(manifest["weights_hashes"]) == {"0", "4", "10", "40"}
    masked = manifest["masked_tokens"]["40"]
    assert masked["position0"] == masked["no_target"] == 2048 // 32
    assert (finished_run / "state" / "proxies.pt").exists()
    assert len(manifest["data_sha256"]) == 64 and manifest["threads"] == 2
    assert manifest["executor"]["kind"] == "local" and "executor" not in manifest["recipe"]
    assert manifest["fit_window"] == [0, 1, 2, 4, 8, 10]  # micro-pythia: step ≤ 0.3 × 40
    assert set(manifest["estimators"]) >= {"fit_window", "update_alignment", "drift_cosine"}
    assert not (finished_run / ".lock").exists()
    # every unit timed; on the local executor the units run one after another inside the run,
    # so their seconds add up to less than its wall time (the rest is the coordinator's: imports,
    # checkpoint hashes, the manifest — about half of a micro run), and the prediction is each
    # kind's median × its count (one unit at a time), exactly
    time = manifest["time"]
    timings = list((finished_run / "timings").glob("*.json"))
    assert len(timings) == manifest["units"]
    assert time["parallel"] == 1 and time["steps"] == 4
    assert sum(time["units"]["counts"].values()) == manifest["units"]
    by_kind: dict[str, list[float]] = {}
    for path in timings:
        record = json.loads(path.read_text())
        by_kind.setdefault(record["kind"], []).append(record["seconds"])
    assert sum(map(sum, by_kind.values())) < time["wall_seconds"]
    assert time["predicted_seconds"] == pytest.approx(
        sum(statistics.median(seconds) * len(seconds) for seconds in by_kind.values())
    )
    plan_only = ["sweep", "--recipe", MICRO, "--plan-only", "--out", str(finished_run)]
    assert main(plan_only) == 0
    shown = capsys.readouterr().out
    assert "step-<step> × 4         after data, fit-proxies           4/4 done" in shown
    assert "predicted" in shown and "0 s for the 0 unit(s) not done" in shown
    # one measured run predicts another selection of the same suite
    elsewhere = str(finished_run.parent / "elsewhere")
    assert main([*plan_only[:4], "--timings", str(finished_run), "--out", elsewhere]) == 0
    assert f"from the units of {finished_run}" in capsys.readouterr().out
    assert main([*plan_only, "--set", "proxies.rank=3"]) == 0
    shown = capsys.readouterr().out
    assert "holds a run of another recipe" in shown and "done" not in shown.split("\n", 1)[1]
    assert main(["report", str(finished_run)]) == 0
    out = capsys.readouterr().out
    assert "energy ratio [95 % CI], p-value" in out and "cosine anisotropy" in out
    for name in ("tangent_energy", "anisotropy_depth", "twonn", "qk_drift"):
        png = (finished_run / "figures" / f"{name}.png").read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 10_000


def _glossary() -> set[tuple[str, str]]:
    """``(probe, metric)`` of every row of the metric glossary table (docs/glossary.md)."""
    body = page("glossary").split(BEGIN, 1)[1]
    found = re.findall(r"^\| `([a-z_]+)` \| `([a-z0-9_<>]+)` \|", body, flags=re.M)
    assert found, "no glossary rows found"
    return set(found)


def test_glossary_names_every_emitted_metric_and_nothing_else(finished_run):
    """The metric glossary and the metrics of a micro sweep with every probe are the same set
    (``excluded_<reason>`` stands for every exclusion reason)."""
    emitted = {
        (r["probe"], re.sub(r"^excluded_.*", "excluded_<reason>", r["metric"]))
        for r in read_results(finished_run).to_pylist()
    }
    glossary = _glossary()
    assert emitted - glossary == set(), "emitted but not in the glossary"
    # SAE proxies cost seconds per fit, so the micro recipe has none: tests/unit/test_proxies.py
    # checks that an SAE fit reports these two
    sae_only = {("proxy_fit", "sae_explained_variance"), ("proxy_fit", "sae_l0")}
    # only a suite that served one checkpoint twice has it: test_duplicate_checkpoints_...
    duplicate = {("capture", "duplicate_weights_of")}
    # only a semi-NMF fit that collapsed and was fitted again: tests/unit/test_proxies.py
    restarted = {("proxy_fit", "seminmf_restarts")}
    assert glossary - emitted == sae_only | duplicate | restarted, "in the glossary, not emitted"


def test_sigkill_then_resume_gives_the_uninterrupted_table(
    units_reference, units_env, sweeps, tmp_path
):
    """The micro recipe cut to every kind of unit (``sweeps.units``), killed after its first
    step, resumed: the table of the uninterrupted run of the same cut recipe."""
    out = tmp_path / "killed"
    process = sweeps.start(["--out", str(out), *sweeps.units], units_env)
    deadline = time.monotonic() + 300
    while not list((out / "results").glob("step-*.parquet")):
        assert process.poll() is None, process.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert (out / ".lock").exists()  # a killed sweep leaves its lock…
    assert len(list((out / "results").glob("*.parquet"))) < 5  # not every part
    argv = ["sweep", "--recipe", MICRO, "--out", str(out), *sweeps.units]
    assert main(argv) == 2  # …and its run: resume it
    assert main([*argv, "--resume"]) == 0
    sweeps.assert_same_table(out, units_reference)  # no temporary file left behind


def test_per_checkpoint_held_out_sweep(finished_run, units_env, tmp_path):
    """Per-checkpoint proxies fitted on half the sequences and scored on the other half; the
    update s → s′ is scored in a proxy fitted on data of s (a proxy fitted at s′ already contains
    the update's directions)."""
    from tangentlens.metrics import energy_fraction

    out = tmp_path / "per-checkpoint"
    argv = ["sweep", "--recipe", MICRO, "--out", str(out)]
    policy = ["--set", "proxies.fit_policy='per_checkpoint'"]
    assert main([*argv, *policy, "--set", "proxies.held_out=true"]) == 0
    rows = read_results(out).to_pylist()
    # the other probes see the whole stream: two captures of the halves merge exactly
    frozen = {(r["step"], r["metric"]): r for r in read_results(finished_run).to_pylist()}
    for r in rows:
        if r["probe"] == "capture":
            assert r["value"] == pytest.approx(frozen[(r["step"], r["metric"])]["value"], rel=1e-9)
    n_kept = {r["step"]: r["value"] for r in rows if r["metric"] == "n_tokens"}
    scored = {
        r["step"]: r["n_tokens"]
        for r in rows
        if r["metric"] == "energy_fraction" and r["freq_bin"] == "all" and r["method"] == "pca"
    }
    assert all(0.4 * n_kept[s] < scored[s] < 0.6 * n_kept[s] for s in scored)  # the second half
    state = out / "state"
    saved = {s: torch.load(state / f"step-{s:08d}.pt") for s in (10, 40)}
    own = {s: saved[s]["states"]["update_alignment"] for s in (10, 40)}  # its namespace
    before, after = own[10]["centroids"], own[40]["centroids"]
    proxies = {s: saved[s]["proxies"] for s in (10, 40)}
    site, checked = "blocks.1.hook_resid_post", 0
    (ids_a, old), (ids_b, new) = before[site], after[site]
    at_a = {i: n for n, i in enumerate(ids_a.tolist())}
    common = [(n, at_a[i]) for n, i in enumerate(ids_b.tolist()) if i in at_a]
    delta = new[[b for b, _ in common]] - old[[a for _, a in common]]
    for method in ("pca", "seminmf"):
        (row,) = [
            r
            for r in rows
            if r["step"] == 40
            and r["site"] == site
            and r["method"] == method
            and r["metric"] == "centroid_update_energy_fraction"
        ]
        expected = energy_fraction(delta, proxies[10][site][method])
        assert row["value"] == pytest.approx(expected, rel=1e-9)
        assert abs(expected - energy_fraction(delta, proxies[40][site][method])) > 1e-3
        checked += 1
    assert checked == 2
    assert not any("in_window" in r["metric"] for r in rows)


def test_bad_input_is_one_red_line_and_exit_code_2(units_env, tmp_path, capsys):
    cases = [
        (["--set", "proxies.rnak=3"], "did you mean 'rank'"),
        (["--set", "probes.tangent_enrgy.rank=3"], "did you mean 'tangent_energy'"),
        (["--set", "proxies.fit_policy=frozen"], "fit_policy must be one of"),
        (["--set", "data.seq_len=2"], "data.seq_len must be ≥ 4"),
        (["--set", "suite.steps=log:0"], "log"),
        (["--set", "capture.sites=['resid_mdi']"], "did you mean 'resid_mid'"),
        (["--set", "capture.sites=['resid_mid']"], "no resid_mid"),  # Pythia: parallel blocks
        (
            ["--set", "proxies.rank=16"],  # refused at planning, from the shape
            "suite 'micro-pythia' (d_model = 32): proxies.rank = 16 is out of range: "
            "tangent_energy's complement controls are k-frames outside the proxy and m̂, of "
            "dimension d − k − 1 (k ≤ ⌊(d − 1)/2⌋ = 15 at d = 32); allowed: 1 … 15",
        ),
    ]
    for extra, message in cases:
        assert main(["sweep", "--recipe", MICRO, "--out", str(tmp_path / "x"), *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["sweep", "--recipe", MICRO, "--out", str(blocker / "run")]) == 2
    assert "file" in capsys.readouterr().err  # an --out below a file
    assert main(["sweep", "--recipe", "quickstrat", "--out", str(tmp_path / "y")]) == 2
    assert "did you mean 'quickstart'" in capsys.readouterr().err
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "manifest.json").write_text("{}")
    holder = {"host": socket.gethostname(), "pid": os.getppid()}  # a live process holds it
    (locked / ".lock").write_text(json.dumps(holder))
    assert main(["sweep", "--recipe", MICRO, "--out", str(locked), "--resume"]) == 2
    assert "locked by a running sweep" in capsys.readouterr().err
    # a coordinator on another host cannot be checked from here: never taken over
    (locked / ".lock").write_text(json.dumps({"host": "node-7", "pid": 1}))
    assert main(["sweep", "--recipe", MICRO, "--out", str(locked), "--resume"]) == 2
    assert "locked by a sweep on host node-7 (pid 1)" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()  # nothing half-written


def test_encoder_suite_sweeps(units_cache, units_env, sweeps, tmp_path, capsys):
    from tangentlens.models.suites import ensure_mini_suite

    ensure_mini_suite("micro-bert", cache_dir=units_cache / "suites")
    assert main(["suite", "micro-bert"]) == 0
    assert "at [MASK] inputs" in capsys.readouterr().out  # the encoder's own held-out loss
    out = tmp_path / "bert"
    argv = ["sweep", "--recipe", MICRO, "--out", str(out), "--set", "suite.name='micro-bert'"]
    argv += sweeps.units  # every kind of unit, steps 0 and 40
    assert main(argv) == 0
    rows = read_results(out).to_pylist()
    sites = {r["site"] for r in rows if r["probe"] == "tangent_energy"}
    assert "blocks.1.hook_normalized_resid_post" in sites  # BERT's block output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["suite"]["family"] == "encoder"
    assert (
        manifest["masked_tokens"]["40"]["special"] > 0
    )  # [CLS], [SEP] ([MASK] inputs are kept: they carry the loss)


def test_resume_refuses_state_from_another_version(finished_run, units_env, tmp_path, capsys):
    import shutil

    out = tmp_path / "old"
    shutil.copytree(finished_run, out)
    torch.save({"blocks.0.hook_resid_post": {}}, out / "state" / "proxies.pt")  # older layout
    (out / "results" / "step-00000040.parquet").unlink()
    assert main(["sweep", "--recipe", MICRO, "--out", str(out), "--resume"]) == 2
    assert "written by another tangentlens version" in capsys.readouterr().err


def test_duplicate_checkpoints_are_recorded_and_damaged_ones_refused(
    units_cache, units_env, tmp_path, capsys
):
    """Checked before any unit runs: a step re-serving another's weights is named in the
    manifest, the report and its capture rows; a truncated weight file stops the sweep in one
    line, leaving nothing behind; `tangentlens suite --verify` lists both."""
    import shutil

    from tangentlens.models.suites import ensure_mini_suite

    micro = ensure_mini_suite("micro-pythia", cache_dir=units_cache / "suites", train=False)
    root = tmp_path / "suite"
    # step 10 re-serves the final checkpoint's weights (the final one is not selected)
    for name, step in {"step0": 0, "step10": 40, "step20": 20, "step40": 40}.items():
        shutil.copytree(micro.folder(step), root / name)
    argv = ["sweep", "--recipe", MICRO, "--set", f"suite.name='local:{root}'"]
    argv += ["--set", "data.corpus='shakespeare'", "--set", "suite.steps='0,10,20'"]
    out = tmp_path / "run"
    assert main([*argv, "--out", str(out)]) == 0
    assert "steps 10 and 40 have the same weights" in capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["integrity"]["duplicates"] == [[10, 40]]
    rows = [r for r in read_results(out).to_pylist() if r["metric"] == "duplicate_weights_of"]
    assert [(r["step"], r["value"]) for r in rows] == [(10, 40.0)]
    weights = root / "step20" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])
    assert main([*argv, "--out", str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err
    assert "checkpoint at step 20 is damaged" in err and err.count("\n") == 1
    assert not (tmp_path / "refused").exists()
    assert main(["suite", str(root), "--verify"]) == 2
    shown = capsys.readouterr()
    assert "steps 10 and 40 have the same weights" in shown.out
    assert "step 20 is damaged" in shown.out and "1 damaged" in shown.err


def test_capture_layers_limit_every_site_to_the_chosen_blocks(units_env, sweeps, tmp_path, capsys):
    out = tmp_path / "layer1"
    argv = ["sweep", "--recipe", MICRO, "--out", str(out), *sweeps.units]
    assert main([*argv, "--set", "capture.layers='1'"]) == 0
    rows = read_results(out).to_pylist()
    sites = {r["site"] for r in rows if r["probe"] == "tangent_energy"}
    assert sites == {"hook_embed", "blocks.1.hook_resid_post"}
    assert {r["layer"] for r in rows if r["probe"] == "qk_drift"} == {1}
    capsys.readouterr()
    wrong = ["--set", "capture.layers='0,2'"]
    assert main([*argv[:4], str(tmp_path / "wrong"), *sweeps.units, *wrong]) == 2
    err = capsys.readouterr().err
    assert "names block(s) [2], but the model has 2 blocks" in err and err.count("\n") == 1
    assert not (tmp_path / "wrong").exists()
