"""Which recipe settings must match for a metric to be compared, which are only flagged, and what
else differs between the runs' recipes and fit windows (all read from the manifests).

Must match (:func:`must_match`): a difference refuses the rows it concerns, in one line naming
the setting and every run's value; the other rows are still compared. The core's:

==================  =========================================  ================================
setting             recipe key                                 rows refused when it differs
==================  =========================================  ================================
rank                proxies.rank                               the tangent account's probes
control family      proxies.mean_direction                     the tangent account's probes
fit policy          proxies.fit_policy                         the tangent account's probes
held_out            proxies.held_out                           the tangent account's probes
bins                data.n_bins                                every per-bin row (freq_bin ≠ all)
==================  =========================================  ================================

then the registered probes' own (:class:`~tangentlens.reporting.MustMatch`, over the rows of
each probe that declares it; built in: ``proxies.draws`` (tangent_energy,
anisotropy_share), ``probes.tangent_energy.data_matched_m`` (tangent_energy's
``data_matched_*``), ``probes.anisotropy_share.isoscore_draws``,
``probes.update_alignment.draws``), then every key of each compared probe's own recipe table
(:func:`probe_settings`: a researcher's probe run with ``lower = 1`` and with ``lower = 2`` is
not compared), except those the probe declares may differ (``Reporting.may_differ``; built in:
tangent_energy's ``bootstrap``, ``interval`` and ``keep_replicates``, which change no value).

The tangent account's probes (:func:`tangent_account`, from the registry): every probe of scope
``tangent`` — built in: tangent_energy, anisotropy_share, subspace_stability, update_alignment —
and the proxy fit's rows (proxy_fit). A setting is checked only where every run's recipe has it
(a probe one run lacks has no shared rows).

Statistics precision (:func:`precision_refusals`, read from the manifests' ``statistics_dtype``;
runs from before the setting are float64): runs whose statistics were accumulated at different
precisions are compared only when every float32 run's stated bound (``statistics_bound``: the
second moments' error per unit of ``Σ‖x − c‖²``, :mod:`tangentlens.capture.precision`) is at
most :data:`MIXED_PRECISION_BOUND`, flagged in one line; otherwise every row is refused, in one
line naming each run's precision and bound.

Flagged (:data:`FLAGGED`, one warning line each, nothing refused): ``data.seq_len``,
``data.max_tokens`` (the token budget) and the corpus size (the tokens the runs analysed: the
``capture`` probe's ``n_tokens`` at the compared steps).

Estimators (:func:`estimator_scopes`): the manifest's ``estimators`` entry says how each family
of metrics was computed (the core's, and each probe's :class:`~tangentlens.reporting.Estimator`);
an entry that differs between the runs — or that one run does not record (written before that
estimator was named) — refuses the rows it describes, in one line
naming the entry and each run's text; an entry of no known scope refuses every row. Runs from
before and after a change of estimator are not compared on what the change moved.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tangentlens.comparison.runs import Run
from tangentlens.registry import FIT_PROBE, TANGENT, builtin_probes, installed_probes, resolve

__all__ = [
    "FLAGGED",
    "MIXED_PRECISION_BOUND",
    "Refusal",
    "Setting",
    "corpus_size_flag",
    "estimator_refusals",
    "estimator_scopes",
    "fit_window_lines",
    "flag_lines",
    "must_match",
    "precision_refusals",
    "probe_settings",
    "recipe_differences",
    "refusals",
    "transition_refusal",
]

Row = dict[str, Any]

#: ``Setting.probes`` of the tangent account's rows (:func:`tangent_account`).
TANGENT_ACCOUNT = "the tangent account"
_MISSING = object()


@functools.cache
def tangent_account() -> tuple[str, ...]:
    """The probes that score the tangent proxies — every registered probe (built-in or
    installed) of scope ``tangent`` — and the proxy fit's own rows."""
    probes = [*builtin_probes().values(), *installed_probes().values()]
    names = sorted(
        (p.name for p in probes if p.scope == "tangent"), key=lambda n: (n != TANGENT, n)
    )
    return (*names, FIT_PROBE)


