"""A sweep whose models run on an (emulated) accelerator: every unit computes there — window
captures, the frozen fit, step captures with their per-sequence sums, every probe and the
step's refits — gives the CPU's table, and what the units save (fit, step states) is on the
host, so a unit on another machine, with or without a GPU, reads it."""

from __future__ import annotations

import math

import pytest
import torch

from tangentlens.core.recipe import load_recipe
from tangentlens.dictionaries import seminmf
from tangentlens.sweep import units
from tangentlens.sweep.runner import run_sweep
from tangentlens.sweep.store import read_results
from tangentlens.testing import emulated_accelerator

_KEY = ("step", "site", "probe", "method", "rank", "freq_bin", "metric")


def _recipe(sweeps, *more: str):
    overrides = [arg for arg in sweeps.units if arg != "--set"]
    return load_recipe(sweeps.recipe, [*overrides, *more])


@pytest.fixture(scope="module")
def cpu_table(sweeps, units_cache, tmp_path_factory):
    """The micro sweep on the CPU, semi-NMF running its device loop (torch) there too."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TANGENTLENS_CACHE", str(units_cache))
        patch.setattr(seminmf, "_namespace", lambda X: torch)
        run = run_sweep(_recipe(sweeps), tmp_path_factory.mktemp("cpu") / "run")
    return read_results(run).to_pylist()


@pytest.mark.parametrize("passes", [1, 2])
def test_a_sweep_on_the_device_path_gives_the_cpu_table(
    sweeps, units_env, cpu_table, passes, tmp_path, monkeypatch
):
    """One capture pass: everything on the device; two: each pass's statistics go to the host
    and the probes (with the frozen proxies and their frames) run there — the CPU's table, the
    semi-NMF fits in torch's loop on both sides, but for the step's refits on the host after
    two passes (numpy's loop: the stability angles they give agree within 0.5°; measured
    0.02°)."""
    recipe = _recipe(sweeps, f"capture.passes={passes}")
    load = units._load_model
    with emulated_accelerator() as accelerator:
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
    wanted = {tuple(r[k] for k in _KEY): r for r in cpu_table}
    assert found.keys() == wanted.keys()
    for key, row in wanted.items():
        value = found[key]["value"]
        if isinstance(row["value"], float) and math.isnan(row["value"]):
            assert math.isnan(value), key
        elif passes > 1 and key[2] == "subspace_stability" and "seminmf" in key[3]:
            assert value == pytest.approx(row["value"], abs=0.5), key
        else:
            assert value == pytest.approx(row["value"], rel=1e-12, abs=1e-15), key
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
