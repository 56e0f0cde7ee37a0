"""A sweep whose models run on an (emulated) accelerator: every unit computes there — window
captures, the frozen fit, step captures with their per-sequence sums, every probe and the
step's refits — gives the CPU's table, and what the units save (fit, step states) is on the
host, so a unit on another machine, with or without a GPU, reads it.

What the comparison rests on: the same arithmetic on both sides. The emulated device computes
with the CPU's own kernels (:mod:`tangentlens.testing`), and semi-NMF — whose loop runs numpy on
a CPU tensor and torch on a device tensor — runs torch's loop on both sides (its namespace is
patched to torch for the CPU table and for the device run, whose host refits after two passes
would otherwise run numpy's: numpy's and torch's loops stop at other points, by degrees, and
are compared in tests/unit/test_dictionaries.py, never here). The two tables then differ only
by float64 sums taken in another order where the device path batches them: the rows of the
float64 moments within ``1e-12 + 1e-9·|a|`` (float64 rounding, ~1e-16 per operation; worst
seen 1.5e-13 relative, on a difference of two IsoScores), counts equal, and the rows read from
the float32 row sample or a semi-NMF fit of it within the same tolerance whenever the two runs'
samples and semi-NMF inputs are bit for bit equal — centring a sample by a mean a last float64
bit apart can round one float32 entry the other way, and semi-NMF's stopping point moves by
degrees with that bit (:mod:`tests.integration.bridge_parity`: the classes and the recorder)."""

from __future__ import annotations

import pytest
import torch

from tangentlens.core.recipe import load_recipe
from tangentlens.dictionaries import seminmf
from tangentlens.sweep import units
from tangentlens.sweep.runner import run_sweep
from tangentlens.sweep.store import read_results
from tangentlens.testing import emulated_accelerator
from tests.integration.bridge_parity import SampleRecorder, tolerance_class, within

_KEY = ("step", "site", "probe", "method", "rank", "freq_bin", "metric")


def _recipe(sweeps, *more: str):
    overrides = [arg for arg in sweeps.units if arg != "--set"]
    return load_recipe(sweeps.recipe, [*overrides, *more])


@pytest.fixture(scope="module")
def cpu_table(sweeps, units_cache, tmp_path_factory):
    """The micro sweep on the CPU, semi-NMF running its device loop (torch) there too: its
    rows, and the row samples and semi-NMF inputs it saw (:class:`SampleRecorder`)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TANGENTLENS_CACHE", str(units_cache))
        patch.setattr(seminmf, "_namespace", lambda X: torch)
        recorder = SampleRecorder(patch)
        with recorder.run("cpu"):
            run = run_sweep(_recipe(sweeps), tmp_path_factory.mktemp("cpu") / "run")
    return read_results(run).to_pylist(), recorder.runs


@pytest.mark.parametrize("passes", [1, 2])
def test_a_sweep_on_the_device_path_gives_the_cpu_table(
    sweeps, units_env, cpu_table, passes, tmp_path, monkeypatch
):
    """One capture pass: everything on the device; two: each pass's statistics go to the host
    and the probes (with the frozen proxies and their frames) run there — the CPU's table
    (see the module docstring), the semi-NMF fits in torch's loop on both sides, the step's
    refits on the host after two passes too."""
    table, samples = cpu_table
    recipe = _recipe(sweeps, f"capture.passes={passes}")
    load = units._load_model
    # a host refit (two passes) runs torch's loop, as the CPU table's fits do, not numpy's
    monkeypatch.setattr(seminmf, "_namespace", lambda X: torch)
    recorder = SampleRecorder(monkeypatch, samples)
    with emulated_accelerator() as accelerator, recorder.run("device"):
        monkeypatch.setattr(units, "_device", lambda recipe: accelerator.device)
        monkeypatch.setattr(units, "_load_model", lambda *args: load(*args).to(accelerator.device))
        run = run_sweep(recipe, tmp_path / "device")
    moved = {t.where.rsplit(" ", 1)[-1] for t in accelerator.transfers.matrices()}
    saving = {"(state_dict)", "(_on_host)"}  # what the units write for other units to read
    if passes == 1:
        assert moved == saving
    else:  # and what each pass hands to the host: its statistics and sampled rows
        wheres = {t.where for t in accelerator.transfers.matrices()}
        assert moved > saving and all(
            "tangentlens/capture/" in w for w in wheres if not w.endswith(tuple(saving))
        ), wheres
    found = {tuple(r[k] for k in _KEY): r for r in read_results(run).to_pylist()}
    wanted = {tuple(r[k] for k in _KEY): r for r in table}
    assert found.keys() == wanted.keys()
    sampled = recorder.same("cpu", "device")
    for key, row in wanted.items():
        if tolerance_class(row) == "sampled" and not sampled:
            continue
        assert within(found[key]["value"], row["value"], row), key
        assert found[key]["n_tokens"] == row["n_tokens"], key
    for state in (run / "state").glob("*.pt"):  # every tensor saved is a plain host tensor
        tensors = _tensors(torch.load(state, weights_only=True))
        assert tensors and {(type(t), t.device.type) for t in tensors} == {(torch.Tensor, "cpu")}, (
            state.name
        )


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, tuple | list):
        return [t for v in value for t in _tensors(v)]
    return []
