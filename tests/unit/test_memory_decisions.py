"""The memory plan's arithmetic and decisions, by value on a toy model whose every part is worked
out by hand below from the formulas the module's docstring states: which phase sets the peak,
where the probes run with one or several passes, which blocks keep activations for the
backward, the control draws' cap, a budget met exactly or missed by one byte, the batch that
fits at its boundary, and the lines that say so. (The coefficients and the byte counts of the
buffers are measured against torch in tests/integration/test_memory_plan.py.)"""

from __future__ import annotations

import dataclasses

import pytest

from tangentlens.capture.chunks import statistics_bytes
from tangentlens.core import memory
from tangentlens.core.memory import (
    GIB,
    MemoryPart,
    MemoryPlan,
    PlanInputs,
    check_fits,
    control_draw_columns,
    fitting_batch,
    fitting_plan,
    held_draws_bytes,
    memory_plan,
    memory_plans,
    out_of_memory_line,
    probe_bytes,
    saved_per_block,
)
from tangentlens.models.shapes import ModelShape

SHAPE = ModelShape(
    family="gpt_neox",
    n_layers=4,
    d_model=8,
    n_heads=2,
    n_kv_heads=2,
    d_mlp=32,
    d_vocab=50,
    n_ctx=64,
    rotary_dim=2,
)
SITES = (("embed", None), ("resid_post", 1), ("resid_post", 2))
INPUTS = PlanInputs(
    shape=SHAPE,
    dtype="float32",
    device="cuda",
    batch=2,
    seq_len=4,
    sites=SITES,
    gradients=True,
    bins=2,
    bin_moments=True,
    n_types=5,
    reservoir=10,
    energy_methods=3,
    n_sequences=6,
    draws=2,
    draw_columns=7,
    energy_drift=True,
)
WEIGHTS = SHAPE.n_parameters() * 4 + SHAPE.n_buffer_bytes(4)
#: gpt_neox float32: (28, 4, 9, 16, 16, 0, 0, 1) · (n·d = 64, n·d_mlp = 256, batch·heads·T² = 64,
#: n = 8, d² = 64, d·d_kv = 64, d·d_mlp = 256, T² = 16)
PER_BLOCK = 28 * 64 + 4 * 256 + 9 * 64 + 16 * 8 + 16 * 64 + 16
#: moments, 3 projectors d × d, sums of 6 sequences × 3 slots × (1 + 3 + d drift sums)
PER_SITE = (
    statistics_bytes(8, gradients=True, n_bins=2, bin_moments=True, n_types=5, vocab_size=50)
    + 3 * 64 * 8
    + 6 * 3 * 12 * 8
)
#: 8 positions of 50 logits at 8 bytes, and the residual stream's float32 gradient
LOSS = 8 * 50 * 8 + 8 * 8 * 4
#: float64 rows ×3, 3 slots of d × d Gram matrices, each row's 12 energy sums
ACCUMULATION = 3 * 8 * 8 * 8 + 3 * 64 * 8 + 8 * 12 * 8
#: 10 kept and 8 offered rows of float32 H and G (64 bytes) and four 8-byte columns
RESERVOIR = (10 + 8) * (64 + 32)
#: 9 slots (3 sites × 3 bins) × 2 draws × d × 7 columns, float64
DRAWS = 9 * 2 * 8 * 7 * 8
#: the null's pool (16·10·9) and type sums (2·5·9·8) beat semi-NMF's 20·10·8; 4 d × d float64
PROBES = 16 * 10 * 9 + 2 * 5 * 9 * 8 + 4 * 64 * 8


def _parts(plan: MemoryPlan) -> dict[str, tuple[str, int]]:
    return {p.name: (p.where, p.bytes) for p in plan.parts}


def test_one_pass_on_a_gpu_holds_every_part_on_the_device():
    assert saved_per_block(SHAPE, 4, 2, 4) == PER_BLOCK == 4560
    assert probe_bytes(INPUTS) == PROBES and held_draws_bytes(INPUTS) == DRAWS
    # without type sums the refit's copies (20·10·8) beat the null's pool (16·10·9)
    assert probe_bytes(dataclasses.replace(INPUTS, n_types=0)) == 20 * 10 * 8 + 4 * 64 * 8
    plan = memory_plan(INPUTS)
    saved = 4 * PER_BLOCK  # the embedding is captured: every block's backward is kept
    assert _parts(plan) == {
        "weights": ("accelerator", WEIGHTS),
        "saved for the backward": ("accelerator", saved),
        "site tensors": ("accelerator", 3 * 8 * 8 * 4 * 2),
        "loss chunk": ("accelerator", LOSS),
        "statistics": ("accelerator", 3 * PER_SITE),
        "accumulation": ("accelerator", ACCUMULATION),
        "reservoir": ("accelerator", 3 * RESERVOIR),
        "control draws": ("accelerator", DRAWS),
        "probes": ("accelerator", PROBES),
        "loading": ("host", 2 * WEIGHTS),
    }
    # the loss's chunk on top of the saved activations is the heaviest phase
    assert LOSS + saved > max(saved + 1536, 1536 + ACCUMULATION, PROBES + DRAWS)
    assert plan.accelerator_peak == WEIGHTS + 3 * PER_SITE + 3 * RESERVOIR + LOSS + saved
    assert plan.host_peak == 2 * WEIGHTS and plan.passes == 1


