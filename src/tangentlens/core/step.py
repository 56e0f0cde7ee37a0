"""One checkpoint step, the way both a sweep's step unit and :func:`tangentlens.measure` do it:
the sites a recipe captures, one capture of a model over token rows, and every per-step probe's
rows from that capture. One code path: a notebook measurement and a sweep step on the same
model, tokens and settings give the same rows.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from tangentlens.capture import (
    CaptureConfig,
    CaptureStatistics,
    SequenceEnergyConfig,
    StatisticsConfig,
    capture_statistics,
    combine_site_passes,
)
from tangentlens.capture.captured import Capture
from tangentlens.capture.needs import Needs
from tangentlens.capture.precision import resolve_precision
from tangentlens.core.data import AnalysisData
from tangentlens.core.proxy_stage import ProxiesSpec
from tangentlens.core.recipe import Recipe, select_layers, site_groups
from tangentlens.data import iter_batches
from tangentlens.metrics import reused_draws
from tangentlens.models import lens_model
from tangentlens.proxies import (
    FittedProxies,
    FixedProxy,
    add_fixed_proxy,
    fit_proxies,
    fit_rows,
)
from tangentlens.registry import ProbeEntry, StepInputs
from tangentlens.results import make_row
from tangentlens.runtime import Phases, alongside

__all__ = [
    "Proxies",
    "Status",
    "capture_rows",
    "capture_scored",
    "capture_sites",
    "capture_step",
    "check_attention",
    "fit_step",
    "step_rows",
    "with_fixed",
]

#: A callback that shows a one-line status (the sweep's progress display).
Status = Callable[[str], None]
#: Tangent proxies by site, then method: ``{site: {method: basis (d × k)}}``.
Proxies = dict[str, dict[str, torch.Tensor]]


def _quiet(text: str) -> None:
    """A status callback that says nothing."""


def capture_sites(model: Any, recipe: Recipe) -> dict[str, int | None]:
    """Hook name → block index of every site the recipe captures (the embedding's is None);
    the probes needing attention statistics are refused here, in one line, when the model does
    not expose per-head queries, keys and patterns (see :func:`check_attention`)."""
    lens = lens_model(model)
    check_attention(lens, recipe)
    sites: dict[str, int | None] = {}
    if recipe.capture.embed:
        sites[lens.hook_name("embed")] = None
    for kind in recipe.capture.sites:
        for layer in select_layers(recipe.capture.layers, lens.n_layers):
            sites[lens.hook_name(kind, layer)] = layer
    return sites


def check_attention(model: Any, recipe: Recipe) -> None:
    """Refuse, in one line, the recipe's probes that need per-head attention statistics
    (``qk_drift``) on a model that does not expose them: no query, key or pattern hooks at
    every block (e.g. a state-space model's bridge), or grouped-query attention."""
    needing = [key for key, entry in recipe.probes.items() if entry.probe.needs.attention]
    reason = lens_model(model).attention_refusal() if needing else None
    if reason:
        raise ValueError(f"probe(s) {', '.join(needing)} cannot run: {reason}")


def capture_step(
    model: Any,
    sites: dict[str, int | None],
    data: AnalysisData,
    recipe: Recipe,
    needs: Needs,
    step: int,
    *,
    gradients: bool,
    score_loss: bool = True,
    sequence_energy: SequenceEnergyConfig | None = None,
    part: slice = slice(None),
    passes: int = 1,
    precision: str | None = None,
) -> CaptureStatistics:
    """One capture of ``step`` over the sequences ``data.rows[part]``, in ``passes`` passes over
    contiguous groups of the sites (attention in the first): with one pass the statistics stay
    on the model's device, where the probes compute; with several, each pass's go to the host
    when it ends (the device would not hold them all). ``sequence_energy``: per-sequence
    energy sums of proxies known in advance (the frozen-early intervals); ``score_loss=False``
    (forward-only captures that read activations alone): no language-modelling head, no
    ``mean_loss``. Per-type sums track only the types the probes read (each probe's
    ``tracked_types``). ``precision``: the statistics' (``"float64"`` or ``"float32"``; None =
    ``capture.precision`` resolved on the model's device by
    :func:`~tangentlens.capture.precision.resolve_precision`)."""
    type_ids = None
    if needs.type_sums:
        counts = data.frequencies.counts
        wanted = np.zeros(counts.shape, dtype=bool)
        for entry in recipe.probes.values():
            if entry.probe.tracked_types is not None:
                wanted[entry.probe.tracked_types(entry.config, counts)] = True
        type_ids = tuple(np.flatnonzero(wanted).tolist())
    model = lens_model(model)  # once: every pass and batch reads the same adapter
    if precision is None:
        precision = resolve_precision(recipe.capture.precision, model.device)
    attention = select_layers(recipe.capture.layers, model.n_layers) if needs.attention else ()
    statistics = StatisticsConfig(
        gradients=gradients,
        n_bins=recipe.data.n_bins if needs.bins else 0,
        gradient_bin_moments=needs.bin_moments,
        type_sums=needs.type_sums,
        vocab_size=model.d_vocab if needs.type_sums else None,
        type_ids=type_ids,
        reservoir_size=recipe.capture.reservoir if needs.reservoir else 0,
        seed=recipe.capture.seed,
        sequence_energy=sequence_energy,
        precision=precision,
    )
    groups = site_groups(list(sites), passes)

    def captured(i: int, group: list[str]) -> CaptureStatistics:
        stats = capture_statistics(
            model,
            iter_batches(data.rows[part], recipe.data.batch_size),
            CaptureConfig(
                sites=tuple(group),
                loss=data.loss,
                gradients=gradients,
                score_loss=score_loss,
                reduction=recipe.capture.reduction,
                seed=recipe.capture.seed,
                attention_layers=attention if i == 0 else (),
            ),
            data.special,
            statistics,
            bins=data.bins if needs.bins else None,
            first_sequence=part.start or 0,
            step=step,
        )
        # several passes: the device holds one pass's statistics, the host every pass's
        return stats.to("cpu") if len(groups) > 1 else stats

    return combine_site_passes([captured(i, group) for i, group in enumerate(groups)])


def capture_rows(capture: Capture) -> list[dict[str, Any]]:
    """The capture's own rows: mean loss, kept tokens, excluded positions per reason."""
    stats = capture.statistics
    out = [
        make_row(capture, "capture", "mean_loss", stats.mean_loss, n_tokens=stats.n_scored),
        make_row(capture, "capture", "n_tokens", stats.n_tokens, n_tokens=stats.n_tokens),
    ]
    for reason, count in sorted(stats.excluded.items()):
        out.append(make_row(capture, "capture", f"excluded_{reason}", count))
    return out


def with_fixed(
    fitted: dict[str, FittedProxies], fixed: Mapping[str, Mapping[str, FixedProxy]]
) -> dict[str, FittedProxies]:
    """Each site's fitted proxies with the fixed proxies of that site added (m̂ projected out of
    them as out of every fitted proxy, their diagnostics kept)."""
    out = dict(fitted)
    for site, by_method in fixed.items():
        if site not in out:
            continue
        for method, proxy in by_method.items():
            out[site] = add_fixed_proxy(out[site], method, proxy.basis, proxy.diagnostics)
    return out


def fit_step(
    stats: CaptureStatistics,
    stage: ProxiesSpec,
    fixed: Mapping[str, Mapping[str, FixedProxy]],
    status: Status = _quiet,
) -> dict[str, FittedProxies]:
    """The proxies of every site fitted on ``stats`` (``stage``: the recipe's ``[proxies]``),
    with the ``fixed`` proxies added."""
    status(f"fitting proxies ({', '.join(stage.methods)})")
    config = stage.proxy_config()
    fitted = {n: fit_proxies(s, config) for n, s in stats.sites.items()}
    return with_fixed(fitted, fixed)


def capture_scored(
    model: Any,
    sites: dict[str, int | None],
    data: AnalysisData,
    recipe: Recipe,
    step: int,
    *,
    passes: int = 1,
    sequence_energy: SequenceEnergyConfig | None = None,
    fixed: Mapping[str, Mapping[str, FixedProxy]] | None = None,
    status: Status = _quiet,
    precision: str | None = None,
) -> tuple[CaptureStatistics, CaptureStatistics, dict[str, FittedProxies] | None]:
    """A step's capture for every probe of ``recipe``: ``(statistics, scored, fitted)`` — the
    whole stream's statistics, those the energies are scored on and the step's own fit when it
    is fitted on other data than it is scored on, else None.

    With the stage's ``held_out``, each step's proxies are fitted on the first half of the
    sequences and scored on the second (an in-sample proxy flatters its own energy): two
    captures over disjoint halves cost one over all sequences, and merged they are exactly the
    whole stream's statistics for the other probes; ``fixed`` proxies join the fit. Otherwise
    one capture (``sequence_energy``: per-sequence sums of proxies known in advance).
    ``precision``: the statistics' (None: ``capture.precision`` resolved on the model's
    device)."""
    needs = recipe.needs

    def capture(**where: Any) -> CaptureStatistics:
        return capture_step(
            model, sites, data, recipe, needs, step, gradients=needs.gradients, passes=passes,
            precision=precision, **where,
        )  # fmt: skip

    stage = recipe.proxies
    if stage is not None and stage.held_out:
        half = len(data.rows) // 2
        stats, scored = (capture(part=part) for part in (slice(0, half), slice(half, None)))
        fitted = fit_step(stats, stage, fixed or {}, status)
        stats.merge(scored)
        return stats, scored, fitted
    stats = capture(sequence_energy=sequence_energy)
    return stats, stats, None


def _probe_rows(entry: ProbeEntry, inputs: StepInputs) -> list[dict[str, Any]]:
    """The probe's rows on ``inputs``, checked against the schema and its declared metrics."""
    rows = entry.probe.rows(inputs, entry.config)
    entry.probe.check_rows(rows, f"probe {entry.key!r} at step {inputs.capture.step}")
    return rows


def _timed(phases: Phases | None, name: str) -> contextlib.AbstractContextManager[None]:
    """``phases.phase(name)``, or nothing timed."""
    return contextlib.nullcontext() if phases is None else phases.phase(name)


@reused_draws()  # a step's probes draw the control frames of each key up to eight times
def step_rows(
    recipe: Recipe,
    capture: Capture,
    *,
    scored: CaptureStatistics | None = None,
    fitted: dict[str, FittedProxies] | None = None,
    frozen: Proxies | None = None,
    fixed: Mapping[str, Mapping[str, FixedProxy]] | None = None,
    status: Status = _quiet,
    replicates: list[dict[str, Any]] | None = None,
    phases: Phases | None = None,
) -> tuple[list[dict[str, Any]], Proxies | None]:
    """Every per-step probe of ``recipe`` on ``capture`` (the whole stream), in the recipe's
    order: the capture's rows, the ``step`` probes, then the tangent account — the fit
    diagnostics of the proxies stage and the ``tangent`` probes' rows. Returns the rows and
    the step's own fit (``{site: {method: basis}}``, None when nothing was fitted).

    ``scored``: the statistics energies are scored on (held out: the second half; default the
    capture's); ``fitted``: proxies already fitted on other data (held out: the first half);
    ``frozen``: frozen-early proxies, scored instead of the step's own fit; ``fixed``: proxies
    known in advance (``{site: {method: FixedProxy}}``), added to the step's own fit;
    ``replicates``: a list that receives the bootstrap replicates of the rows with intervals
    (:func:`tangentlens.results.replicate_record`); ``phases``: times each probe (``probe
    <name>``), the step's own fit (``fit``, or ``refit`` when it runs beside the probes) and
    the fit rows.
    """
    probes = {k: e for k, e in recipe.probes.items() if e.probe.per_step}
    stage = recipe.proxies
    fixed = fixed or {}
    if frozen is not None:  # the probes compute where the statistics are
        device = capture.statistics.device
        frozen = {n: {m: b.to(device) for m, b in by.items()} for n, by in frozen.items()}
    if (
        stage is None
        or fitted is not None
        or frozen is None
        or not any(e.probe.refits for e in probes.values())
    ):
        return _rows_with_fit(
            recipe, capture, probes, scored, fitted, frozen, fixed, status, replicates, phases
        )
    # the scored proxies are frozen: the step's own fit feeds only the refitting probes, so it
    # runs on a thread of its own beside the others

    def refit() -> dict[str, FittedProxies]:
        with _timed(phases, "refit"):
            return fit_step(capture.statistics, stage, fixed)

    status(f"fitting proxies ({', '.join(stage.methods)}) beside the probes")
    with alongside(refit) as pending:
        return _rows_with_fit(
            recipe,
            capture,
            probes,
            scored,
            None,
            frozen,
            fixed,
            status,
            replicates,
            phases,
            pending,
        )


def _rows_with_fit(
    recipe: Recipe,
    capture: Capture,
    probes: dict[str, ProbeEntry],
    scored: CaptureStatistics | None,
    fitted: dict[str, FittedProxies] | None,
    frozen: Proxies | None,
    fixed: Mapping[str, Mapping[str, FixedProxy]],
    status: Status,
    replicates: list[dict[str, Any]] | None,
    phases: Phases | None,
    pending: Callable[[], dict[str, FittedProxies]] | None = None,
) -> tuple[list[dict[str, Any]], Proxies | None]:
    """:func:`step_rows` with the step's own fit ``fitted`` (None: fitted here when nothing is
    frozen; or ``pending()`` waits for it, and the refitting probes run last)."""
    rows = capture_rows(capture)
    plain = StepInputs(capture=capture, scored=capture)
    for key, entry in probes.items():
        if entry.probe.scope == "step":
            status(key)
            with _timed(phases, f"probe {key}"):
                rows += _probe_rows(entry, plain)
    stage = recipe.proxies
    if stage is None:
        return rows, None
    if fitted is None and frozen is None:
        with _timed(phases, "fit"):
            fitted = fit_step(capture.statistics, stage, fixed, status)
    own = _bases(fitted)
    proxies = frozen if frozen is not None else own
    diagnostics = {} if frozen is not None else {n: f.diagnostics for n, f in fitted.items()}
    # fit quality of the scored proxies on this step's activations (and of this step's own fit)
    with _timed(phases, "fit rows"):
        rows += fit_rows(capture, proxies, diagnostics)
    scored_capture = capture if scored is None else dataclasses.replace(capture, statistics=scored)
    inputs = StepInputs(capture, scored_capture, proxies, own or None, frozen, stage, replicates)
    tangent = [k for k, e in probes.items() if e.probe.scope == "tangent"]
    by_probe: dict[str, list[dict[str, Any]]] = {}

    def run(keys: list[str]) -> None:
        for key in keys:
            status(f"{key} ({stage.draws} control frames per measurement)")
            with _timed(phases, f"probe {key}"):
                by_probe[key] = _probe_rows(probes[key], inputs)

    waiting = [k for k in tangent if pending is not None and probes[k].probe.refits]
    run([k for k in tangent if k not in waiting])
    if pending is not None:  # the refitting probes read the fit run beside the others
        with _timed(phases, "waiting for the refit"):
            own = _bases(pending())
        inputs = dataclasses.replace(inputs, own=own or None)
        run(waiting)
    for key in tangent:  # the recipe's order
        rows += by_probe[key]
    return rows, own or None


def _bases(fitted: dict[str, FittedProxies] | None) -> Proxies:
    """``{site: {method: basis}}`` of fitted proxies (empty for None)."""
    return {n: f.bases for n, f in (fitted or {}).items()}
