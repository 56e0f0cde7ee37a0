"""The sweep: a recipe over a suite's steps, unit by unit, resumably.

Units, in order:

* ``fit-proxies`` (only with ``fit_policy = "frozen_early"``) — the suite's early checkpoints
  (:func:`tangentlens.dictionaries.early_window`: step ≤ ``early_fraction`` × the final step, at
  most ``window_checkpoints``, whatever steps the sweep scores) are captured forward-only and
  the proxies fitted on their pooled activations (PCA on pooled moments, semi-NMF / SAE on the
  pooled sampled rows), saved to ``state/proxies.pt``;
* ``step-<N>`` — one capture of step N with everything the enabled probes need, then every
  probe's rows plus the capture's own rows (probe ``capture``: ``mean_loss``, ``n_tokens``,
  ``excluded_<reason>``). Update alignment scores the transition from the previous selected
  step with proxies from data of that step or earlier (its own fit, or the frozen proxies);
* ``across-steps`` — rows computed from every step's rows once they all exist (the
  drift–anisotropy correlation across steps).

A finished unit's rows land atomically in ``results/<unit>.parquet``; ``--resume`` skips those,
so interrupting at any moment and resuming gives exactly the table of an uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tangentlens.capture import (
    CaptureConfig,
    CaptureStatistics,
    SequenceEnergyConfig,
    StatisticsConfig,
    capture_statistics,
)
from tangentlens.data import (
    ANALYSIS_EXCLUSION_REASONS,
    FrequencyBins,
    FrequencyTable,
    SpecialTokens,
    document_encoder,
    iter_batches,
    limit_tokens,
    load_corpus,
    pack_rows,
    special_tokens_of,
    tokenize_corpus,
)
from tangentlens.dictionaries import early_window, in_window
from tangentlens.models import hook_name, open_suite
from tangentlens.models.suites import CheckpointSuite
from tangentlens.probes import (
    anisotropy_share,
    cosine_drift,
    frequency_geometry,
    qk_drift,
    shape_of_learning,
    subspace_stability,
    tangent_energy,
    untrained_block,
    update_alignment,
)
from tangentlens.probes.base import Needs, StepData, make_row, row
from tangentlens.probes.proxies import (
    FIT_PROBE,
    ActivationPool,
    FittedProxies,
    fit_proxies,
    fit_rows,
)
from tangentlens.sweep.recipe import Recipe
from tangentlens.sweep.store import RunStore, read_results

__all__ = ["ESTIMATORS", "SweepEvent", "run_sweep"]

#: The estimator choices behind the metrics, recorded in every run's manifest.
ESTIMATORS: dict[str, str] = {
    "fit_window": "frozen_early: the suite's checkpoints with step ≤ early_fraction × final step, "
    "at most window_checkpoints, evenly spaced in step",
    "update_alignment": "s → s′ scored in proxies fitted on data of s or earlier (per_checkpoint: "
    "s's own fit; frozen_early: the frozen proxies, *_update_in_window_* when s′ ≤ the window's "
    "last checkpoint); centroid differences in float64",
    "subspace_stability": "angles between each step's own refits; <m>@frozen = refit vs frozen",
    "drift_cosine": "‖mean(H)‖ against cosine anisotropy, across layers (per step) and across "
    "steps (per site, at the last step); n_tokens = number of points",
    "frequency_spread": "Σ‖h − c‖² / (n − 1) per type from the streamed sums over every kept "
    "token (n = the type's count in the stream); Pearson on the squared spread",
    "proxies": "every method fitted on activations centred per checkpoint (window checkpoints "
    "centred before pooling), with the mean direction m̂ projected out; mean_direction = m̂ as a "
    "rank-1 proxy, following the fit policy (pooled window mean or the step's mean); held_out: "
    "fitted on the first half of a step's sequences, energies scored on the second",
    "anisotropy_share": "spectral share on the uncentred gradient second moment GᵀG/n; ΔIsoScore* "
    "on the covariance; controls = tangent_energy's frames",
    "centred_anisotropy": "σ₁²/Σσᵢ² of the centred activations (llm-microscope)",
    "positions": "one kept-position set for every statistic and the token frequencies; masked-LM: "
    "every non-special original position ([MASK] inputs included), binned by the original token, "
    "gradients at every kept row; analysis text tokenised and packed as in training",
}

_SIMPLE_PROBES = {
    "cosine_drift": cosine_drift,
    "shape_of_learning": shape_of_learning,
    "qk_drift": qk_drift,
    "frequency_geometry": frequency_geometry,
}


@dataclass(frozen=True)
class SweepEvent:
    """Progress: ``phase`` is "data", "unit-start", "status" (what the unit is doing, in
    ``status``), "unit-done" or "unit-skip"."""

    phase: str
    unit: str = ""
    done: int = 0
    total: int = 0
    status: str = ""


@dataclass(frozen=True)
class _Data:
    rows: Any
    frequencies: FrequencyTable
    bins: FrequencyBins
    special: SpecialTokens
    loss: str


def _prepare_data(suite: CheckpointSuite, recipe: Recipe) -> _Data:
    spec = recipe.data
    if spec.corpus == "analysis":
        if not hasattr(suite, "analysis_corpus"):
            raise ValueError(
                "data.corpus = 'analysis' is the held-out split of a mini suite; for this suite "
                "name a corpus (e.g. 'shakespeare' or a path)"
            )
        corpus = suite.analysis_corpus()  # type: ignore[attr-defined]
    else:
        corpus = load_corpus(spec.corpus)
    tokenizer = suite.tokenizer()
    special = special_tokens_of(tokenizer, suite.family)
    # tokenised and packed exactly as the mini suites are trained: documents without special
    # tokens, the packer adds the row's [CLS] … [SEP] (encoders) or EOS between documents
    docs = tokenize_corpus(corpus, document_encoder(tokenizer))
    rows = pack_rows(docs, spec.seq_len, family=suite.family, special=special)
    rows = limit_tokens(rows, spec.max_tokens)
    if len(rows) == 0:
        raise ValueError(
            f"the analysis corpus gives no row of {spec.seq_len} tokens; lower data.seq_len"
        )
    # counted over the positions a capture keeps (no EOS/BOS/CLS/SEP/PAD, no position 0 or
    # last position of a causal row), with the original tokens a capture bins by
    frequencies = FrequencyTable.from_rows(
        rows, len(tokenizer), special, causal=suite.family != "encoder"
    )
    return _Data(
        rows=rows,
        frequencies=frequencies,
        bins=frequencies.bins(spec.n_bins),
        special=special,
        loss="mlm" if suite.family == "encoder" else "next_token",
    )


def _needs(recipe: Recipe) -> Needs:
    needs = Needs()
    for name, config in recipe.probes.items():
        if name in _SIMPLE_PROBES:
            needs = needs.union(_SIMPLE_PROBES[name].needs(config))
        elif name == "tangent_energy":
            needs = needs.union(tangent_energy.needs(config.energy_config()))
        elif name == "anisotropy_share":
            needs = needs.union(anisotropy_share.needs(config))
        elif name == "update_alignment":
            needs = needs.union(update_alignment.needs(config))
    return needs


def _sites(model: torch.nn.Module, recipe: Recipe) -> dict[str, int | None]:
    sites: dict[str, int | None] = {}
    if recipe.capture.embed:
        sites[hook_name(model, "embed")] = None
    for kind in recipe.capture.sites:
        for layer in range(model.cfg.n_layers):
            sites[hook_name(model, kind, layer)] = layer
    return sites


def _capture(
    model: torch.nn.Module,
    sites: dict[str, int | None],
    data: _Data,
    recipe: Recipe,
    needs: Needs,
    step: int,
    *,
    gradients: bool,
    sequence_energy: SequenceEnergyConfig | None = None,
    part: slice = slice(None),
) -> CaptureStatistics:
    """One capture of ``step`` over the sequences ``data.rows[part]``; ``sequence_energy``:
    per-sequence energy sums of proxies known in advance (the frozen-early intervals)."""
    config = CaptureConfig(
        sites=tuple(sites),
        loss=data.loss,
        gradients=gradients,
        reduction=recipe.capture.reduction,
        seed=recipe.capture.seed,
        attention_layers=tuple(range(model.cfg.n_layers)) if needs.attention else (),
    )
    statistics = StatisticsConfig(
        gradients=gradients,
        n_bins=recipe.data.n_bins if needs.bins else 0,
        type_sums=needs.type_sums,
        vocab_size=model.cfg.d_vocab if needs.type_sums else None,
        reservoir_size=recipe.capture.reservoir if needs.reservoir else 0,
        seed=recipe.capture.seed,
        sequence_energy=sequence_energy,
    )
    return capture_statistics(
        model,
        iter_batches(data.rows[part], recipe.data.batch_size),
        config,
        data.special,
        statistics,
        bins=data.bins if needs.bins else None,
        first_sequence=part.start or 0,
        step=step,
    )


def _fit_window(recipe: Recipe, suite: CheckpointSuite) -> tuple[int, ...]:
    """The frozen-early fit window over the suite's own checkpoints (``()`` without one)."""
    spec = recipe.probes.get("tangent_energy")
    if spec is None or spec.fit_policy != "frozen_early":
        return ()
    return early_window(suite.steps, spec.early_fraction, spec.window_checkpoints)