@dataclass(frozen=True)
class Setting:
    """A recipe setting (``path``: its dotted key) and the rows it concerns: those of
    ``probes`` (None = every probe) whose metric starts with ``metric_prefix`` and ends with
    ``metric_suffix`` (or is one of ``metrics``, when given), only the per-bin rows if
    ``per_bin``. ``parts``: the path's table keys when one holds a dot (a probe named by an
    import path, ``probes."mypkg.probes:PROBE".lower``)."""

    name: str
    path: str
    probes: tuple[str, ...] | str | None = None
    metric_prefix: str = ""
    per_bin: bool = False
    metric_suffix: str = ""
    metrics: tuple[str, ...] | None = None
    parts: tuple[str, ...] = ()

    def concerns(self, row: Row) -> bool:
        probes = self.probe_names()
        metric = row["metric"]
        return (
            (probes is None or row["probe"] in probes)
            and metric.startswith(self.metric_prefix)
            and metric.endswith(self.metric_suffix)
            and (self.metrics is None or metric in self.metrics)
            and (not self.per_bin or row["freq_bin"] != "all")
        )

    def probe_names(self) -> tuple[str, ...] | None:
        """The probes whose rows it concerns (None = every probe)."""
        return tangent_account() if self.probes == TANGENT_ACCOUNT else self.probes

    def value(self, recipe: dict[str, Any]) -> Any:
        """The setting in a manifest's recipe, or ``_MISSING``."""
        node: Any = recipe
        for part in self.parts or self.path.split("."):
            if not isinstance(node, dict) or part not in node:
                return _MISSING
            node = node[part]
        return node

    def what(self) -> str:
        """The rows it concerns, in words."""
        if self.per_bin:
            return "per-bin rows (freq_bin ≠ all)"
        probes = ", ".join(self.probe_names() or ("every probe",))
        if self.metrics is not None:
            return f"{probes} rows ({', '.join(self.metrics)})"
        pattern = f"{self.metric_prefix}*{self.metric_suffix}"
        return f"{probes} rows" + (f" ({pattern})" if pattern != "*" else "")


#: The core's settings that must match for the rows they concern to be compared (else those
#: rows are refused); each probe adds its own (``Reporting.must_match``, :func:`must_match`).
_CORE_MUST_MATCH: tuple[Setting, ...] = (
    Setting("rank", "proxies.rank", TANGENT_ACCOUNT),
    Setting("control family", "proxies.mean_direction", TANGENT_ACCOUNT),
    Setting("fit policy", "proxies.fit_policy", TANGENT_ACCOUNT),
    Setting("held_out", "proxies.held_out", TANGENT_ACCOUNT),
    Setting("bins", "data.n_bins", per_bin=True),
)


def _registered() -> list[Any]:
    return [*builtin_probes().values(), *installed_probes().values()]


@functools.cache
def must_match() -> tuple[Setting, ...]:
    """Every setting that must match: the core's, then the registered probes' declared ones
    (``Reporting.must_match``), each over the rows of every probe that declares it."""
    declared: dict[tuple[str, str, str], list[str]] = {}
    for probe in _registered():
        for m in probe.reporting.must_match:
            declared.setdefault((m.name, m.path, m.metric_prefix), []).append(probe.name)
    return (
        *_CORE_MUST_MATCH,
        *(
            Setting(name, path, tuple(probes), metric_prefix=prefix)
            for (name, path, prefix), probes in declared.items()
        ),
    )


def _probe_names(runs: Sequence[Run]) -> dict[str, str]:
    """Recipe key → the probe name its rows carry, for the probes every run's recipe enables
    (the manifests record the name; else the key)."""
    keys = set.intersection(*(set(run.recipe.get("probes", {})) for run in runs))
    names: dict[str, str] = {}
    for key in sorted(keys):
        for run in runs:
            entry = run.manifest.get("probes", {}).get(key)
            if isinstance(entry, dict) and "name" in entry:
                names[key] = entry["name"]
        names.setdefault(key, key)
    return names


def probe_settings(runs: Sequence[Run]) -> list[Setting]:
    """Every key of the recipe table of each probe the runs share (its rows must not be
    compared when the key differs), but those the probe declares may differ
    (``Reporting.may_differ``) and those a declared must-match setting already names; a probe
    this installation cannot resolve has none that may differ."""
    declared = {s.path for s in must_match()}
    out = []
    for key, name in _probe_names(runs).items():
        try:
            may_differ = set(resolve(key).reporting.may_differ)
        except ValueError:
            may_differ = set()
        tables = [run.recipe["probes"][key] for run in runs]
        fields = sorted(set().union(*(t for t in tables if isinstance(t, dict))))
        for field in fields:
            path = f"probes.{key}.{field}"
            if field not in may_differ and path not in declared:
                parts = ("probes", key, field)
                out.append(Setting(f"{name} setting {field}", path, (name,), parts=parts))
    return out


def _estimator(key: str, probes: tuple[str, ...] | str | None, **which: Any) -> Setting:
    return Setting(f"estimator {key}", f"estimators.{key}", probes, **which)


