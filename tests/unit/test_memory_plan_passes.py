"""The memory plan's capture passes: contiguous site groups, one pass's statistics on the
device, the fewest passes that fit chosen for ``capture.passes = 0``, and the refusal naming
the batch size or passes that would fit."""

from __future__ import annotations

import dataclasses

import pytest

from tangentlens.core.recipe import site_groups
from tangentlens.models.shapes import PYTHIA_CONFIGS, ModelShape
from tangentlens.sweep.memory import GIB, PlanInputs, check_fits, memory_plan


def _inputs(**change) -> PlanInputs:
    shape = ModelShape.from_hf_config(PYTHIA_CONFIGS["EleutherAI/pythia-6.9b"])
    base = PlanInputs(
        shape=shape,
        dtype="bfloat16",
        device="cuda",
        batch=4,
        seq_len=512,
        sites=(("embed", None), *(("resid_post", b) for b in range(shape.n_layers))),
        gradients=True,
        bins=5,
        bin_moments=True,
        n_types=20000,
        reservoir=16384,
        energy_methods=2,
        n_sequences=512,
        energy_drift=True,
    )
    return dataclasses.replace(base, **change)


def test_site_groups_are_contiguous_and_balanced() -> None:
    assert site_groups(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert site_groups(list(range(3)), 5) == [[0], [1], [2]]
    assert site_groups(list(range(3)), 0) == [[0, 1, 2]]


def test_the_device_holds_one_pass_of_statistics() -> None:
    """One pass: the statistics and sampled rows stay on the device for the probes, the host
    holds only what loading takes. Several: the device holds one pass's, and the host every
    pass's (the probes run there)."""
    one, four = memory_plan(_inputs()), memory_plan(_inputs(passes=4))
    parts, parts4 = ({p.name: p for p in plan.parts} for plan in (one, four))
    for name in ("statistics", "reservoir"):
        assert parts4[name].bytes * 33 == parts[name].bytes * 9  # 9 of 33 sites in a pass
    assert four.accelerator_peak < one.accelerator_peak
    assert one.host_peak == parts["loading"].bytes and "statistics (host copy)" not in parts
    assert parts["probes"].where == "accelerator" and parts4["probes"].where == "host"
    copies = parts4["statistics (host copy)"].bytes + parts4["reservoir (host copy)"].bytes
    assert parts4["statistics (host copy)"].bytes == parts["statistics"].bytes
    assert four.host_peak == max(parts4["loading"].bytes, copies + parts4["probes"].bytes)


def test_auto_passes_are_the_fewest_that_fit() -> None:
    budget = 80 * 10**9
    plan = check_fits(_inputs(passes=0), accelerator=budget, host=None)
    assert plan.accelerator_peak <= budget
    fewer = memory_plan(_inputs(passes=plan.passes - 1))
    assert fewer.accelerator_peak > budget and plan.passes == 2
    assert check_fits(_inputs(passes=0), accelerator=None, host=None).passes == 1


def test_refusal_names_what_would_fit() -> None:
    with pytest.raises(ValueError, match=r"capture\.passes = 2 fits\)$") as error:
        check_fits(_inputs(), accelerator=80 * 10**9, host=None)
    assert "\n" not in str(error.value) and "74.51 GiB is available" in str(error.value)
    with pytest.raises(ValueError, match=r"no data\.batch_size or capture\.passes fits"):
        check_fits(_inputs(), accelerator=10 * GIB, host=None)