def _frozen_proxies(
    suite: CheckpointSuite, recipe: Recipe, data: _Data, store: RunStore, window: list[int]
) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, Any], dict[str, int | None]]:
    """Fit (or read back) the frozen-early proxies on the pooled window (each checkpoint centred
    on its own mean); returns the bases and the fit diagnostics per site and method, and each
    site's block index."""
    path = store.state / "proxies.pt"
    if path.exists():
        saved = torch.load(path, weights_only=True)
        if not (isinstance(saved, dict) and {"bases", "diagnostics", "layers"} <= set(saved)):
            raise ValueError(
                f"--resume: {path} was written by another tangentlens version; start a new run "
                "directory"
            )
        return saved["bases"], saved["diagnostics"], saved["layers"]
    spec = recipe.probes["tangent_energy"]
    pools: dict[str, ActivationPool] = {}
    for step in window:
        model = suite.load(step, device=recipe.suite.resolved_device())
        sites = _sites(model, recipe)
        stats = _capture(model, sites, data, recipe, Needs(reservoir=True), step, gradients=False)
        for name, site in stats.sites.items():
            sample = site.reservoir.columns()["H"] if site.reservoir is not None else None
            pools.setdefault(name, ActivationPool()).add(site.h.to("cpu"), sample)
    fitted = {name: pool.fit(spec.proxy_config()) for name, pool in pools.items()}
    bases = {name: f.bases for name, f in fitted.items()}
    diagnostics = {name: f.diagnostics for name, f in fitted.items()}
    saved = {"bases": bases, "diagnostics": diagnostics, "layers": sites}
    store.write_state("proxies.pt", lambda tmp: torch.save(saved, tmp))
    return bases, diagnostics, sites


