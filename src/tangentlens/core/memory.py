"""The sweep's memory plan: peak accelerator and host memory of a recipe's units, from the recipe
and the suite's ``config.json`` alone — plain arithmetic, no torch, no weights loaded.

What a model unit holds at its peak (``n`` = batch × seq_len tokens, ``s`` = bytes per weight
element at ``suite.dtype``):

* **weights** — the TransformerLens model's parameters and buffers at ``s`` bytes
  (:meth:`~tangentlens.models.shapes.ModelShape.n_parameters`; exact);
* **saved for the backward** — what autograd keeps per block above the first captured site
  (parameters are frozen, so nothing below it is kept): per block
  ``a·n·d + b·n·d_mlp + (2s + 1)·batch·heads·T² + c·n + e·d² + f·d·d_mlp + T²`` bytes, the
  coefficients of each family and dtype measured with ``torch.autograd.graph.saved_tensors_hooks``
  on TransformerLens (:data:`SAVED_PER_BLOCK`; the test re-measures them exactly). The attention
  pattern is the ``batch·heads·T²`` term;
* **site tensors** — each captured site's activations and, with gradients, its gradient
  (``n·d·s`` each, alive from the forward or backward until accumulated);
* **loss** — one chunk of logits (:func:`~tangentlens.capture.chunks.loss_chunk_rows` positions ×
  vocabulary): at float32 the buffer the gradient is written out in and a transient of its size
  (measured), below float32 the float32 cast, log-probabilities and their gradient (autograd);
  and the residual stream's gradient;
* **statistics** — per site the float64 moments overall and per frequency bin, per-type sums of
  the types the probes use, per-sequence energy sums (exact byte counts);
* **accumulation** — float64 copies of one site's kept rows and the per-bin Gram matrices while
  a batch is folded in;
* the **row reservoir** (per site: its capacity allocated up front, float32 H and G, token and
  bin, int64 ids and float64 priorities on the host, one batch of offered rows), on the
  model's device;
* **probes** — after the capture, the largest working set of one probe on one site (modelled:
  a semi-NMF refit's float64 and float32 copies of the site's sampled rows, ``20`` bytes per
  entry, or the frequency null's residual pool and per-type sums; and four d × d float64
  matrices of an eigen-decomposition), with the **control draws** the step's probes keep
  (tangent_energy's Gaussian draws and frames of both families, at most
  :data:`REUSED_DRAWS_BYTES`: ``tangentlens.metrics.reused_draws``), on top of the statistics
  and the reservoir. Nothing is drawn before the capture: the per-sequence energy sums give the
  controls' exact means;
* host, loading: **the Hugging Face model and its TransformerLens copy** (2 × weights at
  float32; below float32, TransformerLens' weight processing holds the state dict in float32
  and casts it back: weights + 4 bytes × parameters + the embedding).

Everything of a step stays on the model's device — the probes compute where the statistics are
— unless the sites are captured in several passes (``capture.passes``): then each pass's
statistics and sampled rows go to the host when the pass ends (the device holds one pass's),
and the probes run there. Peaks take the largest phase (loss; backward; accumulation; the
probes) on top of what lives throughout. Allocator slack and kernel workspaces are not
modelled: the plan is checked against measured peaks (``tests/integration/test_memory_plan.py``).
Multi-device placement is not planned.

A GPU's budget is the memory free on it when a unit starts (``torch.cuda.mem_get_info``: the
CUDA context, other processes and earlier allocations already deducted) less a stated
**headroom** (:func:`headroom_bytes`: 1 GiB for kernel workspaces — cuBLAS, cuDNN — plus 5 % of
the device's memory for the caching allocator's fragmentation). A unit that still runs out of
memory fails in one line (:func:`out_of_memory_line`) naming the unit, the plan's peak, what the
unit needed and the largest ``data.batch_size`` whose plan, scaled by what the unit needed
beyond its plan, fits; it is not retried unchanged.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tangentlens.capture.chunks import loss_chunk_rows, statistics_bytes
from tangentlens.capture.request import CaptureRequest
from tangentlens.core.recipe import Recipe, select_layers, site_groups
from tangentlens.models.shapes import ModelShape

__all__ = [
    "DTYPE_BYTES",
    "SAVED_PER_BLOCK",
    "MemoryPart",
    "MemoryPlan",
    "PlanInputs",
    "check_fits",
    "control_draw_columns",
    "fitting_batch",
    "fitting_plan",
    "headroom_bytes",
    "held_draws_bytes",
    "host_budget",
    "memory_plan",
    "memory_plans",
    "out_of_memory_line",
    "probe_bytes",
    "reservoir_bytes",
    "saved_per_block",
]

GIB = 1024**3

#: What a step keeps of its control draws at most: ``tangentlens.metrics.REUSED_DRAWS_BYTES``
#: (the plan imports no torch; a test keeps the two equal).
REUSED_DRAWS_BYTES = 256 * 2**20

#: Bytes per element of each ``suite.dtype``.
DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}

#: Bytes autograd saves per block, as coefficients of
#: ``(n·d, n·d_mlp, batch·heads·T², n, d², d·d_kv, d·d_mlp, T²)`` (``d_kv`` = key/value
#: heads × d_head), by family and bytes per element. Measured on TransformerLens 3.9 (float32 = 4,
#: bfloat16/float16 = 2): LayerNorm statistics and normalised inputs stay float32 whatever the
#: weights' dtype; the ``d²`` terms are the contiguous copies of the attention (and, Llama, MLP)
#: weights TransformerLens' einsums save; ``T²`` is the causal mask's slice.
SAVED_PER_BLOCK: dict[str, dict[int, tuple[int, ...]]] = {
    "gpt_neox": {4: (28, 4, 9, 16, 16, 0, 0, 1), 2: (22, 2, 5, 16, 8, 0, 0, 1)},
    "bert": {4: (20, 4, 9, 8, 16, 0, 0, 0), 2: (14, 2, 5, 8, 8, 0, 0, 0)},
    "llama": {4: (20, 12, 9, 16, 8, 8, 12, 1), 2: (22, 6, 5, 16, 4, 4, 6, 1)},
}


def saved_per_block(shape: ModelShape, itemsize: int, batch: int, seq_len: int) -> int:
    """Bytes autograd keeps for one block's backward (see :data:`SAVED_PER_BLOCK`)."""
    coefficients = SAVED_PER_BLOCK[shape.family][itemsize]
    n, d, m = batch * seq_len, shape.d_model, shape.d_mlp
    kv = shape.n_kv_heads * shape.d_head
    terms = (
        n * d,
        n * m,
        batch * shape.n_heads * seq_len**2,
        n,
        d * d,
        d * kv,
        d * m,
        seq_len**2,
    )
    return sum(c * t for c, t in zip(coefficients, terms, strict=True))