def test_the_probes_phase_sets_the_peak_when_it_is_the_heaviest():
    many = dataclasses.replace(INPUTS, draws=200)  # 100 × the draws: 806 400 bytes
    plan = memory_plan(many)
    assert _parts(plan)["control draws"] == ("accelerator", 100 * DRAWS)
    assert plan.accelerator_peak == WEIGHTS + 3 * PER_SITE + 3 * RESERVOIR + PROBES + 100 * DRAWS


def test_forward_only_captures_keep_one_block_and_no_gradients():
    plan = memory_plan(dataclasses.replace(INPUTS, gradients=False))
    parts = _parts(plan)
    assert parts["saved for the backward"][1] == PER_BLOCK
    assert parts["site tensors"][1] == 3 * 8 * 8 * 4
    assert parts["loss chunk"][1] == 8 * 50 * 8  # s + 4 bytes per logit, no residual gradient
    assert parts["reservoir"][1] == 3 * (10 + 8) * (32 + 32)  # float32 H alone


def test_several_passes_hold_one_pass_on_the_device_and_every_pass_on_the_host():
    plan = memory_plan(dataclasses.replace(INPUTS, passes=3))
    parts = _parts(plan)
    # the heaviest pass is the embedding's: all 4 blocks kept, one site's tensors
    assert parts["saved for the backward"] == ("accelerator", 4 * PER_BLOCK)
    assert parts["site tensors"] == ("accelerator", 8 * 8 * 4 * 2)
    assert parts["statistics"] == ("accelerator", PER_SITE)
    assert parts["reservoir"] == ("accelerator", RESERVOIR)
    assert parts["probes"] == ("host", PROBES) and parts["control draws"] == ("host", DRAWS)
    assert parts["statistics (host copy)"] == ("host", 3 * PER_SITE)
    assert parts["reservoir (host copy)"] == ("host", 3 * RESERVOIR)
    assert plan.accelerator_peak == WEIGHTS + PER_SITE + RESERVOIR + LOSS + 4 * PER_BLOCK
    host = 3 * PER_SITE + 3 * RESERVOIR + PROBES + DRAWS
    assert plan.host_peak == max(2 * WEIGHTS, host) and plan.passes == 3
    many = memory_plan(dataclasses.replace(INPUTS, passes=3, draws=200))  # the host's peak
    assert many.host_peak == 3 * PER_SITE + 3 * RESERVOIR + PROBES + 100 * DRAWS > 2 * WEIGHTS


def test_the_cpu_holds_everything_on_the_host():
    plan = memory_plan(dataclasses.replace(INPUTS, device="cpu", passes=3))
    parts = _parts(plan)
    assert plan.accelerator_peak == 0
    assert {where for where, _ in parts.values()} == {"host"}
    assert parts["statistics"][1] == 3 * PER_SITE  # every pass's, not one
    peak = WEIGHTS + 3 * PER_SITE + 3 * RESERVOIR + LOSS + 4 * PER_BLOCK
    assert plan.host_peak == max(2 * WEIGHTS, peak)
    assert "statistics (host copy)" not in parts
    # a light capture: loading the model (its weights twice) is the host's peak
    light = dict(bins=0, n_types=0, energy_methods=0, energy_drift=False, draws=0, reservoir=0)
    small = dataclasses.replace(INPUTS, device="cpu", gradients=False, batch=1, **light)
    assert memory_plan(small).host_peak == 2 * WEIGHTS


@pytest.mark.parametrize(
    "sites, blocks",
    [
        ((("embed", None),), 4),
        ((("resid_pre", 0),), 4),
        ((("resid_post", 0),), 3),  # a site at the output of block 0 needs none of block 0
        ((("resid_mid", 2), ("resid_post", 1)), 2),
        ((("resid_post", 3),), 0),
        ((), 0),
    ],
)
def test_the_backward_keeps_the_blocks_above_the_lowest_site(sites, blocks):
    assert memory._saving_blocks(SHAPE, sites) == blocks