#: The rows each of the core's manifest ``estimators`` entries describes.
_CORE_ESTIMATORS: tuple[Setting, ...] = (
    _estimator("fit_window", TANGENT_ACCOUNT),
    _estimator("controls", TANGENT_ACCOUNT),
    _estimator("energy_ratio", ("tangent_energy", "update_alignment"), metric_suffix="_ratio"),
    _estimator(
        "energy_interval",
        ("tangent_energy",),
        metrics=("energy_fraction", "energy_ratio", "energy_complement_ratio"),
    ),
    _estimator("proxies", TANGENT_ACCOUNT),
    _estimator("pretrained_sae", TANGENT_ACCOUNT),
    _estimator("positions", None),
)


@functools.cache
def estimator_scopes() -> dict[str, Setting]:
    """The rows each manifest ``estimators`` entry describes (a difference refuses them): the
    core's entries and each registered probe's declared ones (``Reporting.estimators``) over
    that probe's rows."""
    declared = (
        _estimator(e.key, (probe.name,), metric_prefix=e.metric_prefix)
        for probe in _registered()
        for e in probe.reporting.estimators
    )
    return {s.path.removeprefix("estimators."): s for s in (*_CORE_ESTIMATORS, *declared)}


#: Settings that may differ: each difference is flagged in one line.
FLAGGED: tuple[Setting, ...] = (
    Setting("seq_len", "data.seq_len"),
    Setting("token budget", "data.max_tokens"),
)


def _values(runs: Sequence[Run], setting: Setting) -> list[Any] | None:
    """Every run's value of the setting; None when a run's recipe lacks it."""
    values = [setting.value(run.recipe) for run in runs]
    return None if any(v is _MISSING for v in values) else values


def _listed(runs: Sequence[Run], values: Sequence[Any]) -> str:
    return ", ".join(f"{run.label} {_shown(v)}" for run, v in zip(runs, values, strict=True))


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "none"
    return str(value)


@dataclass(frozen=True)
class Refusal:
    """A must-match setting that differs, or the transitions across-steps rows read: the rows
    it concerns (:meth:`concerns`) are not compared. ``rows``: what it refuses when that is not
    a setting's rows (a row → bool), else None."""

    setting: Setting | None
    line: str
    rows: Callable[[Row], bool] | None = None

    def concerns(self, row: Row) -> bool:
        """Whether the refusal covers ``row``."""
        if self.rows is not None:
            return self.rows(row)
        return self.setting is not None and self.setting.concerns(row)


def transition_refusal(runs: Sequence[Run], steps: Sequence[int]) -> Refusal | None:
    """Across-steps rows (a transition s → s′ into the compared step: update alignment, the
    previous step's principal angles, a researcher's ``across`` probe) are compared only
    between the same transitions: the refusal of every across row when the runs' transitions
    into their compared steps differ (64 → 1200 against 0 → 1200), else None."""
    transitions = [run.transition(step) for run, step in zip(runs, steps, strict=True)]
    probes = sorted(
        {
            r["probe"]
            for run, step in zip(runs, steps, strict=True)
            for r in run.rows
            if r["step"] == step and run.is_across(r)
        }
    )
    if len(set(transitions)) == 1 or not probes:
        return None
    shown = ", ".join(
        f"{run.label} {'start' if s is None else s} → {e}"
        for run, (s, e) in zip(runs, transitions, strict=True)
    )
    line = f"transitions differ ({shown}): across-steps rows ({', '.join(probes)}) not compared"
    return Refusal(None, line, lambda row: any(run.is_across(row) for run in runs))


def refusals(runs: Sequence[Run]) -> list[Refusal]:
    """The must-match settings whose values differ across the runs (the core's, the probes'
    declared ones and their own recipe tables' keys: :func:`probe_settings`), each with its
    line."""
    out = []
    for setting in (*must_match(), *probe_settings(runs)):
        values = _values(runs, setting)
        if values is not None and len({repr(v) for v in values}) > 1:
            line = (
                f"{setting.name} differs ({setting.path}: {_listed(runs, values)}): "
                f"{setting.what()} not compared"
            )
            out.append(Refusal(setting, line))
    return out


def _estimator_text(run: Run, key: str) -> str:
    """A run's ``estimators`` entry, shortened for one line (``"not recorded"`` if absent)."""
    text = run.manifest.get("estimators", {}).get(key)
    if text is None:
        return "not recorded"
    return f'"{text if len(text) <= 48 else text[:47] + "…"}"'


def estimator_refusals(runs: Sequence[Run]) -> list[Refusal]:
    """The manifests' ``estimators`` entries that differ across the runs (an entry one run does
    not record differs), each refusing the rows it describes (:func:`estimator_scopes`; every
    row for an entry of no known scope)."""
    recorded = [run.manifest.get("estimators", {}) for run in runs]
    out = []
    for key in sorted(set().union(*recorded)):
        values = [entries.get(key) for entries in recorded]
        if len({repr(v) for v in values}) == 1:
            continue
        setting = estimator_scopes().get(key, _estimator(key, None))
        texts = "; ".join(f"{run.label}: {_estimator_text(run, key)}" for run in runs)
        line = f"{setting.name} differs ({texts}): {setting.what()} not compared"
        out.append(Refusal(setting, line))
    return out


