"""A GPU's budget is its free memory less a stated headroom, and a unit that runs out of memory
fails in one line naming it, the plan's peak and a ``data.batch_size`` that fits."""

from __future__ import annotations

import dataclasses

import torch

from tangentlens.core.recipe import load_recipe
from tangentlens.models.shapes import suite_shape
from tangentlens.sweep import units
from tangentlens.sweep.memory import (
    GIB,
    fitting_batch,
    headroom_bytes,
    memory_plan,
    out_of_memory_line,
    recipe_inputs,
)


def test_the_budget_is_free_memory_less_the_headroom(monkeypatch):
    """80 GB with 30 free (the CUDA context and another process hold the rest): 30 − 1 − 4."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (30 * GIB, 80 * GIB))
    assert headroom_bytes(80 * GIB) == 5 * GIB
    assert units.accelerator_budget("cuda:0") == 25 * GIB
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (GIB, 24 * GIB))
    assert units.accelerator_budget("cuda") == 0  # less free than the headroom
    assert units.accelerator_budget("cpu") is None


def _inputs():
    recipe = load_recipe("pythia_160m", ["suite.device='cuda'"])
    return dataclasses.replace(
        recipe_inputs(recipe, suite_shape("EleutherAI/pythia-160m")), device="cuda"
    )


def test_out_of_memory_names_the_unit_the_plans_peak_and_a_batch_that_fits():
    inputs = _inputs()
    planned = memory_plan(inputs).accelerator_peak
    needed = int(1.2 * planned)  # the unit held and asked for a fifth more than planned

    def scaled(batch: int) -> float:
        return memory_plan(dataclasses.replace(inputs, batch=batch)).accelerator_peak * 1.2

    batch = fitting_batch(inputs, planned, 1.2)
    assert batch is not None and 0 < batch < inputs.batch
    assert scaled(batch) <= planned < scaled(batch + 1)
    line = out_of_memory_line("step-00143000", inputs, needed, planned)
    assert "\n" not in line
    assert line.startswith("unit step-00143000 ran out of GPU memory")
    assert f"the plan's peak at data.batch_size = {inputs.batch} is {planned / GIB:.2f} GiB" in line
    assert f"set data.batch_size = {batch} " in line


def test_out_of_memory_without_a_fitting_batch_says_so():
    inputs = _inputs()
    line = out_of_memory_line("step-1", inputs, 100 * memory_plan(inputs).accelerator_peak, GIB)
    assert "no data.batch_size fits" in line


def test_the_allocation_asked_for_is_read_from_cudas_message():
    message = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79 GiB"
    assert units._requested(message) == 2 * GIB
    assert units._requested("CUDA out of memory.") == 0