def test_below_float32_the_loss_and_loading_hold_float32_copies():
    half = dataclasses.replace(INPUTS, dtype="bfloat16")
    parts = _parts(memory_plan(half))
    weights = SHAPE.n_parameters() * 2 + SHAPE.n_buffer_bytes(2)
    assert parts["loading"][1] == weights + 4 * SHAPE.n_parameters() + 50 * 8 * 2
    assert parts["loss chunk"][1] == 8 * 50 * 14 + 8 * 8 * 4  # s + 12 bytes per logit


def test_control_draw_columns_and_their_cap():
    assert control_draw_columns(4, False, 2) == 16
    assert control_draw_columns(4, True, 2) == 19  # m̂'s draw, exchangeable and complement
    assert control_draw_columns(1, True, 2) == 6  # m̂'s draw is the rank-1 draw
    cap = memory.REUSED_DRAWS_BYTES
    assert cap == 256 * 2**20
    per_draw = DRAWS // 2
    at_cap = dataclasses.replace(INPUTS, draws=cap // per_draw + 1)
    assert held_draws_bytes(at_cap) == cap


def test_a_plan_at_its_budget_fits_and_one_byte_less_is_refused():
    plan = memory_plan(INPUTS)
    peak = plan.accelerator_peak
    assert plan.problem(accelerator=peak, host=plan.host_peak) is None
    assert plan.problem(accelerator=None, host=None) is None
    line = plan.problem(accelerator=peak - 1, host=None)
    assert line.startswith(
        f"the sweep will not fit: it needs {peak / GIB:.2f} GiB of accelerator memory at its "
        f"peak, {(peak - 1) / GIB:.2f} GiB is available — "
    )
    # the three largest accelerator parts, each with the key that shrinks it
    largest = sorted((p for p in plan.parts if p.where == "accelerator"), key=lambda p: -p.bytes)[
        :3
    ]
    assert line.endswith(
        "; ".join(f"{p.name} {p.bytes / GIB:.2f} GiB: reduce {p.reduce}" for p in largest)
    )
    assert largest[0].name == "weights" and "loading" not in line
    host = plan.problem(accelerator=None, host=plan.host_peak - 1)
    assert "of host memory" in host and host.endswith("loading 0.00 GiB: reduce suite.dtype")


def test_check_fits_holds_the_plan_to_both_budgets():
    plan = memory_plan(INPUTS)
    assert check_fits(INPUTS, accelerator=None, host=plan.host_peak) == plan
    with pytest.raises(ValueError, match=r"^the sweep will not fit: .* GiB of host memory"):
        check_fits(INPUTS, accelerator=None, host=plan.host_peak - 1)
    with pytest.raises(ValueError, match=r"^the sweep will not fit: .* of accelerator memory"):
        check_fits(INPUTS, accelerator=plan.accelerator_peak - 1, host=None)


def test_the_fewest_passes_that_fit_and_the_remedies_when_none_does():
    plans = memory_plans(dataclasses.replace(INPUTS, passes=0))
    assert [p.passes for p in plans] == [1, 2, 3]
    assert memory_plans(INPUTS) == (memory_plan(INPUTS),)
    auto = dataclasses.replace(INPUTS, passes=0)
    two = plans[1].accelerator_peak
    assert plans[0].accelerator_peak > two  # one pass does not fit where two do
    assert fitting_plan(plans, auto, accelerator=two, host=None).passes == 2
    assert fitting_plan(plans, auto, accelerator=two - 1, host=None).passes == 3
    one = memory_plan(INPUTS)
    peak = {
        (b, p): memory_plan(dataclasses.replace(INPUTS, batch=b, passes=p)).accelerator_peak
        for b in (1, 2)
        for p in (2, 3)
    }
    batch_1 = memory_plan(dataclasses.replace(INPUTS, batch=1)).accelerator_peak
    assert peak[2, 3] < batch_1 < peak[2, 2]

    def remedy(budget: int) -> str:
        with pytest.raises(ValueError) as error:
            fitting_plan((one,), INPUTS, accelerator=budget, host=None)
        return str(error.value).split(" (")[-1]

    assert remedy(peak[2, 2]) == "data.batch_size = 1 or capture.passes = 2 fits)"
    assert remedy(batch_1) == "data.batch_size = 1 or capture.passes = 3 fits)"
    assert remedy(batch_1 - 1) == "capture.passes = 3 fits)"
    assert remedy(peak[2, 3]) == "capture.passes = 3 fits)"
    assert remedy(peak[2, 3] - 1) == (
        "no data.batch_size or capture.passes fits without fewer sites, bins or type sums)"
    )


def test_the_batch_that_fits_is_found_at_its_boundary():
    inputs = dataclasses.replace(INPUTS, batch=4)
    peaks = {
        b: memory_plan(dataclasses.replace(inputs, batch=b)).accelerator_peak for b in (1, 2, 3)
    }
    assert fitting_batch(inputs, peaks[3]) == 3
    assert fitting_batch(inputs, peaks[3] - 1) == 2
    assert fitting_batch(inputs, 2 * peaks[2], 2.0) == 2
    assert fitting_batch(inputs, peaks[1]) == 1  # the smallest batch is a batch
    assert fitting_batch(inputs, peaks[1] - 1) is None


def test_out_of_memory_names_the_device_scale_and_budget():
    inputs = dataclasses.replace(INPUTS, batch=4)
    planned = memory_plan(inputs).accelerator_peak
    line = out_of_memory_line("step-3", inputs, planned // 2, None)
    # less needed than planned: the plan stands as it is, against its own peak
    assert line.startswith(
        f"unit step-3 ran out of GPU memory: it needed ≥ {planned / 2 / GIB:.2f}"
    )
    assert line.endswith(
        f"the plan's peak at data.batch_size = 4 is {planned / GIB:.2f} GiB; "
        "set data.batch_size = 3 (fits once the plan is scaled by 1.00)"
    )
    assert "available" not in line
    line = out_of_memory_line("step-3", inputs, 2 * planned, 2 * planned)
    assert f", {2 * planned / GIB:.2f} GiB available; set data.batch_size = 3" in line
    assert line.endswith("(fits once the plan is scaled by 2.00)")
    cpu = dataclasses.replace(inputs, device="cpu")
    line = out_of_memory_line("step-3", cpu, 10**15, GIB)
    assert line.startswith("unit step-3 ran out of host memory")
    assert line.endswith(
        "no data.batch_size fits: more capture.passes, fewer sites or a smaller model"
    )


def test_the_summary_names_the_models_side_and_its_largest_parts():
    plan = memory_plan(dataclasses.replace(INPUTS, passes=3))
    parts = sorted((p for p in plan.parts if p.where == "accelerator"), key=lambda p: -p.bytes)
    head = ", ".join(f"{p.name} {p.bytes / GIB:.2f} GiB" for p in parts[:3])
    assert plan.summary() == (
        f"memory plan (float32, 3 capture passes): accelerator {plan.accelerator_peak / GIB:.2f}"
        f" GiB, host {plan.host_peak / GIB:.2f} GiB — {head}"
    )
    cpu = memory_plan(dataclasses.replace(INPUTS, device="cpu"))
    assert cpu.summary() == (
        f"memory plan (float32): host {cpu.host_peak / GIB:.2f} GiB — loading 0.00 GiB, "
        "weights 0.00 GiB, statistics 0.00 GiB"
    )
    lines = cpu.render().splitlines()
    assert lines[0] == cpu.summary() and len(lines) == 1 + len(cpu.parts)
    size = f"{WEIGHTS / GIB:.2f} GiB"
    assert lines[1] == f"  {'weights':<24}{'host':<13}{size:>12}  exact"
    assert lines[2].endswith("  modelled")


def test_the_plan_as_json():
    plan = MemoryPlan("cuda", "float32", 2, 5, 7, (MemoryPart("w", "host", 3, True, "k"),))
    assert plan.to_dict() == {
        "summary": plan.summary(),
        "device": "cuda",
        "dtype": "float32",
        "passes": 2,
        "accelerator_peak_bytes": 5,
        "host_peak_bytes": 7,
        "parts": [{"name": "w", "where": "host", "bytes": 3, "exact": True}],
    }


def _part_bytes(**change) -> dict[str, int]:
    """Each part's bytes in the plan of ``INPUTS`` with ``change``."""
    return {p.name: p.bytes for p in memory_plan(dataclasses.replace(INPUTS, **change)).parts}


def test_a_sites_statistics_count_only_what_the_capture_keeps():
    """Without type sums no vocabulary table; without drift sums a width of 1 + methods; without
    energy sums no projectors and no sums (each by hand, as PER_SITE)."""

    def statistics(**change) -> int:
        return _part_bytes(**change)["statistics"] // len(SITES)

    moments = statistics_bytes(8, gradients=True, n_bins=2, bin_moments=True, n_types=0)
    assert statistics(n_types=0) == moments + 3 * 64 * 8 + 6 * 3 * 12 * 8
    typed = statistics_bytes(
        8, gradients=True, n_bins=2, bin_moments=True, n_types=5, vocab_size=50
    )
    assert statistics(energy_drift=False) == typed + 3 * 64 * 8 + 6 * 3 * (1 + 3) * 8
    assert statistics(energy_methods=0, energy_drift=False) == typed


def test_the_loss_chunk_holds_what_the_loss_keeps():
    """Forward only: 8 positions of 50 float32 logits with their float32 log-probabilities, no
    residual gradient; a model without a head: no logits at all."""
    assert _part_bytes(gradients=False)["loss chunk"] == 8 * 50 * (4 + 4)
    half = _part_bytes(gradients=False, dtype="bfloat16")
    assert half["loss chunk"] == 8 * 50 * (2 + 4)  # bfloat16 logits, float32 log-probabilities
    headless = _part_bytes(shape=dataclasses.replace(SHAPE, has_head=False))
    assert headless["loss chunk"] == 0


def test_each_part_says_where_it_lives_whether_it_is_exact_and_which_key_shrinks_it():
    """The printed plan's last column (exact or modelled) and the keys a refusal names as
    remedies (docs/memory.md), part by part, with two passes (the host copies too)."""
    plan = memory_plan(dataclasses.replace(INPUTS, passes=2))
    statistics = (
        "capture.layers/sites (or more capture.passes), data.n_bins, proxies.methods "
        "(frozen-early energy sums) or the probes that keep type sums"
    )
    device = "accelerator"
    assert [(p.name, p.where, p.exact, p.reduce) for p in plan.parts] == [
        ("weights", device, True, "suite.dtype"),
        ("saved for the backward", device, False, "data.batch_size or data.seq_len"),
        ("site tensors", device, True, "capture.layers/sites or data.batch_size"),
        ("loss chunk", device, False, "data.batch_size"),
        ("statistics", device, True, statistics),
        ("accumulation", device, False, "data.batch_size or data.n_bins"),
        ("reservoir", device, True, "capture.reservoir"),
        ("control draws", "host", False, "proxies.draws"),  # two passes: the probes run there
        ("probes", "host", False, "capture.reservoir"),
        ("loading", "host", False, "suite.dtype"),
        ("statistics (host copy)", "host", True, statistics),
        ("reservoir (host copy)", "host", True, "capture.reservoir"),
    ]
    assert (plan.device, plan.dtype, plan.passes) == ("cuda", "float32", 2)
    one = memory_plan(INPUTS)
    assert (one.device, one.dtype, one.passes) == ("cuda", "float32", 1)
    fewest = memory_plan(dataclasses.replace(INPUTS, passes=0))  # as one pass, until chosen
    assert fewest.passes == 1 and fewest.accelerator_peak == one.accelerator_peak


def test_the_accumulation_counts_energy_rows_and_the_reservoir_only_when_kept():
    """Each row's energy sums are 1 + methods wide (+ d drift sums only with them), none
    without energy sums; no reservoir rows without a reservoir."""
    rows = 3 * 8 * 8 * 8 + 3 * 64 * 8  # the float64 rows and the per-bin Gram matrices
    undrifted = _part_bytes(energy_drift=False)
    assert undrifted["accumulation"] == rows + 8 * (1 + 3) * 8 == ACCUMULATION - 8 * 8 * 8
    assert _part_bytes(energy_methods=0, energy_drift=False)["accumulation"] == rows
    assert _part_bytes(reservoir=0)["reservoir"] == 0


def test_the_site_tensors_and_the_accumulation_can_set_the_peak():
    """With no loss to keep and one block saved, the phase of a batch's float64 copies on top
    of the site tensors is the heaviest."""
    light = dict(gradients=False, sites=(("resid_post", 3),), bins=16, draws=0, reservoir=0)
    plan = memory_plan(dataclasses.replace(INPUTS, **light))
    parts = {p.name: p.bytes for p in plan.parts}
    tensors, accumulation = parts["site tensors"], parts["accumulation"]
    phases = (
        parts["loss chunk"] + parts["saved for the backward"],
        parts["saved for the backward"] + tensors,
        tensors + accumulation,
        parts["probes"] + parts["control draws"],
    )
    assert max(phases) == tensors + accumulation > max(phases[:2] + phases[3:])
    held = parts["weights"] + parts["statistics"] + parts["reservoir"]
    assert plan.accelerator_peak == held + tensors + accumulation