@dataclass(frozen=True)
class PlanInputs:
    """What of a recipe the plan reads (no probe or model library needed to build it).

    ``sites``: ``(kind, block)`` of every captured site (block None for the embedding);
    ``gradients``: the step units run a backward; ``bins``: frequency bins kept (0 = none);
    ``bin_moments``: per-bin d × d moments of G; ``n_types``: types with per-type sums (0 =
    none); ``reservoir``: rows sampled per site (0 = none); ``energy_methods``: proxies whose
    per-sequence energy sums the capture gathers, the mean direction included (0 = none;
    frozen-early intervals); ``energy_drift``: those sums keep the drift sums ``Σ (m̂ᵀg) g``
    (d per sequence and slot: the proxies avoid m̂); ``n_sequences``: analysed sequences;
    ``passes``: capture passes
    over groups of the sites (0 = the fewest that fit, chosen by :func:`check_fits`);
    ``draws``: control draws per seed key the step's probes make and keep, 0 = none;
    ``draw_columns``: the columns kept per draw, site and frequency-bin slot (the ranks of the
    Gaussian draws and of the frames, each distinct one once: :func:`control_draw_columns`).
    """

    shape: ModelShape
    dtype: str
    device: str
    batch: int
    seq_len: int
    sites: tuple[tuple[str, int | None], ...]
    gradients: bool
    bins: int
    bin_moments: bool
    n_types: int
    reservoir: int
    energy_methods: int
    n_sequences: int
    passes: int = 1
    draws: int = 0
    draw_columns: int = 0
    energy_drift: bool = False

    @classmethod
    def of(cls, recipe: Recipe, request: CaptureRequest, shape: ModelShape) -> PlanInputs:
        """What the plan reads of ``recipe`` on models of ``shape``: the sites it captures and
        what a step's capture keeps (``request``, read as the capture reads it; type sums
        for at most ``request.type_limit`` types, the analysis data being unread before the
        plan), and the control frames of the proxies stage."""
        sites: list[tuple[str, int | None]] = [("embed", None)] if recipe.capture.embed else []
        layers = select_layers(recipe.capture.layers, shape.n_layers)
        sites += [(kind, layer) for kind in recipe.capture.sites for layer in layers]
        stage, kept = recipe.proxies, request.kept
        draws, draw_columns, energy_methods = 0, 0, 0
        if stage is not None:
            methods = len(stage.methods) + (stage.pretrained_sae is not None)
            draws = stage.draws
            draw_columns = control_draw_columns(stage.rank, stage.mean_direction, methods)
            if request.sequence_sums:
                energy_methods = methods + stage.mean_direction
        return cls(
            shape=shape,
            dtype=recipe.suite.dtype,
            device="cpu" if recipe.suite.device == "cpu" else "cuda",
            batch=recipe.data.batch_size,
            seq_len=recipe.data.seq_len,
            sites=tuple(sites),
            gradients=kept.gradients and shape.has_head,
            bins=request.n_bins,
            bin_moments=kept.bin_moments,
            n_types=min(shape.d_vocab, request.type_limit) if kept.type_sums else 0,
            reservoir=request.reservoir,
            energy_methods=energy_methods,
            n_sequences=recipe.data.max_tokens // recipe.data.seq_len,
            passes=recipe.capture.passes,
            draws=draws,
            draw_columns=draw_columns,
            energy_drift=bool(energy_methods) and stage is not None and stage.mean_direction,
        )


