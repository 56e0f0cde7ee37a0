"""A step's work runs where the model is: the capture, the step's proxy fits and every per-step
probe, run on an emulated accelerator (tangentlens.testing), give the CPU's rows, and only parts
of the results — scalars and vectors — cross back to the host.

The emulated device computes with the CPU's kernels and draws with generators seeded as the
CPU's, so the device path equals the CPU path, now and then a last float64 bit apart (the same
kernels on other memory layouts, sums batched otherwise). Where the device path runs other code
than the CPU's — semi-NMF's loop in torch instead of numpy — the CPU reference here runs the
device's code too: the two loops are compared with each other in
tests/unit/test_dictionaries.py. Rows are compared by class
(:mod:`tests.integration.bridge_parity`): counts equal, float64 closed forms within
``1e-12 + 1e-9·|a|`` (float64 reordering, ~1e-16 per operation), and the rows read from the
float32 row sample or a semi-NMF fit of it within the same tolerance whenever both paths saw
the same float32 inputs bit for bit (a mean a last bit apart can round one centred entry the
other way, and semi-NMF's stopping point moves by degrees with that bit)."""

from __future__ import annotations

from pathlib import Path

import torch

from tangentlens.capture.captured import Capture
from tangentlens.core.data import prepare_analysis_data
from tangentlens.core.recipe import load_recipe
from tangentlens.core.resolve import resolve
from tangentlens.core.step import capture_sites, capture_step, step_rows
from tangentlens.dictionaries import seminmf
from tangentlens.runtime import threads
from tangentlens.testing import emulated_accelerator
from tests.integration.bridge_parity import SampleRecorder, tolerance_class, within

RECIPE = Path(__file__).resolve().parents[1] / "e2e" / "recipes" / "micro.toml"


def _recipe(*overrides: str):
    return load_recipe(RECIPE, ["capture.threads=1", *overrides])


def _model(suite, step: int, device):
    model = suite.load(step)
    return model if device is None else model.to(device)


def _step(suite, recipe, device=None):
    """One step's rows as a step unit makes them (the model on ``device``, default the CPU),
    on the recipe's threads as a unit pins them (one: the emulation is seen by the thread that
    entered it, so the refit runs in line)."""
    with threads(recipe.capture.threads):
        return _pinned_step(suite, recipe, device)


def _pinned_step(suite, recipe, device):
    data = prepare_analysis_data(suite, recipe)
    step = suite.steps[-1]
    model = _model(suite, step, device)
    run = resolve(recipe)
    sites = capture_sites(model, run)
    stats = capture_step(model, sites, data, run, step)
    capture = Capture(
        suite=recipe.suite.name,
        step=step,
        tokens_seen=suite.tokens_seen(step),
        statistics=stats,
        layers=sites,
        seq_len=recipe.data.seq_len,
        frequencies=data.frequencies,
    )
    return step_rows(run, capture)


def _by_label(rows):
    return {(r["probe"], r["site"], r["method"], r["freq_bin"], r["metric"]): r for r in rows}


def _assert_same_rows(found, expected, sampled: bool):
    found, wanted = _by_label(found), _by_label(expected)
    assert found.keys() == wanted.keys()
    for label, row in wanted.items():
        if not (tolerance_class(row) == "sampled" and not sampled):
            assert within(found[label]["value"], row["value"], row), label
            assert found[label]["n_tokens"] == row["n_tokens"], label
        low, high = found[label]["ci_low"], found[label]["ci_high"]
        assert (low is None) == (row["ci_low"] is None) and (high is None) == (
            row["ci_high"] is None
        ), label


def test_a_step_on_the_device_path_gives_the_cpu_rows(micro_pythia, monkeypatch):
    """A step fitting its own proxies (``per_checkpoint``); the frozen-early step (window
    captures, the frozen fit, per-sequence sums, the refit) runs in tests/e2e/
    test_device_sweep.py as a sweep's units."""
    recipe = _recipe("proxies.fit_policy='per_checkpoint'")
    recorder = SampleRecorder(monkeypatch)
    with monkeypatch.context() as patch:  # the CPU runs semi-NMF's device loop (torch) too
        patch.setattr(seminmf, "_namespace", lambda X: torch)
        with recorder.run("cpu"):
            expected, _ = _step(micro_pythia, recipe)
    with emulated_accelerator() as accelerator, recorder.run("device"):
        rows, own = _step(micro_pythia, recipe, accelerator.device)
    assert {b.device.type for bases in own.values() for b in bases.values()} == {"meta"}
    _assert_same_rows(rows, expected, recorder.same("cpu", "device"))
    assert accelerator.transfers.matrices() == []


#: The probes whose draws and replicates the sync test varies (the others' runs are
#: covered by the test above).
_DRAWING = ("tangent_energy", "anisotropy_share")


def _probe_syncs(suite, *variants: tuple[str, ...]) -> list[int]:
    """Host syncs of one step's probes (``step_rows``) on the emulated accelerator, for each
    variant of the recipe (overrides), after one capture made there (per_checkpoint proxies:
    the fits are the probes' too)."""
    off = [f"probes.{p}=false" for p in _recipe().probes if p not in _DRAWING]
    fits = ("proxies.fit_policy='per_checkpoint'", "proxies.methods=['pca']")  # semi-NMF's own test
    recipes = [_recipe(*fits, *off, *v) for v in variants]
    recipe = recipes[0]
    with threads(recipe.capture.threads):
        data = prepare_analysis_data(suite, recipe)
        step = suite.steps[-1]
        with emulated_accelerator() as accelerator:
            model = _model(suite, step, accelerator.device)
            run = resolve(recipe)
            sites = capture_sites(model, run)
            stats = capture_step(model, sites, data, run, step)
            capture = Capture(
                suite=recipe.suite.name,
                step=step,
                tokens_seen=suite.tokens_seen(step),
                statistics=stats,
                layers=sites,
                seq_len=recipe.data.seq_len,
                frequencies=data.frequencies,
            )
            counts = []
            for variant in recipes:
                start = len(accelerator.transfers.syncs)
                step_rows(resolve(variant), capture)
                counts.append(len(accelerator.transfers.syncs) - start)
            return counts


def test_a_steps_probes_wait_as_often_whatever_the_draws_and_replicates(micro_pythia):
    """Twice the control draws (every family's), ΔIsoScore* draws and bootstrap replicates: the
    same number of host syncs — the draws and replicates are batched on the device (the
    bootstrap resamples per-sequence sums on the host, read once)."""
    few, more = _probe_syncs(
        micro_pythia,
        (),
        (
            "proxies.draws=40",
            "probes.tangent_energy.bootstrap=40",
            "probes.anisotropy_share.isoscore_draws=6",
        ),
    )
    assert few == more
