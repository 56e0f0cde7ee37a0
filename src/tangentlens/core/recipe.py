"""Recipes: a TOML file (``probes/recipes/*.toml``) → a validated, fully resolved :class:`Recipe`.

Unknown keys and bad values raise ``ValueError`` naming the key path and, for keys and choices,
the nearest valid spelling. Dotted overrides (``proxies.rank=32``) are parsed as TOML values and
applied before validation. Keys of the ``[proxies]`` stage written under ``[probes.tangent_energy]``
(recipes and ``--set`` from before the stage) are read from there, with one warning line.

Loading a recipe imports neither torch nor any model library (the configs it builds are plain
dataclasses), so a typo is reported at once.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import tomllib
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from tangentlens.capture.precision import PRECISIONS
from tangentlens.checks import build_section, check_choice, check_count, check_fraction, suggest
from tangentlens.core.proxy_stage import LEGACY_PROBE, PROXIES, ProxiesSpec, move_legacy_keys
from tangentlens.dictionaries.proxy_config import PRETRAINED_SAE
from tangentlens.models.catalog import LOADER_CHOICES
from tangentlens.registry import ProbeEntry, builtin_probes, entries, resolve

__all__ = [
    "CAPTURE_SITE_KINDS",
    "EXECUTOR_KINDS",
    "LAYER_FORMS",
    "WEIGHT_DTYPES",
    "CaptureSpec",
    "DataSpec",
    "ExecutorSpec",
    "ProxiesSpec",
    "Recipe",
    "SuiteSpec",
    "builtin_recipes",
    "load_recipe",
    "select_layers",
    "site_groups",
]


logger = logging.getLogger(__name__)

DEVICES: tuple[str, ...] = ("cpu", "cuda", "auto")
#: Weight dtypes a suite can be loaded in (``suite.dtype``); statistics accumulate in float64.
WEIGHT_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class SuiteSpec:
    """The checkpoint suite: ``name``, a spec for ``open_suite``; ``steps``, the step selection;
    ``offline``: true = the local Hugging Face cache only (false: as the environment says);
    where the model runs (``device``: "cpu", "cuda", "cuda:N" or "auto" = cuda when available);
    the dtype its weights are loaded in (``dtype``: one of :data:`WEIGHT_DTYPES`; activations and
    gradients come in that dtype, every statistic accumulates in float64); how each checkpoint is
    loaded (``loader``: "hooked" = TransformerLens' ``HookedTransformer`` / ``HookedEncoder``,
    "bridge" = its ``TransformerBridge`` around the Hugging Face model, "hf" = the Hugging Face
    model itself, "auto" = the family's default,
    :data:`~tangentlens.models.catalog.DEFAULT_LOADERS`)."""

    name: str = "mini-pythia"
    steps: str = "log:8"
    offline: bool = False
    device: str = "cpu"
    dtype: str = "float32"
    loader: str = "auto"

    def __post_init__(self) -> None:
        if self.loader not in LOADER_CHOICES:
            raise ValueError(
                f"suite.loader must be one of {LOADER_CHOICES}, got {self.loader!r}"
                f"{suggest(self.loader, LOADER_CHOICES)}"
            )
        if self.dtype not in WEIGHT_DTYPES:
            raise ValueError(
                f"suite.dtype must be one of {WEIGHT_DTYPES}, got {self.dtype!r}"
                f"{suggest(self.dtype, WEIGHT_DTYPES)}"
            )
        if self.device not in DEVICES and not re.fullmatch(r"cuda:\d+", self.device):
            raise ValueError(
                f"suite.device must be one of {DEVICES} or 'cuda:N', got {self.device!r}"
                f"{suggest(self.device, DEVICES)}"
            )

    def resolved_device(self) -> str:
        """The torch device string; "cuda" without a GPU is an error, "auto" falls back."""
        import torch

        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"suite.device = {self.device!r} but torch sees no CUDA device")
        return self.device

    def torch_dtype(self) -> Any:
        """``dtype`` as a ``torch.dtype``."""
        import torch

        return getattr(torch, self.dtype)


@dataclass(frozen=True)
class DataSpec:
    """Analysis data: ``corpus`` ("analysis" = the suite's ``analysis_corpus()``: a mini suite's
    held-out split, else the shipped corpus; or a ``load_corpus`` spec); rows of ``seq_len``
    tokens; at most ``max_tokens`` tokens; batches of ``batch_size`` rows; ``n_bins`` frequency
    bins."""

    corpus: str = "analysis"
    seq_len: int = 128
    max_tokens: int = 65536
    batch_size: int = 16
    n_bins: int = 5

    def __post_init__(self) -> None:
        for name in ("seq_len", "max_tokens", "batch_size", "n_bins"):
            check_count(getattr(self, name), f"data.{name}", minimum=1)
        if self.seq_len < 4:
            raise ValueError(f"data.seq_len must be ≥ 4, got {self.seq_len}")


#: Site kinds whose activations and gradients are (n × d) rows (q/k/pattern are per head).
CAPTURE_SITE_KINDS: tuple[str, ...] = (
    "resid_pre",
    "resid_mid",
    "resid_post",
    "attn_out",
    "mlp_out",
)


#: The forms of ``capture.layers``.
LAYER_FORMS: tuple[str, ...] = ("all", "every:K (0, K, 2K, …)", "a list such as '0,6,11'")


def _layer_form(spec: str) -> int | list[int]:
    """A stride (``"all"`` = 1, ``"every:K"`` = K) or the listed block indices; a malformed
    spec is a ``ValueError`` naming the allowed forms."""
    text = spec.strip()
    try:
        if text == "all":
            return 1
        if text.startswith("every:"):
            k = int(text.removeprefix("every:"))
            if k < 1:
                raise ValueError
            return k
        return sorted({int(part) for part in text.split(",")})
    except ValueError:
        raise ValueError(
            f"capture.layers: cannot read {spec!r}; allowed: {', '.join(LAYER_FORMS)}"
        ) from None


def select_layers(spec: str, n_layers: int) -> tuple[int, ...]:
    """The blocks ``capture.layers`` selects in a model of ``n_layers`` blocks: ``"all"``,
    ``"every:K"`` (0, K, 2K, …) or comma-separated indices. A malformed spec or an index
    outside [0, n_layers) is a ``ValueError`` naming it and the allowed forms."""
    form = _layer_form(spec)
    if isinstance(form, int):
        return tuple(range(0, n_layers, form))
    outside = [layer for layer in form if not 0 <= layer < n_layers]
    if outside:
        raise ValueError(
            f"capture.layers names block(s) {outside}, but the model has {n_layers} blocks "
            f"(0 … {n_layers - 1})"
        )
    return tuple(form)


T = typing.TypeVar("T")


def site_groups(sites: typing.Sequence[T], passes: int) -> list[list[T]]:
    """``sites`` in ``passes`` contiguous groups whose sizes differ by at most one (at most
    one group per site; ``passes`` 0, "auto" unresolved, counts as 1)."""
    k = max(1, min(passes, len(sites)))
    size, extra = divmod(len(sites), k)
    groups, start = [], 0
    for g in range(k):
        stop = start + size + (g < extra)
        groups.append(list(sites[start:stop]))
        start = stop
    return groups


@dataclass(frozen=True)
class CaptureSpec:
    """``sites`` (kinds from :data:`CAPTURE_SITE_KINDS`) at the blocks ``layers`` selects
    (``"all"``, ``"every:K"`` or a list ``"0,6,11"``), plus the embedding if ``embed``; the
    ``reservoir`` size (rows sampled per site); the loss ``reduction`` (``"sum"``, the only one:
    gradients of the summed token loss); ``seed`` of the reservoir's sampling and the masked-LM
    masking; ``threads``: the torch intra-op threads every unit pins, so that reductions run in
    the same order wherever a unit runs (part of the recipe: another thread count can change the
    last bits of a sum); ``passes``: capture passes per step, each over a contiguous group of the
    sites (the model runs once per pass; a site's statistics do not depend on its group; 0 = the
    fewest that fit the device's memory, chosen by the memory plan where the unit runs);
    ``precision``: of the statistics' d × d sums — ``"float64"`` (every sum in float64),
    ``"float32"`` (the second moments from float32 Grams of rows shifted by a frozen mean, added
    into float64, and the attention entropy's rows in float32: within the bound
    :mod:`tangentlens.capture.precision` states, which the manifest records) or ``"auto"``
    (float64 on the CPU and on GPUs with full-rate float64 — P100, V100, A100, H100, B200 —,
    float32 on the others, where float64 runs at 1/32–1/64 of float32); recorded in the
    manifest as resolved (``statistics_dtype``)."""

    sites: tuple[str, ...] = ("resid_post",)
    layers: str = "all"
    embed: bool = False
    reservoir: int = 4096
    reduction: str = "sum"
    seed: int = 0
    threads: int = 2
    passes: int = 1
    precision: str = "float64"

    def __post_init__(self) -> None:
        for kind in self.sites:
            if kind not in CAPTURE_SITE_KINDS:
                raise ValueError(
                    f"capture.sites: unknown site kind {kind!r}; allowed: {CAPTURE_SITE_KINDS}"
                    f"{suggest(kind, CAPTURE_SITE_KINDS)}"
                )
        if self.reduction != "sum":
            raise ValueError(
                f"capture.reduction must be 'sum', got {self.reduction!r} ('mean' was removed: "
                "dividing each batch by its own token count reweighted tokens across batches)"
            )
        check_count(self.reservoir, "capture.reservoir", minimum=0)
        check_count(self.threads, "capture.threads", minimum=1)
        check_count(self.passes, "capture.passes", minimum=0)
        check_choice(self.precision, "capture.precision", PRECISIONS)
        _layer_form(self.layers)  # the form here; the range once a model is known


#: Where a sweep's units can run (``executor.kind``).
EXECUTOR_KINDS: tuple[str, ...] = ("local", "ray", "slurm", "submitit-local")


@dataclass(frozen=True)
class ExecutorSpec:
    """Where and how the sweep's units run (``[executor]``). Not part of the recipe's identity
    (:meth:`Recipe.to_dict`): a run started on one executor resumes on another.

    ``kind``: one of :data:`EXECUTOR_KINDS`. ``workers``: units running at once on one
    machine, 0 = as many as its cores hold at ``capture.threads`` each (``ray``: the size of the
    local cluster it starts when ``RAY_ADDRESS`` is unset; ``submitit-local``: the cap on
    concurrently running jobs). ``retries``: times a failed unit is retried. Per unit:
    ``cpus_per_unit`` (at least ``capture.threads`` are requested), ``gpus_per_unit`` (units
    that load a model), ``memory_gb`` (0 = no request). Slurm: ``partition`` ("" = the
    cluster's default), ``time_min`` (a job's time limit, minutes), ``array_parallelism`` (jobs
    of an array running at once, 0 = unlimited), ``sbatch`` (extra options,
    ``[executor.sbatch]``: name → string or integer). ``folder``: where submitit writes job logs
    ("" = ``RUN_DIR/logs``).
    """

    kind: str = "local"
    workers: int = 0
    retries: int = 1
    cpus_per_unit: int = 1
    gpus_per_unit: float = 0.0
    memory_gb: float = 0.0
    partition: str = ""
    time_min: int = 60
    array_parallelism: int = 0
    sbatch: dict[str, str | int] = field(default_factory=dict)
    folder: str = ""

    def __post_init__(self) -> None:
        if self.kind not in EXECUTOR_KINDS:
            raise ValueError(
                f"executor.kind must be one of {EXECUTOR_KINDS}, got {self.kind!r}"
                f"{suggest(self.kind, EXECUTOR_KINDS)}"
            )
        for name, minimum in (
            ("workers", 0),
            ("retries", 0),
            ("cpus_per_unit", 1),
            ("time_min", 1),
            ("array_parallelism", 0),
        ):
            check_count(getattr(self, name), f"executor.{name}", minimum=minimum)
        for name in ("gpus_per_unit", "memory_gb"):
            check_fraction(getattr(self, name), f"executor.{name}", high=math.inf)
        if not isinstance(self.sbatch, dict):
            raise ValueError(f"executor.sbatch must be a table, got {self.sbatch!r}")
        for key, value in self.sbatch.items():
            if isinstance(value, bool) or not isinstance(value, str | int):
                raise ValueError(
                    f"executor.sbatch.{key} must be a string or an integer, got {value!r}"
                )


@dataclass(frozen=True)
class Recipe:
    """A fully resolved recipe. ``probes``: each enabled probe's :class:`ProbeEntry` by recipe
    key (a config given alone is resolved into its entry); ``proxies``: the proxies stage the
    ``tangent`` probes score (a recipe enabling one without it gets the stage's defaults; None:
    no proxies are fitted); ``executor`` says where its units run."""

    name: str
    suite: SuiteSpec = field(default_factory=SuiteSpec)
    data: DataSpec = field(default_factory=DataSpec)
    capture: CaptureSpec = field(default_factory=CaptureSpec)
    proxies: ProxiesSpec | None = None
    probes: dict[str, ProbeEntry] = field(default_factory=dict)
    executor: ExecutorSpec = field(default_factory=ExecutorSpec)

    def __post_init__(self) -> None:
        if not self.probes:
            raise ValueError(f"the recipe enables no probe; allowed: {list(builtin_probes())}")
        object.__setattr__(self, "probes", entries(self.probes))
        if self.proxies is None and self.scoped("tangent"):
            object.__setattr__(self, "proxies", ProxiesSpec())
        stage = self.proxies
        if stage is not None and stage.pretrained_sae is not None and self.capture.reservoir < 1:
            raise ValueError(
                f"{PROXIES}.{PRETRAINED_SAE} chooses its latents on the sampled activation rows: "
                "set capture.reservoir ≥ 1"
            )
        for entry in self.probes.values():
            entry.probe.check_recipe(entry.config, self)

    def scoped(self, *scopes: str) -> list[ProbeEntry]:
        """The entries of the probes whose scope is one of ``scopes``, in the recipe's order."""
        return [e for e in self.probes.values() if e.probe.scope in scopes]

    def config(self, key: str) -> Any:
        """The config of probe ``key``, or None when the recipe does not enable it."""
        entry = self.probes.get(key)
        return None if entry is None else entry.config

    def identity(self) -> dict[str, Any]:
        """:meth:`to_dict` as a manifest reads it back (a JSON round trip): what ``--resume``
        and ``--plan-only`` compare with a run's manifest."""
        return json.loads(json.dumps(self.to_dict()))

    def same_identity(self, recorded: dict[str, Any] | None) -> bool:
        """Whether a manifest's ``recorded`` recipe is this one's :meth:`identity` — a run
        written before the proxies stage recorded its keys under ``probes.tangent_energy``;
        they are read from there."""
        if recorded is None:
            return False
        return move_legacy_keys(recorded, notice=False) == self.identity()

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form of what the results depend on: the recipe's identity, recorded
        in the manifest and compared on ``--resume``. The executor is not part of it
        (:meth:`executor_dict`), nor ``capture.passes`` (how the sites are grouped changes no
        site's statistics); ``capture.precision`` is part of it unless float64 (so runs from
        before the setting, all float64, keep their identity)."""
        capture = dataclasses.asdict(self.capture)
        del capture["passes"]
        if capture["precision"] == "float64":
            del capture["precision"]
        out = {
            "name": self.name,
            "suite": dataclasses.asdict(self.suite),
            "data": dataclasses.asdict(self.data),
            "capture": capture,
            "probes": {k: _table(e.config) for k, e in self.probes.items()},
        }
        if self.proxies is not None:
            out[PROXIES] = dataclasses.asdict(self.proxies)
        return out

    def executor_dict(self) -> dict[str, Any]:
        """Plain JSON-able form of the executor settings (for the manifest)."""
        return dataclasses.asdict(self.executor)


def _table(config: Any) -> dict[str, Any]:
    """A probe's config as its recipe table (flat for a composed config)."""
    return config.to_table() if hasattr(config, "to_table") else dataclasses.asdict(config)


def _override_path(key: str) -> list[str]:
    """The table path of a ``--set`` key: its dotted parts, where a part in quotes is one part
    (TOML's quoted key, as a recipe file writes an import-path probe:
    ``probes."mypkg.probes:PROBE".per_bin``) and, under ``probes``, an unquoted import path is
    one part too (``probes.mypkg.probes:PROBE.per_bin``: the first part holding ``:`` ends it —
    no recipe key has one, and an attribute name has no dot)."""
    parts: list[str] = []
    current, quote = "", ""
    for char in key.strip():
        if quote:
            if char == quote:
                quote = ""
            else:
                current += char
        elif char in "\"'":
            quote = char
        elif char == ".":
            parts.append(current.strip())
            current = ""
        else:
            current += char
    if quote:
        raise ValueError(f"--set {key}: a quoted key part is not closed ({quote})")
    parts.append(current.strip())
    if not all(parts):
        raise ValueError(f"--set {key}: an empty key part (e.g. proxies.rank=32)")
    if parts[0] == "probes":
        colon = next((i for i, part in enumerate(parts[1:], 1) if ":" in part), None)
        if colon is not None and colon > 1:
            parts = ["probes", ".".join(parts[1 : colon + 1]), *parts[colon + 1 :]]
    return parts


def _apply_override(
    data: dict[str, Any], override: str, given: dict[tuple[str, ...], tuple[str, Any]]
) -> None:
    """Set ``data`` at the override's key; ``given``: the keys earlier overrides set (the path
    they reached and their text), so that one key given twice with two values is refused, as
    a recipe file refuses it."""
    if "=" not in override:
        raise ValueError(f"--set expects KEY=VALUE (e.g. proxies.rank=32), got {override!r}")
    key, raw = override.split("=", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word is a string
    parts = _override_path(key)
    stage_keys = [f.name for f in dataclasses.fields(ProxiesSpec)]
    if parts[:2] == ["probes", LEGACY_PROBE] and len(parts) > 2 and parts[2] in stage_keys:
        moved = ".".join([PROXIES, *parts[2:]])
        logger.warning("--set %s: %s now lives in [%s] (set %s)", key, parts[2], PROXIES, moved)
        parts = [PROXIES, *parts[2:]]
    path = tuple(parts)
    if path in given and given[path][1] != value:
        first = given[path][0]
        raise ValueError(
            f"--set sets {'.'.join(path)} twice: {first} and {override.strip()}; give it once"
        )
    given[path] = (override.strip(), value)
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"--set {key}: {part!r} is not a table")
    node[parts[-1]] = value


def _enabled_probes(table: Any) -> dict[str, Any]:
    """The recipe's probe tables without those switched off: ``probes.NAME = false`` (e.g.
    ``--set probes.qk_drift=false``) drops a probe a recipe enables, ``true`` enables one with
    its defaults; the name must still be a probe's."""
    if not isinstance(table, dict):
        raise ValueError("probes must be a table of probe tables")
    for key, value in table.items():
        if isinstance(value, bool):
            resolve(key)  # a misspelt probe is refused, not silently ignored
    return {
        key: {} if value is True else value for key, value in table.items() if value is not False
    }


def builtin_recipes() -> dict[str, Path]:
    """The recipes shipped in ``tangentlens.probes/recipes``."""
    folder = resources.files("tangentlens.probes") / "recipes"
    return {
        Path(str(entry)).stem: Path(str(entry))
        for entry in folder.iterdir()
        if str(entry).endswith(".toml")
    }


def load_recipe(spec: str | Path, overrides: typing.Sequence[str] = ()) -> Recipe:
    """A recipe by built-in name (``quickstart``) or TOML path, with dotted overrides."""
    builtin = builtin_recipes()
    path = Path(spec)
    if str(spec) in builtin:
        path = builtin[str(spec)]
    elif not path.is_file():
        raise ValueError(
            f"unknown recipe {str(spec)!r}: not a built-in ({sorted(builtin)}) nor a TOML file"
            f"{suggest(str(spec), builtin)}"
        )
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"recipe {path} is not valid TOML: {err}") from None
    data = move_legacy_keys(data, f"recipe {path.name}")
    given: dict[tuple[str, ...], tuple[str, Any]] = {}
    for override in overrides:
        _apply_override(data, override, given)
    allowed = ["suite", "data", "capture", PROXIES, "probes", "executor"]
    for key in data:
        if key not in allowed:
            raise ValueError(
                f"unknown recipe section {key!r}; allowed: {allowed}{suggest(key, allowed)}"
            )
    probes_table = _enabled_probes(data.get("probes", {}))
    probes = {
        key: build_section(resolve(key).config, table, f"probes.{key}")
        for key, table in probes_table.items()
    }
    stage = data.get(PROXIES, False)  # `--set proxies=false` drops the section, `true` adds it
    stage = {} if stage is True else stage
    return Recipe(
        name=path.stem,
        suite=build_section(SuiteSpec, data.get("suite", {}), "suite"),
        data=build_section(DataSpec, data.get("data", {}), "data"),
        capture=build_section(CaptureSpec, data.get("capture", {}), "capture"),
        proxies=None if stage is False else build_section(ProxiesSpec, stage, PROXIES),
        probes=probes,
        executor=build_section(ExecutorSpec, data.get("executor", {}), "executor"),
    )