@dataclass(frozen=True)
class MemoryPart:
    """One term of the plan: ``where`` ("accelerator" or "host"), its bytes, whether they are
    ``exact`` (deterministic buffers) or modelled, and the recipe key that shrinks it."""

    name: str
    where: str
    bytes: int
    exact: bool
    reduce: str


@dataclass(frozen=True)
class MemoryPlan:
    """Peak bytes on the accelerator (0 when the model runs on the CPU) and on the host, and
    the parts they are made of, with the sites captured in ``passes`` passes."""

    device: str
    dtype: str
    passes: int
    accelerator_peak: int
    host_peak: int
    parts: tuple[MemoryPart, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary(),
            "device": self.device,
            "dtype": self.dtype,
            "passes": self.passes,
            "accelerator_peak_bytes": self.accelerator_peak,
            "host_peak_bytes": self.host_peak,
            "parts": [
                {"name": p.name, "where": p.where, "bytes": p.bytes, "exact": p.exact}
                for p in self.parts
            ],
        }

    def summary(self) -> str:
        """One line: both peaks and the three largest parts of the first (the model's device)."""
        side = "host" if self.device == "cpu" else "accelerator"
        largest = sorted((p for p in self.parts if p.where == side), key=lambda p: -p.bytes)[:3]
        parts = ", ".join(f"{p.name} {_gib(p.bytes)}" for p in largest)
        accelerator = (
            f"accelerator {_gib(self.accelerator_peak)}, " if self.accelerator_peak else ""
        )
        passes = f", {self.passes} capture passes" if self.passes > 1 else ""
        return (
            f"memory plan ({self.dtype}{passes}): {accelerator}host {_gib(self.host_peak)} — "
            f"{parts}"
        )

    def render(self) -> str:
        """The summary line, then one line per part: where, size, exact or modelled."""
        lines = [self.summary()]
        for p in self.parts:
            kind = "exact" if p.exact else "modelled"
            lines.append(f"  {p.name:<24}{p.where:<13}{_gib(p.bytes):>12}  {kind}")
        return "\n".join(lines)

    def problem(self, *, accelerator: int | None, host: int | None) -> str | None:
        """One line naming the peak that exceeds its budget (bytes; None = unknown, not
        checked) and the three largest parts with the recipe keys that shrink them; None when
        the plan fits."""
        for where, peak, budget in (
            ("accelerator", self.accelerator_peak, accelerator),
            ("host", self.host_peak, host),
        ):
            if budget is None or peak <= budget:
                continue
            mine = [p for p in self.parts if p.where == where]  # on a CPU: all "host"
            largest = sorted(mine, key=lambda p: -p.bytes)[:3]
            hints = "; ".join(f"{p.name} {_gib(p.bytes)}: reduce {p.reduce}" for p in largest)
            return (
                f"the sweep will not fit: it needs {_gib(peak)} of {where} memory at its peak, "
                f"{_gib(budget)} is available — {hints}"
            )
        return None