def _window_fit_rows(
    recipe: Recipe,
    suite: CheckpointSuite,
    window: tuple[int, ...],
    diagnostics: dict[str, Any],
    layers: dict[str, int | None],
) -> list[dict[str, Any]]:
    """The frozen fit's diagnostics as rows keyed at the window's last checkpoint."""
    step, rank = window[-1], recipe.probes["tangent_energy"].rank
    return [
        row(
            recipe.suite.name,
            step,
            suite.tokens_seen(step) or 0,
            FIT_PROBE,
            metric,
            value,
            site=site,
            layer=layers[site],
            method=method,
            rank=rank,
        )
        for site, by_method in diagnostics.items()
        for method, metrics in by_method.items()
        for metric, value in metrics.items()
    ]


def _capture_rows(step_data: StepData) -> list[dict[str, Any]]:
    stats = step_data.statistics
    out = [
        make_row(step_data, "capture", "mean_loss", stats.mean_loss, n_tokens=stats.n_scored),
        make_row(step_data, "capture", "n_tokens", stats.n_tokens, n_tokens=stats.n_tokens),
    ]
    for reason, count in sorted(stats.excluded.items()):
        out.append(make_row(step_data, "capture", f"excluded_{reason}", count))
    return out


def _embedding(model: torch.nn.Module) -> torch.Tensor:
    if not hasattr(model, "W_E"):
        raise ValueError(f"{type(model).__name__} exposes no W_E: update_alignment cannot run")
    return model.W_E.detach().to("cpu", torch.float64)


