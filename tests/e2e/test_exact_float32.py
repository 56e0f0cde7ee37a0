"""TensorFloat-32 is off for tangentlens's computations whatever the user chose: with
``torch.backends.cuda.matmul.allow_tf32 = True`` and ``torch.set_float32_matmul_precision("high")``
switched on (as training notebooks do) before ``measure`` and a sweep, the capture and the
probes run with full float32 (read inside them), the user's settings are back after, and the
table is the one made without them. (On the CPU these settings change no number, so the
settings seen inside are what is checked; on a GPU the same test checks the table too.)"""

from __future__ import annotations

import pytest
import torch

import tangentlens as tl
from tangentlens import notebook
from tangentlens.core.recipe import load_recipe
from tangentlens.sweep import units
from tangentlens.sweep.runner import run_sweep

SETTINGS = {"seq_len": 32, "max_tokens": 1024, "n_bins": 3, "reservoir": 256}


def _inside() -> tuple[str, str]:
    """What a float32 matmul on cuBLAS and on oneDNN would use now."""
    b = torch.backends
    return b.cuda.matmul.fp32_precision, b.mkldnn.matmul.fp32_precision


@pytest.fixture
def tf32_on():
    """The user's settings a training notebook leaves behind; torch's defaults restored after."""
    holders = [torch.backends, torch.backends.cuda.matmul, torch.backends.mkldnn.matmul]
    saved = [h.fp32_precision for h in holders]
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    yield
    for holder, value in zip(holders, saved, strict=True):
        holder.fp32_precision = value


def _spy(real, seen: list):
    """``real``, recording the settings it runs under."""

    def spy(*args, **kwargs):
        seen.append(_inside())
        return real(*args, **kwargs)

    return spy


def _user_settings() -> tuple[bool, str]:
    return torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()


def test_measure_runs_without_tf32_and_gives_the_same_rows(micro_pythia, monkeypatch, tf32_on):
    model = micro_pythia.load(micro_pythia.steps[-1])
    texts = micro_pythia.analysis_corpus().texts()
    probes = ["cosine_drift", "tangent_energy"]
    fit = {"methods": ["pca"], "rank": 4, "draws": 20}
    seen: list = []
    for name in ("_capture", "step_rows"):
        monkeypatch.setattr(notebook, name, _spy(getattr(notebook, name), seen))
    rows = tl.measure(model, texts, probes=probes, fit=fit, **SETTINGS).to_pylist()
    assert _user_settings() == (True, "high")  # the user's, back
    assert len(seen) == 2 and set(seen) == {("ieee", "ieee")}
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    reference = tl.measure(model, texts, probes=probes, fit=fit, **SETTINGS).to_pylist()
    assert rows == reference


def test_a_sweeps_units_run_without_tf32_and_give_the_same_table(
    sweeps, units_env, units_reference, tmp_path, monkeypatch, tf32_on
):
    seen: list = []
    for kind in ("window", "fit", "step"):
        monkeypatch.setitem(units._RUNNERS, kind, _spy(units._RUNNERS[kind], seen))
    overrides = [arg for arg in sweeps.units if arg != "--set"]
    run = run_sweep(load_recipe(sweeps.recipe, overrides), tmp_path / "run")
    assert _user_settings() == (True, "high")
    assert len(seen) == 5 and set(seen) == {("ieee", "ieee")}  # 2 windows, the fit, 2 steps
    sweeps.assert_same_table(run, units_reference)