def memory_plans(inputs: PlanInputs) -> tuple[MemoryPlan, ...]:
    """The plans of ``inputs``: one, or with ``passes`` 0 one per number of capture passes
    (1 … one per site), from which :func:`fitting_plan` picks the fewest that fit where a unit
    runs."""
    if inputs.passes:
        return (memory_plan(inputs),)
    counts = range(1, len(inputs.sites) + 1)
    return tuple(memory_plan(dataclasses.replace(inputs, passes=p)) for p in counts)


def fitting_plan(
    plans: Sequence[MemoryPlan],
    inputs: PlanInputs,
    *,
    accelerator: int | None,
    host: int | None,
) -> MemoryPlan:
    """The first of ``plans`` (:func:`memory_plans` of ``inputs``) within the budgets (bytes;
    None = not checked), or a ``ValueError`` in one line naming the largest parts of the last,
    what reduces them and, when one does, the largest ``data.batch_size`` or the fewest
    ``capture.passes`` that fit."""
    for plan in plans:
        if plan.problem(accelerator=accelerator, host=host) is None:
            return plan
    last = plans[-1]
    inputs = dataclasses.replace(inputs, passes=last.passes)

    def fits(**change: int) -> bool:
        plan = memory_plan(dataclasses.replace(inputs, **change))
        return plan.problem(accelerator=accelerator, host=host) is None

    n_sites = len(inputs.sites)
    batch = next((b for b in range(inputs.batch - 1, 0, -1) if fits(batch=b)), None)
    passes = next((p for p in range(inputs.passes + 1, n_sites + 1) if fits(passes=p)), None)
    remedies = [f"data.batch_size = {batch}" for _ in [batch] if batch]
    remedies += [f"capture.passes = {passes}" for _ in [passes] if passes]
    tail = (
        f" ({' or '.join(remedies)} fits)"
        if remedies
        else " (no data.batch_size or capture.passes fits without fewer sites, bins or type sums)"
    )
    raise ValueError(f"{last.problem(accelerator=accelerator, host=host)}{tail}")


def check_fits(inputs: PlanInputs, *, accelerator: int | None, host: int | None) -> MemoryPlan:
    """The plan of ``inputs`` — with ``passes`` 0, the fewest capture passes that fit — or a
    ``ValueError`` in one line when it exceeds a budget (:func:`fitting_plan`)."""
    return fitting_plan(memory_plans(inputs), inputs, accelerator=accelerator, host=host)


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


#: The headroom a GPU's budget leaves: kernel workspaces (cuBLAS, cuDNN) ...
HEADROOM_FIXED = GIB
#: ... and the caching allocator's fragmentation, as a share of the device's memory.
HEADROOM_SHARE = 0.05