def _tracked_centroids(
    stats: CaptureStatistics, tracked: torch.Tensor
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per site: (type ids seen at this step among ``tracked``, their centroids in float64 —
    the update is a difference of nearby centroids)."""
    out = {}
    for site, s in stats.sites.items():
        if s.types is None:
            continue
        seen = tracked[s.types.count[tracked] > 0]
        out[site] = (seen, s.types.sum[seen].double() / s.types.count[seen, None])
    return out


def _update_rows(
    suite: CheckpointSuite,
    recipe: Recipe,
    data: _Data,
    store: RunStore,
    step_data: StepData,
    model: torch.nn.Module,
    proxies: dict[str, dict[str, torch.Tensor]] | None,
    previous_step: int | None,
    before: dict[str, Any],
    carry: dict[str, Any],
    in_window: bool,
) -> list[dict[str, Any]]:
    """Save this step's tracked centroids; score the updates since the previous step against
    ``proxies`` fitted on data of the previous step or earlier (None: nothing to score).

    ``before`` holds the previous step's centroids and embedding when this sweep computed them
    (after a resume they are read back from disk and the model); this step's go into ``carry``.
    """
    config = recipe.probes["update_alignment"]
    counts = torch.from_numpy(data.frequencies.counts)
    tracked = torch.argsort(counts, descending=True, stable=True)[: config.centroid_types]
    tracked = tracked[counts[tracked] > 0]
    centroids = _tracked_centroids(step_data.statistics, tracked)
    store.write_state(f"centroids-{step_data.step:08d}.pt", lambda tmp: torch.save(centroids, tmp))
    embedding = _embedding(model)
    carry.update(centroids=centroids, embedding=embedding)
    if previous_step is None or proxies is None:
        return []
    old_centroids = before.get("centroids")
    if old_centroids is None:
        path = store.state / f"centroids-{previous_step:08d}.pt"
        old_centroids = torch.load(path, weights_only=True)
    old_embedding = before.get("embedding")
    if old_embedding is None:
        device = recipe.suite.resolved_device()
        old_embedding = _embedding(suite.load(previous_step, device=device))
    deltas = {}
    for site, (ids, now) in centroids.items():
        old_ids, old = old_centroids[site]
        _, at_now, at_old = np.intersect1d(ids.numpy(), old_ids.numpy(), return_indices=True)
        deltas[site] = now[at_now].double() - old[at_old].double()
    embed_site = hook_name(model, "embed")
    seen = torch.from_numpy(data.frequencies.counts > 0)
    delta_embed = (embedding - old_embedding)[: seen.numel()][seen]
    return update_alignment.rows(
        step_data, proxies, (embed_site, delta_embed), deltas, config, in_window=in_window
    )


def _reseeded_proxies(
    stats: CaptureStatistics, spec: Any, seeds: int
) -> dict[str, dict[str, dict[int, torch.Tensor]]]:
    """The seeded dictionaries refitted on this step's sample with seeds ``seed, seed + 1, …``
    (the recipe's seed included, so seeds are compared on the same data)."""
    seeded = tuple(m for m in spec.methods if m != "pca")
    if seeds < 2 or not seeded:
        return {}
    out: dict[str, dict[str, dict[int, torch.Tensor]]] = {}
    for offset in range(seeds):
        seed = spec.seed + offset
        config = dataclasses.replace(
            spec.proxy_config(), methods=seeded, seed=seed, mean_direction=False
        )
        for site, site_stats in stats.sites.items():
            for method, basis in fit_proxies(site_stats, config).bases.items():
                out.setdefault(site, {}).setdefault(method, {})[seed] = basis
    return out


def _fit_own(
    stats: CaptureStatistics, spec: Any, status: Callable[[str], None], step: int
) -> dict[str, FittedProxies]:
    """This step's own proxies, fitted on ``stats``."""
    status(f"step {step}: fitting proxies ({', '.join(spec.methods)})")
    return {n: fit_proxies(s, spec.proxy_config()) for n, s in stats.sites.items()}


def _step_rows(
    suite: CheckpointSuite,
    recipe: Recipe,
    data: _Data,
    store: RunStore,
    steps: list[int],
    step: int,
    frozen: dict[str, dict[str, torch.Tensor]] | None,
    window: tuple[int, ...],
    status: Callable[[str], None],
    last: dict[str, Any],
) -> list[dict[str, Any]]:
    """Rows of one step; ``frozen`` the frozen-early proxies fitted on ``window`` (None and
    ``()`` under per_checkpoint); ``last`` the previous unit's carried state."""
    needs = _needs(recipe)
    status(f"step {step}: loading")
    model = suite.load(step, device=recipe.suite.resolved_device())
    sites = _sites(model, recipe)
    gradients = needs.gradients
    status(f"step {step}: capture ({'activations and gradients' if gradients else 'activations'})")
    spec = recipe.probes.get("tangent_energy")
    energy_sums = None
    if frozen is not None and _gathers_sequence_sums(recipe):
        # the proxies are known before the capture: gather per-sequence energy sums so the
        # intervals resample every analysed sequence
        energy_sums = tangent_energy.sequence_energy_config(
            spec.energy_config(),
            step,
            frozen,
            sites,
            recipe.data.n_bins if needs.bins else 0,
            recipe.data.seq_len,
        )
    fitted = None
    if spec is not None and spec.held_out:
        # fit on the first half of the sequences, score the second: an in-sample proxy flatters
        # its own energy. Two captures over disjoint halves cost one over all sequences, and
        # merged they are exactly the whole stream's statistics for the other probes.
        half = len(data.rows) // 2
        stats = _capture(
            model, sites, data, recipe, needs, step, gradients=gradients, part=slice(0, half)
        )
        scored = _capture(
            model, sites, data, recipe, needs, step, gradients=gradients, part=slice(half, None)
        )
        fitted = _fit_own(stats, spec, status, step)
        stats.merge(scored)
    else:
        stats = _capture(
            model,
            sites,
            data,
            recipe,
            needs,
            step,
            gradients=gradients,
            sequence_energy=energy_sums,
        )
        scored = stats
    step_data = StepData(
        suite=recipe.suite.name,
        step=step,
        tokens_seen=suite.tokens_seen(step) or 0,
        statistics=stats,
        layers=sites,
        seq_len=recipe.data.seq_len,
        frequencies=data.frequencies,
    )
    rows = _capture_rows(step_data)
    for name, module in _SIMPLE_PROBES.items():
        if name in recipe.probes:
            status(f"step {step}: {name}")
            rows += module.rows(step_data, recipe.probes[name])
    if spec is None:
        return rows
    index = steps.index(step)
    previous_step = steps[index - 1] if index else None
    # the previous unit's state, when this sweep computed it (else it is read back: a resume)
    before = last if previous_step is not None and last.get("step") == previous_step else {}
    carry: dict[str, Any] = {"step": step}
    own = None  # this step's own fit: the scored proxies under per_checkpoint
    diagnostics: dict[str, Any] = {}
    if fitted is None and (frozen is None or "subspace_stability" in recipe.probes):
        fitted = _fit_own(stats, spec, status, step)
    if fitted is not None:
        own = {n: f.bases for n, f in fitted.items()}
        diagnostics = {n: f.diagnostics for n, f in fitted.items()}
        store.write_state(f"proxies-{step:08d}.pt", lambda tmp: torch.save(own, tmp))
        carry["proxies"] = own
    proxies = own if frozen is None else frozen
    # fit quality of the scored proxies on this step's activations (and of this step's own fit)
    rows += fit_rows(step_data, proxies, diagnostics if frozen is None else {})
    status(f"step {step}: controls ({spec.draws} per measurement)")
    scored_data = dataclasses.replace(step_data, statistics=scored)  # held out: second half
    rows += tangent_energy.rows(scored_data, proxies, spec.energy_config())
    if "anisotropy_share" in recipe.probes:
        status(f"step {step}: anisotropy share")
        share = recipe.probes["anisotropy_share"]
        rows += anisotropy_share.rows(scored_data, proxies, share, spec.energy_config())

    def previous_fit() -> dict[str, dict[str, torch.Tensor]]:
        if "proxies" in before:
            return before["proxies"]
        return torch.load(store.state / f"proxies-{previous_step:08d}.pt", weights_only=True)

    if "subspace_stability" in recipe.probes:
        stability = recipe.probes["subspace_stability"]
        reseeded = _reseeded_proxies(stats, spec, stability.seeds)
        previous = previous_fit() if previous_step is not None else None
        rows += subspace_stability.rows(step_data, own, previous, reseeded, stability, frozen)
    if "update_alignment" in recipe.probes:
        # the update previous_step → step is scored in a proxy fitted on data of previous_step
        # or earlier: its own fit, or the frozen window (then marked when step is inside it)
        scoring = frozen
        if frozen is None and previous_step is not None:
            scoring = previous_fit()
        rows += _update_rows(
            suite,
            recipe,
            data,
            store,
            step_data,
            model,
            scoring,
            previous_step,
            before,
            carry,
            in_window(step, window),
        )
    last.clear()
    last.update(carry)
    return rows


def _masked_counts(store: RunStore) -> dict[str, dict[str, int]]:
    """Positions excluded per reason at every step, from the capture rows of the parts."""
    counts: dict[str, dict[str, int]] = {}
    for r in read_results(store.root).to_pylist():
        if r["probe"] == "capture" and r["metric"].startswith("excluded_"):
            reason = r["metric"].removeprefix("excluded_")
            counts.setdefault(str(r["step"]), {})[reason] = int(r["value"])
    return counts


def _git_hash() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parent,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None


def _versions() -> dict[str, str]:
    names = ("tangentlens", "torch", "transformer-lens", "sae-lens", "transformers", "numpy")
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def _gathers_sequence_sums(recipe: Recipe) -> bool:
    """Whether step captures gather per-sequence energy sums: the proxies are known before the
    capture (``frozen_early``) and the energies carry intervals."""
    spec = recipe.probes.get("tangent_energy")
    return spec is not None and spec.fit_policy == "frozen_early" and spec.bootstrap > 0


def _interval_estimator(recipe: Recipe) -> dict[str, str]:
    """Where the energy intervals come from (see ``tangent_energy.interval_source``)."""
    spec = recipe.probes.get("tangent_energy")
    if spec is None or not spec.bootstrap:
        return {}
    source = (
        tangent_energy.INTERVAL_ALL_SEQUENCES
        if _gathers_sequence_sums(recipe)
        else tangent_energy.INTERVAL_SAMPLE
    )
    return {
        "energy_interval": f"{spec.energy_config().interval} bootstrap over {source}: "
        + (
            "every analysed sequence, from per-sequence sums gathered during capture"
            if source == tangent_energy.INTERVAL_ALL_SEQUENCES
            else "the reservoir's sampled sequences, rescaled onto the reported value"
        )
    }


def _manifest(recipe: Recipe, suite: CheckpointSuite, steps: list[int]) -> dict[str, Any]:
    return {
        "recipe": recipe.to_dict(),
        "suite": {"kind": suite.kind, "name": suite.name, "family": suite.family},
        "steps": steps,
        "fit_window": list(_fit_window(recipe, suite)),
        "estimators": {**ESTIMATORS, **_interval_estimator(recipe)},
        "versions": _versions(),
        "git_hash": _git_hash(),
        "python": platform.python_version(),
        "device": recipe.suite.resolved_device(),
        "dtype": "float32",
        "loss_reduction": recipe.capture.reduction,
        "seeds": {"capture": recipe.capture.seed},
        "finished": False,
    }


def run_sweep(
    recipe: Recipe,
    out: str | Path,
    *,
    resume: bool = False,
    on_event: Callable[[SweepEvent], None] | None = None,
) -> Path:
    """Run ``recipe`` into the run directory ``out``; returns it. See the module docstring."""
    emit = on_event or (lambda event: None)
    suite = open_suite(recipe.suite.name, offline=recipe.suite.offline or None)
    steps = suite.select(recipe.suite.steps)
    with RunStore.open(out, resume=resume) as store:
        manifest = _manifest(recipe, suite, steps)
        if resume:
            previous = store.read_manifest()
            if previous.get("recipe") != json.loads(json.dumps(manifest["recipe"])):
                raise ValueError(
                    f"--resume: {store.root} was started with a different recipe; start a new "
                    "run directory or resume with the same recipe and overrides"
                )
        else:
            store.write_manifest(manifest)
        emit(SweepEvent("data"))
        data = _prepare_data(suite, recipe)
        frozen = None
        units = [f"step-{step:08d}" for step in steps]
        window = _fit_window(recipe, suite)
        if window:
            emit(SweepEvent("unit-start", "fit-proxies", 0, len(units)))
            frozen, diagnostics, layers = _frozen_proxies(suite, recipe, data, store, list(window))
            if not store.has_part("fit-proxies"):
                fit = _window_fit_rows(recipe, suite, window, diagnostics, layers)
                store.write_part("fit-proxies", fit)
        total = len(units) + ("untrained_block" in recipe.probes)
        last: dict[str, Any] = {}  # the previous unit's state for the cross-step probes
        for done, (step, unit) in enumerate(zip(steps, units, strict=True)):
            if store.has_part(unit):
                emit(SweepEvent("unit-skip", unit, done + 1, total))
                continue
            emit(SweepEvent("unit-start", unit, done, total))

            def status(text: str, unit: str = unit, done: int = done) -> None:
                emit(SweepEvent("status", unit, done, total, text))

            rows = _step_rows(suite, recipe, data, store, steps, step, frozen, window, status, last)
            store.write_part(unit, rows)
            emit(SweepEvent("unit-done", unit, done + 1, total))
        if "cosine_drift" in recipe.probes and not store.has_part("across-steps"):
            across = cosine_drift.across_steps_rows(read_results(store.root).to_pylist())
            store.write_part("across-steps", across)
        if "untrained_block" in recipe.probes and not store.has_part("untrained-block"):
            emit(SweepEvent("unit-start", "untrained-block", len(units), total))
            config = recipe.probes["untrained_block"]
            store.write_part("untrained-block", untrained_block.rows(recipe.suite.name, config))
            emit(SweepEvent("unit-done", "untrained-block", total, total))
        manifest = store.read_manifest()
        manifest["finished"] = True
        manifest["weights_hashes"] = {str(s): suite.weights_hash(s) for s in steps}
        manifest["excluded_policy"] = ", ".join(ANALYSIS_EXCLUSION_REASONS)
        manifest["masked_tokens"] = _masked_counts(store)
        store.write_manifest(manifest)
    return Path(out)
