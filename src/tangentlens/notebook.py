"""Probes on a model in memory: one call from a model and text (or token ids) to a results table.

:func:`measure` runs the per-step probes on any TransformerLens ``HookedTransformer``,
``HookedEncoder`` or ``TransformerBridge`` (a decoder, or a BERT masked-LM encoder; see
:mod:`tangentlens.models.lens`) and returns the rows a sweep writes for one step, as a
:class:`ResultTable` (``.to_pandas()``, ``.to_arrow()``). :func:`capture_model` does the
forward/backward pass once and returns a :class:`~tangentlens.capture.Capture` that every
probe (and :func:`measure`) can reuse, and that saves and reloads. Both build the settings as a
recipe does and run the sweep's own step code (:mod:`tangentlens.core.step`): on the same model,
tokens and settings a notebook measurement and a sweep step give the same numbers.

Settings are a recipe's keys: ``seq_len``, ``max_tokens``, ``batch_size``, ``n_bins`` (its
``[data]``), ``sites``, ``layers``, ``embed``, ``reservoir``, ``seed``, ``passes``,
``threads`` (its ``[capture]``: the threads are pinned for the capture and the probes, as a
sweep's unit pins them), each probe's own table as ``probes={"tangent_energy": {"bootstrap": 0}}``
and the proxies stage's (its ``[proxies]``) as ``fit={"rank": 8, "held_out": True}``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from tangentlens.capture import LOSSES, CaptureStatistics
from tangentlens.capture.captured import Capture
from tangentlens.capture.needs import Needs
from tangentlens.checks import build_section, check_count
from tangentlens.core.bounds import check_width
from tangentlens.core.data import AnalysisData, capture_loss, pack_texts
from tangentlens.core.proxy_stage import LEGACY_PROBE, PROXIES, ProxiesSpec, move_legacy_keys
from tangentlens.core.recipe import CaptureSpec, DataSpec, Recipe, SuiteSpec
from tangentlens.core.step import (
    capture_scored,
    capture_sites,
    check_attention,
    step_rows,
    with_fixed,
)
from tangentlens.data import (
    FrequencyTable,
    SpecialTokens,
    special_tokens_of,
)
from tangentlens.models import LensModel, lens_model
from tangentlens.registry import SCOPES, TANGENT, ProbeEntry, builtin_probes, entries, resolve
from tangentlens.results import ResultTable
from tangentlens.runtime import exact_float32, threads
from tangentlens.user_proxies import resolve_proxies

__all__ = [
    "CAPTURE_SETTINGS",
    "DATA_SETTINGS",
    "capture_model",
    "default_probes",
    "measure",
]

#: Keyword settings that go to the recipe's ``[data]`` table.
DATA_SETTINGS: tuple[str, ...] = ("seq_len", "max_tokens", "batch_size", "n_bins")
#: Keyword settings that go to the recipe's ``[capture]`` table.
CAPTURE_SETTINGS: tuple[str, ...] = (
    "sites",
    "layers",
    "embed",
    "reservoir",
    "seed",
    "passes",
    "threads",
)
_LABEL = "model"

logger = logging.getLogger(__name__)


#: What a capture without a loss keeps: everything but gradients.
_WITHOUT_GRADIENTS = Needs(bins=True, type_sums=True, reservoir=True, attention=True)


def _per_step_probes() -> tuple[str, ...]:
    """The built-in probes with rows from one step: scope ``step``, then ``tangent``."""
    probes = builtin_probes()
    return tuple(
        sorted((n for n, p in probes.items() if p.per_step), key=lambda n: probes[n].scope)
    )


def _runnable(kept: Needs) -> tuple[str, ...]:
    """The per-step probes whose statistics ``kept`` holds (the tangent probes only where the
    proxies' energy is scored: with tangent_energy)."""
    probes = builtin_probes()
    fits = [n for n in _per_step_probes() if not kept.missing(probes[n].needs)]
    if TANGENT not in fits:
        fits = [n for n in fits if probes[n].scope != "tangent"]
    return tuple(fits)


def default_probes(model: Any) -> tuple[str, ...]:
    """Every per-step built-in probe the model supports: the tangent account needs a loss head,
    ``qk_drift`` per-head queries, keys and patterns with one key per query head (not under
    grouped-query attention, not through loader ``"hf"``). What is left out is said in one
    warning line."""
    lens = lens_model(model)
    chosen = _per_step_probes() if lens.has_lm_head else _runnable(_WITHOUT_GRADIENTS)
    refusal = lens.attention_refusal()
    skipped = [n for n in chosen if refusal and builtin_probes()[n].needs.attention]
    if skipped:
        logger.warning("default probes: %s left out, %s", ", ".join(skipped), refusal)
    return tuple(n for n in chosen if n not in skipped)


def _probe_configs(
    probes: Sequence[str] | Mapping[str, Any] | None, defaults: Sequence[str]
) -> dict[str, ProbeEntry]:
    """Probe name → its resolved entry (``defaults`` when None; settings as a dict of the
    recipe's keys, the config itself, or a recipe's entry: ``probes=recipe.probes``)."""
    if probes is None:
        probes = defaults
    if isinstance(probes, str):
        raise ValueError(f"probes must be a list of probe names, got the string {probes!r}")
    items = probes.items() if isinstance(probes, Mapping) else ((p, None) for p in probes)
    out: dict[str, Any] = {}
    for name, config in items:
        probe = resolve(name)
        if not probe.per_step:  # its rows compare checkpoints, or need no model
            reason = SCOPES["model_free" if probe.scope == "model_free" else "across"]
            raise ValueError(f"probe {name!r} cannot run on one model: {reason}")
        cls = probe.config
        if isinstance(config, ProbeEntry):
            config = config.config
        if config is None:
            config = cls()
        elif isinstance(config, Mapping):
            config = build_section(cls, dict(config), f"probes.{name}")
        elif not isinstance(config, cls):
            raise ValueError(
                f"probes[{name!r}] must be a dict of its settings or a {cls.__name__}, got "
                f"{type(config).__name__}"
            )
        out[name] = config
    return entries(out)


def _moved_keys(probes: Any, fit: Any) -> tuple[Any, Any]:
    """``probes`` and ``fit`` with the stage's keys given in ``probes["tangent_energy"]`` (as
    before the proxies stage) moved to ``fit``, in one warning line."""
    if not (isinstance(probes, Mapping) and isinstance(probes.get(LEGACY_PROBE), Mapping)):
        return probes, fit
    data: dict[str, Any] = {"probes": {LEGACY_PROBE: dict(probes[LEGACY_PROBE])}}
    if fit is not None:
        if not isinstance(fit, Mapping):
            return probes, fit  # a ProxiesSpec: the probe's keys are checked by its config
        data[PROXIES] = dict(fit)
    data = move_legacy_keys(data, "measure(probes=…)")
    return {**probes, LEGACY_PROBE: data["probes"][LEGACY_PROBE]}, data.get(PROXIES, fit)


def _stage(fit: Mapping[str, Any] | ProxiesSpec | None) -> ProxiesSpec | None:
    """The proxies stage of ``fit`` (the ``[proxies]`` keys, or the spec; None: the stage's
    defaults where a tangent probe runs); what needs a suite is refused."""
    if fit is None:
        return None
    if isinstance(fit, Mapping):
        stage = build_section(ProxiesSpec, dict(fit), "fit")
    elif isinstance(fit, ProxiesSpec):
        stage = fit
    else:
        raise ValueError(
            f"fit must be a dict of the [proxies] keys or a ProxiesSpec, got {type(fit).__name__}"
        )
    if stage.frozen:
        raise ValueError(
            "fit_policy 'frozen_early' fits on a suite's early checkpoints: run a sweep, or fit a "
            "proxy on an early checkpoint's capture and pass it as proxies="
        )
    if stage.pretrained_sae is not None:
        raise ValueError(
            "pretrained_sae is the sweep's table: load the SAE (sae_lens.SAE.from_pretrained) and "
            "pass it as proxies={'name': sae}"
        )
    return stage


def _recipe(
    configs: dict[str, ProbeEntry],
    stage: ProxiesSpec | None,
    settings: Mapping[str, Any],
    suite: str,
    *,
    has_tokens: bool,
) -> Recipe:
    unknown = sorted(set(settings) - set(DATA_SETTINGS) - set(CAPTURE_SETTINGS))
    if unknown:
        raise ValueError(
            f"unknown settings {unknown}; allowed: {[*DATA_SETTINGS, *CAPTURE_SETTINGS]} (and "
            "probes={name: {key: value}} for a probe's own settings)"
        )
    data = {k: v for k, v in settings.items() if k in DATA_SETTINGS}
    capture = {k: v for k, v in settings.items() if k in CAPTURE_SETTINGS}
    if has_tokens and "max_tokens" in data:
        raise ValueError("max_tokens limits text; with token ids given, pass the rows to use")
    if capture.get("passes") == 0:
        raise ValueError("passes must be ≥ 1 here (0, the fewest that fit, is the sweep's)")
    return Recipe(
        name="notebook",
        suite=SuiteSpec(name=suite),
        data=build_section(DataSpec, data, "data"),
        capture=build_section(CaptureSpec, capture, "capture"),
        proxies=stage,
        probes=configs,
    )


def _rows_of(
    model: LensModel, texts_or_tokens: Any, spec: DataSpec, special: SpecialTokens
) -> np.ndarray:
    """Token rows (n × seq_len): token ids as given, or texts packed as a suite is trained."""
    if isinstance(texts_or_tokens, torch.Tensor | np.ndarray):
        rows = np.asarray(
            texts_or_tokens.cpu() if isinstance(texts_or_tokens, torch.Tensor) else texts_or_tokens
        )
        if rows.ndim != 2 or not np.issubdtype(rows.dtype, np.integer) or 0 in rows.shape:
            raise ValueError(
                "token ids must be a non-empty 2-D integer tensor (sequences × positions), got "
                f"shape {rows.shape} and dtype {rows.dtype}"
            )
        if rows.min() < 0 or rows.max() >= model.d_vocab:
            raise ValueError(f"token ids must be in [0, {model.d_vocab}) (the vocabulary)")
        return rows.astype(np.int64)
    texts = [texts_or_tokens] if isinstance(texts_or_tokens, str) else texts_or_tokens
    if not isinstance(texts, Sequence) or not all(isinstance(t, str) for t in texts):
        raise ValueError(
            "expected texts (a string or a list of strings) or token ids (a 2-D integer tensor), "
            f"got {type(texts_or_tokens).__name__}"
        )
    tokenizer = model.tokenizer
    if tokenizer is None:
        raise ValueError("the model has no tokenizer (model.tokenizer): pass token ids instead")
    return pack_texts(texts, tokenizer, model.family, special, spec.seq_len, spec.max_tokens)


def _analysis_data(
    model: LensModel,
    texts_or_tokens: Any,
    spec: DataSpec,
    frequencies: FrequencyTable | np.ndarray | None,
    loss: str,
) -> AnalysisData:
    family = model.family
    tokenizer = model.tokenizer
    special = SpecialTokens() if tokenizer is None else special_tokens_of(tokenizer, family)
    rows = _rows_of(model, texts_or_tokens, spec, special)
    if rows.shape[1] > model.n_ctx:
        raise ValueError(
            f"rows of {rows.shape[1]} tokens are longer than the model's context (n_ctx = "
            f"{model.n_ctx}): set seq_len ≤ {model.n_ctx}"
        )
    if frequencies is None:
        vocab = model.d_vocab if tokenizer is None else len(tokenizer)
        frequencies = FrequencyTable.from_rows(rows, vocab, special, causal=family != "encoder")
    elif not isinstance(frequencies, FrequencyTable):
        frequencies = FrequencyTable(np.asarray(frequencies))
    return AnalysisData(rows, frequencies, frequencies.bins(spec.n_bins), special, loss)


def _loss(model: LensModel, loss: str | None, configs: Mapping[str, ProbeEntry]) -> str:
    """The capture loss: the one given, else the model family's (none without a head); probes
    needing gradients are refused without a loss."""
    if loss is None:
        loss = capture_loss(model.family, model.has_lm_head)
    elif loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    needing = [k for k, e in configs.items() if e.probe.needs.gradients]
    if needing and loss == "none":
        why = (
            "no loss was chosen"
            if model.has_lm_head
            else "the model has no language-modelling head"
        )
        raise ValueError(
            f"probes {needing} need gradients of the model's loss, and {why}; activation-only "
            f"probes: {list(_runnable(_WITHOUT_GRADIENTS))}"
        )
    return loss


@exact_float32()  # no TF32 whatever the notebook set; its settings restored after
def capture_model(
    model: torch.nn.Module,
    texts_or_tokens: Any,
    *,
    probes: Sequence[str] | Mapping[str, Any] | None = None,
    frequencies: FrequencyTable | np.ndarray | None = None,
    suite: str | None = None,
    step: int | None = None,
    tokens_seen: int | None = None,
    loss: str | None = None,
    **settings: Any,
) -> Capture:
    """One capture of ``model`` over ``texts_or_tokens`` keeping what ``probes`` need (default:
    every per-step probe the model supports): activations and the gradients of the model's own
    loss (``loss``, default next-token for decoders, MLM for encoders, none without a head) at
    every site, in float64 moments per frequency bin, plus the sampled rows.

    ``texts_or_tokens``: a string, a list of strings (tokenised with ``model.tokenizer`` and
    packed into ``seq_len`` rows as the mini suites are trained, the first ``max_tokens``
    tokens kept) or token ids (sequences × positions, used as given). ``frequencies``: the
    token frequency table (or counts per type id) the bins come from; default: counted on these
    rows. ``suite``, ``step``, ``tokens_seen`` label the rows (default: the model's name and
    checkpoint, as TransformerLens and tangentlens' suites record them; ``tokens_seen``
    unknown unless given); the step also seeds the controls, as in a sweep. ``settings``: see
    the module docstring.
    """
    model = lens_model(model)  # a HookedTransformer, HookedEncoder or TransformerBridge
    probes, _ = _moved_keys(probes, None)  # the stage's keys do not change what is captured
    configs = _probe_configs(probes, default_probes(model))
    capture, _, _ = _capture(
        model,
        texts_or_tokens,
        configs,
        None,
        frequencies=frequencies,
        suite=suite,
        step=step,
        tokens_seen=tokens_seen,
        loss=loss,
        **settings,
    )
    return capture


def _capture(
    model: LensModel,
    texts_or_tokens: Any,
    configs: dict[str, ProbeEntry],
    stage: ProxiesSpec | None,
    *,
    frequencies: FrequencyTable | np.ndarray | None = None,
    suite: str | None = None,
    step: int | None = None,
    tokens_seen: int | None = None,
    loss: str | None = None,
    bounded: bool = False,
    **settings: Any,
) -> tuple[Capture, CaptureStatistics, dict[str, Any] | None]:
    """:func:`capture_model` for the probes' resolved ``configs`` and the proxies ``stage``:
    the capture, the statistics its energies are scored on and the step's own fit where it
    is fitted on other sequences (``held_out``: :func:`~tangentlens.core.step.capture_scored`),
    else None. ``bounded`` (a measurement): the bounds the model's width sets on the stage and
    the probes are checked before the capture (:func:`~tangentlens.core.bounds.check_width`)."""
    loss = _loss(model, loss, configs)
    suite = suite or model.model_name or _LABEL
    step = int(step if step is not None else (model.checkpoint or 0))
    has_tokens = isinstance(texts_or_tokens, torch.Tensor | np.ndarray)
    recipe = _recipe(configs, stage, settings, suite, has_tokens=has_tokens)
    check_attention(model, recipe)  # before any data is prepared or captured
    if bounded:  # measured: what the model's width rules out, refused before the capture
        check_width(recipe, model.d_model, f"the model (d_model = {model.d_model})")
    width = texts_or_tokens.shape[-1] if has_tokens else None
    if width is not None and settings.get("seq_len", width) != width:
        raise ValueError(
            f"seq_len = {settings['seq_len']} but the token ids are {width} wide: leave seq_len "
            "out when giving token ids"
        )
    data = _analysis_data(model, texts_or_tokens, recipe.data, frequencies, loss)
    sites = capture_sites(model, recipe)
    with threads(recipe.capture.threads):  # as a sweep's unit pins them
        stats, scored, fitted = capture_scored(
            model, sites, data, recipe, step, passes=recipe.capture.passes
        )
    capture = Capture(
        suite=suite,
        step=step,
        tokens_seen=tokens_seen,
        statistics=stats,
        layers=sites,
        seq_len=int(data.rows.shape[1]),
        frequencies=data.frequencies,
    )
    return capture, scored, fitted


def _kept(capture: Capture) -> Needs:
    """What a capture kept (so a probe that needs more is refused before it runs)."""
    config = capture.statistics.statistics
    return Needs(
        gradients=config.gradients,
        bins=config.n_bins > 0,
        bin_moments=config.n_bins > 0 and config.gradients and config.gradient_bin_moments,
        type_sums=config.type_sums,
        reservoir=config.reservoir_size > 0,
        attention=bool(capture.statistics.attention),
    )


def _check_capture(capture: Capture, configs: Mapping[str, ProbeEntry]) -> None:
    kept = _kept(capture)
    for name, entry in configs.items():
        probe = entry.probe
        missing = kept.missing(probe.needs)
        if missing:
            raise ValueError(
                f"probe {name!r} needs {missing}, which this capture did not keep: capture with "
                f"capture_model(..., probes=[{name!r}, ...])"
            )
        if probe.tracked_types is None:
            continue
        wanted = probe.tracked_types(entry.config, capture.frequencies.counts)
        tracked = set(capture.statistics.statistics.type_ids or ())
        if not set(wanted.tolist()) <= tracked:
            raise ValueError(
                f"{name}'s settings name types this capture did not track: capture with the "
                f"same probes={{{name!r}: …}} settings"
            )


@exact_float32()  # no TF32 whatever the notebook set; its settings restored after
def measure(
    model_or_capture: torch.nn.Module | Capture,
    texts_or_tokens: Any = None,
    *,
    probes: Sequence[str] | Mapping[str, Any] | None = None,
    fit: Mapping[str, Any] | ProxiesSpec | None = None,
    proxies: Mapping[str, Any] | None = None,
    proxy_rtol: float | None = None,
    **settings: Any,
) -> ResultTable:
    """The per-step probes' rows for a model (captured here) or a :class:`Capture`.

    ``probes``: names, or ``{name: settings}`` with each probe's recipe keys (default: every
    per-step probe the model supports, or the capture kept statistics for). ``fit``: the
    proxies stage's settings, the recipe's ``[proxies]`` keys (``{"rank": 8, "methods":
    ["pca"]}``; default: the stage's defaults, ``fit_policy = "per_checkpoint"``): with
    ``"held_out": True`` and a model, each proxy is fitted on the first half of the sequences
    and scored on the second, as a sweep's step does (a :class:`Capture` holds one stream: it
    is refused). ``proxies``:
    your own tangent proxies, scored next to the fitted ones against the same matched-rank
    controls (see :mod:`tangentlens.user_proxies`: a d × k basis orthonormalised with
    rank tolerance ``proxy_rtol``, a fitted tangentlens dictionary, or an SAELens SAE whose
    ``rank`` most active latents span it); they need ``tangent_energy``. ``threads``: torch's
    threads for the capture and the probes, pinned as a sweep's unit pins ``capture.threads``
    (default 2; the last bits of the sums depend on it), the caller's count restored after. With
    a model, the other arguments are :func:`capture_model`'s.
    """
    count = check_count(settings.get("threads", CaptureSpec().threads), "threads", minimum=1)
    probes, fit = _moved_keys(probes, fit)
    stage = _stage(fit)
    if isinstance(model_or_capture, Capture):
        if texts_or_tokens is not None:
            raise ValueError("a Capture already holds its tokens: call measure(capture, probes=…)")
        settings.pop("threads", None)  # the probes' thread count
        capture_settings = sorted(set(settings) & {*DATA_SETTINGS, *CAPTURE_SETTINGS, "step"})
        if capture_settings:
            raise ValueError(f"{capture_settings} are capture settings: pass them to capture_model")
        if settings:
            raise ValueError(f"unknown settings {sorted(settings)} for measuring a capture")
        if stage is not None and stage.held_out:
            raise ValueError(
                "held_out fits each proxy on the first half of the sequences and scores the "
                "second: a Capture holds one stream, so measure the model (measure(model, texts, "
                "fit={'held_out': True}))"
            )
        capture, model_name = model_or_capture, None  # a label, not checked against SAEs
        configs = _probe_configs(probes, _runnable(_kept(capture)))
        _check_capture(capture, configs)
        scored, fitted = None, None
    else:
        if texts_or_tokens is None:
            raise ValueError("measure(model, texts_or_tokens): give the texts or token ids")
        model_or_capture = lens_model(model_or_capture)  # HookedTransformer, HookedEncoder, bridge
        configs = _probe_configs(probes, default_probes(model_or_capture))
        model_name = model_or_capture.model_name
    if proxies and "tangent_energy" not in configs:
        raise ValueError("proxies are scored by the tangent_energy probe: add it to probes")
    if not isinstance(model_or_capture, Capture):
        capture, scored, fitted = _capture(
            model_or_capture, texts_or_tokens, configs, stage, bounded=True, **settings
        )
    recipe = Recipe("notebook", SuiteSpec(name=capture.suite), proxies=stage, probes=configs)
    if isinstance(model_or_capture, Capture):
        widths = {site.h.d for site in capture.statistics.sites.values()}
        for d in sorted(widths):
            check_width(recipe, d, f"the capture (sites of width {d})")
    fixed = None
    if proxies:
        options = {} if proxy_rtol is None else {"rtol": proxy_rtol}
        rank = recipe.proxies.rank
        fixed = resolve_proxies(proxies, capture, rank=rank, model_name=model_name, **options)
        if fitted is not None:  # held out: the fit is done, the user's proxies join it
            fitted = with_fixed(fitted, fixed)
    with threads(count):  # as a sweep's step unit pins them: the last bits depend on it
        rows, _ = step_rows(recipe, capture, scored=scored, fitted=fitted, fixed=fixed)
    return ResultTable(rows)