def headroom_bytes(total: int) -> int:
    """What a GPU's budget keeps free of a device with ``total`` bytes:
    :data:`HEADROOM_FIXED` plus :data:`HEADROOM_SHARE` of ``total``."""
    return HEADROOM_FIXED + int(HEADROOM_SHARE * total)


def _peak(plan: MemoryPlan) -> int:
    """The peak on the model's device (the host's on the CPU)."""
    return plan.host_peak if plan.device == "cpu" else plan.accelerator_peak


def fitting_batch(inputs: PlanInputs, budget: int, scale: float = 1.0) -> int | None:
    """The largest ``data.batch_size`` below ``inputs.batch`` whose planned peak on the
    model's device, times ``scale`` (what a unit needed over its plan), is within ``budget``;
    None when none is."""
    for batch in range(inputs.batch - 1, 0, -1):
        if _peak(memory_plan(dataclasses.replace(inputs, batch=batch))) * scale <= budget:
            return batch
    return None


def out_of_memory_line(unit: str, inputs: PlanInputs, needed: int, budget: int | None) -> str:
    """One line for a unit that ran out of memory: the unit, what it ``needed`` at least (bytes
    held and asked for), the plan's peak at the recipe's batch and the ``budget`` it was checked
    against (None: the plan's peak stands for it), and the largest ``data.batch_size`` that fits
    once the plan is scaled by ``needed`` over its peak (:func:`fitting_batch`)."""
    planned = _peak(memory_plan(inputs))
    where = "host" if inputs.device == "cpu" else "GPU"
    scale = max(needed / planned, 1.0)  # a peak holds the weights: never 0
    limit = planned if budget is None else budget
    batch = fitting_batch(inputs, limit, scale)
    against = "" if budget is None else f", {_gib(budget)} available"
    remedy = (
        f"set data.batch_size = {batch} (fits once the plan is scaled by {scale:.2f})"
        if batch
        else "no data.batch_size fits: more capture.passes, fewer sites or a smaller model"
    )
    return (
        f"unit {unit} ran out of {where} memory: it needed ≥ {_gib(needed)}, the plan's peak at "
        f"data.batch_size = {inputs.batch} is {_gib(planned)}{against}; {remedy}"
    )


def _statistics_bytes(inputs: PlanInputs) -> int:
    """One site's float64 statistics: moments, type sums and, with per-sequence energy sums,
    their projectors (``M`` d × d matrices ``P_Q``) and sums (``S × slots × (1 + M)``, and the
    drift sums ``S × slots × d`` where the proxies avoid m̂)."""
    d, methods, slots = inputs.shape.d_model, inputs.energy_methods, inputs.bins + 1
    moments = statistics_bytes(
        d,
        gradients=inputs.gradients,
        n_bins=inputs.bins,
        bin_moments=inputs.bin_moments,
        n_types=inputs.n_types,
        vocab_size=inputs.shape.d_vocab if inputs.n_types else 0,
    )
    projectors = methods * d * d * 8
    width = 1 + methods + (d if inputs.energy_drift else 0)
    sums = inputs.n_sequences * slots * width * 8 if methods else 0
    return moments + projectors + sums


def reservoir_bytes(inputs: PlanInputs) -> int:
    """Bytes of one site's row reservoir: its ``capacity`` rows allocated up front (float32 H
    and, with gradients, G; int64 token, bin, id; float64 priority) and one batch of offered
    rows."""
    d, n = inputs.shape.d_model, inputs.batch * inputs.seq_len
    float_columns = d * 4 * (2 if inputs.gradients else 1)
    return inputs.reservoir * (float_columns + 4 * 8) + n * (float_columns + 4 * 8)