#: The largest stated float32 bound (relative, per unit of ``Σ‖x − c‖²``) at which runs of
#: different statistics precisions are still compared: eigenvalues within 0.1 % of the spread.
MIXED_PRECISION_BOUND = 1e-3


def _precision(run: Run) -> tuple[str, float]:
    """A run's statistics precision and its stated relative bound (0 for float64)."""
    dtype = run.manifest.get("statistics_dtype", "float64")
    bound = run.manifest.get("statistics_bound", {}).get("relative", 0.0)
    return dtype, float(bound) if dtype == "float32" else 0.0


def precision_refusals(runs: Sequence[Run]) -> tuple[list[Refusal], list[str]]:
    """(refusals, flag lines) for runs of different statistics precisions: nothing when they
    agree; a flag when every float32 run's bound is within :data:`MIXED_PRECISION_BOUND`; else
    one refusal of every row."""
    found = [_precision(run) for run in runs]
    if len({dtype for dtype, _ in found}) == 1:
        return [], []
    listed = ", ".join(
        f"{run.label} {dtype}" + (f" (bound {bound:.1e})" if bound else "")
        for run, (dtype, bound) in zip(runs, found, strict=True)
    )
    if max(bound for _, bound in found) <= MIXED_PRECISION_BOUND:
        return [], [f"statistics precision differs ({listed}): within {MIXED_PRECISION_BOUND:g}"]
    line = (
        f"statistics precision differs ({listed}), a bound above {MIXED_PRECISION_BOUND:g}: "
        "no row compared (rerun one with capture.precision matching the other)"
    )
    return [Refusal(Setting("statistics precision", "statistics_dtype"), line)], []


def flag_lines(runs: Sequence[Run]) -> list[str]:
    """One line per flagged recipe setting that differs (compared, but read with care)."""
    out = []
    for setting in FLAGGED:
        values = _values(runs, setting)
        if values is not None and len({repr(v) for v in values}) > 1:
            out.append(f"{setting.name} differs ({setting.path}: {_listed(runs, values)})")
    return out


def corpus_size_flag(runs: Sequence[Run], steps: Sequence[int]) -> str | None:
    """One line when the tokens analysed (``capture`` ``n_tokens`` at each run's compared step)
    differ; None when they agree or a run has no such row."""
    sizes = []
    for run, step in zip(runs, steps, strict=True):
        found = [
            r["value"]
            for r in run.rows
            if r["probe"] == "capture" and r["metric"] == "n_tokens" and r["step"] == step
        ]
        if not found:
            return None
        sizes.append(int(found[0]))
    if len(set(sizes)) == 1:
        return None
    return f"corpus size differs (tokens analysed: {_listed(runs, sizes)})"


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, dict):
        return {prefix: node}
    out: dict[str, Any] = {}
    for key, value in node.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            out.update(_flatten(value, path))
        else:
            out[path] = value
    return out


def recipe_differences(runs: Sequence[Run]) -> list[tuple[str, list[str]]]:
    """``(recipe key, each run's value as text)`` for every key whose values differ, keys
    sorted; a probe that some runs do not run is one entry ``probes.<name>``: "on" or "—"."""
    enabled = [set(run.recipe.get("probes", {})) for run in runs]
    partial = set().union(*enabled) - set.intersection(*enabled)
    out = [
        (f"probes.{name}", ["on" if name in e else "—" for e in enabled])
        for name in sorted(partial)
    ]
    flat = [_flatten(run.recipe) for run in runs]
    for key in sorted(set().union(*flat)):
        if key.split(".")[:2] in (["probes", name] for name in partial):
            continue
        values = [f.get(key, _MISSING) for f in flat]
        if len({repr(v) for v in values}) > 1:
            out.append((key, ["—" if v is _MISSING else _shown(v) for v in values]))
    return sorted(out)


def fit_window_lines(runs: Sequence[Run]) -> list[str]:
    """Each run's fit window (the checkpoints frozen-early proxies were fitted on) when they
    differ; nothing when they agree or no run has one."""
    windows = [tuple(run.manifest.get("fit_window") or ()) for run in runs]
    if len(set(windows)) <= 1:
        return []
    return [
        f"fit window of {run.label}: " + (", ".join(map(str, w)) if w else "none")
        for run, w in zip(runs, windows, strict=True)
    ]