def probe_bytes(inputs: PlanInputs) -> int:
    """The largest working set of one probe on one site after the capture (modelled): a
    semi-NMF refit's copies of the sampled rows (float64 centred, float32 working: 20 bytes per
    entry with the transient float64 conversion), or the frequency null's residual pool, its
    table and the per-type sums (float64), whichever is larger; plus four d × d float64
    matrices (an eigen-decomposition's input, vectors and workspace)."""
    d = inputs.shape.d_model
    rows = 20 * inputs.reservoir * d
    null = 16 * inputs.reservoir * (d + 1) + 2 * inputs.n_types * (d + 1) * 8
    return max(rows, null) + 4 * d * d * 8


def control_draw_columns(rank: int, mean_direction: bool, methods: int) -> int:
    """Columns per draw, site and slot that a step's tangent-energy controls keep, for
    ``methods`` proxies of rank ``rank`` besides m̂: the Gaussian draw of rank ``rank``, the
    exchangeable frame (shared: every proxy avoids the same m̂) and one complement frame per
    proxy; with m̂, its rank-1 draw (the same as the proxies' at rank 1), its exchangeable frame
    (in ℝ^d) and its complement frame (in m̂⊥)."""
    columns = (2 + methods) * rank
    if mean_direction:
        columns += 3 - (rank == 1)
    return columns


def held_draws_bytes(inputs: PlanInputs) -> int:
    """Bytes of the control draws a step's probes keep (float64; the first
    :data:`REUSED_DRAWS_BYTES` of them: ``tangentlens.metrics.reused_draws``), where the probes
    run."""
    slots = len(inputs.sites) * (inputs.bins + 1)
    per_slot = inputs.draws * inputs.shape.d_model * inputs.draw_columns * 8
    return min(REUSED_DRAWS_BYTES, slots * per_slot)


def _saving_blocks(shape: ModelShape, sites: Sequence[tuple[str, int | None]]) -> int:
    """Blocks whose backward reaches a captured site's gradient: every block above the lowest
    site (a site at the output of block b needs none of block b)."""
    firsts = [-1 if block is None else block + (kind == "resid_post") for kind, block in sites]
    return shape.n_layers - max(0, min(firsts, default=shape.n_layers))


def memory_plan(inputs: PlanInputs) -> MemoryPlan:
    """The peak memory of the heaviest unit (a step unit's capture) of ``inputs``: with
    several capture passes, of the heaviest pass (the device holds one pass's statistics; the
    host collects every pass's)."""
    shape, s = inputs.shape, DTYPE_BYTES[inputs.dtype]
    d, n = shape.d_model, inputs.batch * inputs.seq_len
    accelerator = "host" if inputs.device == "cpu" else "accelerator"
    per_block = saved_per_block(shape, s, inputs.batch, inputs.seq_len)
    per_site = _statistics_bytes(inputs)
    weights = shape.n_parameters() * s + shape.n_buffer_bytes(s)
    # the Hugging Face weights and the TransformerLens copy; below float32 TransformerLens'
    # weight processing holds the whole state dict in float32 and casts it back tensor by
    # tensor, the embedding first (tests/integration/test_loading_peak.py)
    embedding = shape.d_vocab * d * s if s < 4 else 0
    loading = weights + max(weights, 4 * shape.n_parameters()) + embedding
    chunk = min(loss_chunk_rows(shape.d_vocab), n)
    # float32 weights: the gradient is written out in the logits buffer, yet the measured peaks
    # hold about two float32 logits per position (8.2 bytes on the CPU: one transient of the
    # chunk's size, not yet attributed); below float32 the float32 cast, the log-probabilities
    # and their gradient through autograd
    per_logit = (8 if s == 4 else s + 12) if inputs.gradients else s + 4
    logit_bytes = chunk * shape.d_vocab * per_logit
    grad_resid = n * d * 4 if inputs.gradients and shape.has_head else 0
    loss = (logit_bytes if shape.has_head else 0) + grad_resid
    # float64 rows (converted, reordered by bin), the per-bin Gram matrices and, with energy
    # sums, each row's sums (‖g‖², one per method, d drift sums where the proxies avoid m̂)
    width = 1 + inputs.energy_methods + (d if inputs.energy_drift else 0)
    energy_rows = n * width * 8 if inputs.energy_methods else 0
    accumulation = 3 * n * d * 8 + (inputs.bins + 1) * d * d * 8 + energy_rows
    per_reservoir = reservoir_bytes(inputs) if inputs.reservoir else 0
    draws = held_draws_bytes(inputs)
    statistics_total = len(inputs.sites) * per_site
    reservoir_total = len(inputs.sites) * per_reservoir
    groups = site_groups(inputs.sites, inputs.passes)
    # one pass: everything stays on the model's device for the probes; several: each pass's
    # statistics and rows go to the host when it ends, and the probes run there
    probes_where = "host" if len(groups) > 1 else accelerator
    probes = probe_bytes(inputs)

    def heaviest_pass(group: list[tuple[str, int | None]]) -> tuple[int, ...]:
        """(peak, saved, site tensors, statistics, reservoir) of one pass on the model's device:
        the loss's chunk lives before the backward, the site gradients after it, the float64
        copies while a batch is accumulated — one at a time on top of what lives throughout."""
        saved = _saving_blocks(shape, group) * per_block if inputs.gradients else per_block
        tensors = len(group) * n * d * s * (2 if inputs.gradients else 1)
        held = len(inputs.sites if inputs.device == "cpu" else group)
        statistics, reservoir = held * per_site, held * per_reservoir
        phases = max(loss + saved, saved + tensors, tensors + accumulation)
        if probes_where == accelerator:
            phases = max(phases, probes + draws)
        peak = weights + statistics + reservoir + phases
        return peak, saved, tensors, statistics, reservoir

    peak, saved, tensors, statistics, reservoir = max(heaviest_pass(g) for g in groups)
    by = "data.batch_size"
    statistics_hint = (
        "capture.layers/sites (or more capture.passes), data.n_bins, proxies.methods "
        "(frozen-early energy sums) or the probes that keep type sums"
    )
    parts = [
        MemoryPart("weights", accelerator, weights, True, "suite.dtype"),
        MemoryPart("saved for the backward", accelerator, saved, False, f"{by} or data.seq_len"),
        MemoryPart("site tensors", accelerator, tensors, True, f"capture.layers/sites or {by}"),
        MemoryPart("loss chunk", accelerator, loss, False, by),
        MemoryPart("statistics", accelerator, statistics, True, statistics_hint),
        MemoryPart("accumulation", accelerator, accumulation, False, f"{by} or data.n_bins"),
        MemoryPart("reservoir", accelerator, reservoir, True, "capture.reservoir"),
        MemoryPart("control draws", probes_where, draws, False, "proxies.draws"),
        MemoryPart("probes", probes_where, probes, False, "capture.reservoir"),
        MemoryPart("loading", "host", loading, False, "suite.dtype"),
    ]
    passes = inputs.passes or 1
    if inputs.device == "cpu":
        return MemoryPlan(inputs.device, inputs.dtype, passes, 0, max(loading, peak), tuple(parts))
    if probes_where == accelerator:
        return MemoryPlan(inputs.device, inputs.dtype, passes, peak, loading, tuple(parts))
    copies = (  # several passes: each pass's statistics and rows come to the host
        MemoryPart("statistics (host copy)", "host", statistics_total, True, statistics_hint),
        MemoryPart("reservoir (host copy)", "host", reservoir_total, True, "capture.reservoir"),
    )
    host = max(loading, statistics_total + reservoir_total + probes + draws)
    return MemoryPlan(inputs.device, inputs.dtype, passes, peak, host, (*parts, *copies))


def host_budget(recipe: Recipe) -> int | None:
    """Host memory a unit may use: ``executor.memory_gb`` when set, else this machine's
    physical memory where the units run on it (``local``, ``submitit-local``, a Ray cluster
    started here); None (not checked) for units on other machines."""
    executor = recipe.executor
    if executor.memory_gb:
        return int(executor.memory_gb * GIB)
    here = executor.kind in ("local", "submitit-local") or (
        executor.kind == "ray" and not os.environ.get("RAY_ADDRESS")
    )
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if here else None
