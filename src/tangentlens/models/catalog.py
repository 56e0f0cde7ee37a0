"""The catalogue of checkpoint suites: which specs :func:`tangentlens.models.open_suite` accepts
and each suite's checkpoint steps, known without opening it — the mini suites' from their configs,
Pythia's fixed schedule, a local folder's step subfolders. No torch, no model library: planning a
sweep (a recipe's step selection, the frozen-early fit window) stays light.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from pathlib import Path
from typing import Literal

from tangentlens.models.configs import MINI_SUITE_CONFIGS
from tangentlens.models.hub_suites import (
    HUB_ALIASES,
    HUB_SUITES,
    REFUSED_HUB_IDS,
    resolve_hub_suite,
)
from tangentlens.models.schedule import PYTHIA_STEPS

__all__ = [
    "BRIDGE_MODEL_TYPES",
    "DEFAULT_LOADERS",
    "ENCODER_MODEL_TYPES",
    "HEADLESS_ARCHITECTURES",
    "HF_MODEL_TYPES",
    "LOADERS",
    "LOADER_CHOICES",
    "PYTHIA_MODELS",
    "PYTHIA_SIZES",
    "SUITE_KINDS",
    "check_pythia_model",
    "checkpoint_family",
    "checkpoint_folders",
    "checkpoint_headless",
    "checkpoint_model_type",
    "headless_architectures",
    "parse_suite_spec",
    "resolve_loader",
    "suite_family",
    "suite_loader",
    "suite_steps",
]

SuiteKind = Literal["pythia", "hub", "local", "mini"]

#: Kinds of checkpoint suite: Pythia on the hub, a hub-catalogue suite, a local folder, each mini
#: suite.
SUITE_KINDS: tuple[str, ...] = ("pythia", "hub", "local", *MINI_SUITE_CONFIGS)
#: The sizes of the Pythia suite.
PYTHIA_SIZES: tuple[str, ...] = (
    "14m", "31m", "70m", "160m", "410m", "1b", "1.4b", "2.8b", "6.9b", "12b",
)  # fmt: skip
#: Hub ids of every Pythia model, standard and deduplicated.
PYTHIA_MODELS: tuple[str, ...] = tuple(
    f"EleutherAI/pythia-{size}{suffix}" for size in PYTHIA_SIZES for suffix in ("", "-deduped")
)
#: Hugging Face architectures holding a model without its language-modelling head (``BertModel``:
#: the encoder alone, as sentence-embedding checkpoints ship). They load for activation-only
#: probes; with no head there is no loss to differentiate (the capture loss ``"none"``).
HEADLESS_ARCHITECTURES: tuple[str, ...] = ("BertModel",)
_STEP_DIR = re.compile(r"^(?:step|checkpoint-)(\d+)$")
#: ``config.json`` model types read as encoders (masked-LM loss); every other one is a decoder.
ENCODER_MODEL_TYPES: frozenset[str] = frozenset(
    {"bert", "roberta", "distilbert", "modernbert", "eurobert"}
)

#: How a suite loads a checkpoint (``suite.load(step, loader=…)``): ``"hooked"`` converts the
#: weights into TransformerLens' ``HookedTransformer`` / ``HookedEncoder``; ``"bridge"`` boots a
#: ``TransformerBridge`` around the Hugging Face model itself (raw weights, eager attention);
#: ``"hf"`` runs the Hugging Face masked-LM model itself (raw weights, SDPA attention) with forward
#: hooks on its layers, for the encoders TransformerLens neither converts nor bridges
#: (:data:`HF_MODEL_TYPES`; no per-head attention sites).
LOADERS: tuple[str, ...] = ("hooked", "bridge", "hf")
#: ``config.json`` model types only the ``"hf"`` loader loads (and the only ones it loads):
#: EuroBERT, ModernBERT (ModernCamemBERT is one). ``"auto"`` picks ``"hf"`` for them.
HF_MODEL_TYPES: frozenset[str] = frozenset({"eurobert", "modernbert"})
#: ``config.json`` model types only the ``"bridge"`` loader loads: TransformerLens bridges them
#: but does not convert them from a checkpoint folder (OLMo: its ``HookedTransformer`` config is
#: keyed on hub names). ``"auto"`` picks ``"bridge"`` for them, for folders as for hub suites.
BRIDGE_MODEL_TYPES: frozenset[str] = frozenset({"olmo"})
#: A recipe's ``suite.loader``: a loader, or ``"auto"`` = the family's :data:`DEFAULT_LOADERS`.
LOADER_CHOICES: tuple[str, ...] = ("auto", *LOADERS)
#: The loader ``"auto"`` picks per family. Both give the same table within the parity tolerances
#: (``tests/integration/test_bridge.py``) and capture within a few per cent of each other's time
#: on the CPU (``python -m benchmarks loaders``: the bridge 4–9 % faster at the mini shapes), so
#: the hooked loader stays the default of both families: the sweep's memory plan is measured on
#: its models (the bridge saves less per block but holds GPT-NeoX's Q/K/V twice, so that plan
#: does not bound it), and encoder rows keep their site names
#: (``blocks.{l}.hook_normalized_resid_post``). Checkpoints of :data:`HF_MODEL_TYPES` load
#: through ``"hf"`` whatever their family (see :func:`resolve_loader`).
DEFAULT_LOADERS: dict[str, str] = {"decoder": "hooked", "encoder": "hooked"}


def parse_suite_spec(spec: str) -> tuple[SuiteKind, str]:
    """``(kind, target)`` of a suite spec: ``("pythia", model name)`` for ``"EleutherAI/pythia-…"``
    (optionally prefixed ``"pythia:"``), ``("local", folder)`` for an existing path, a path with
    a separator or ``"local:PATH"``, ``("mini", name)`` for a mini suite (``"mini-pythia"``,
    ``"mini-bert"``, ``"micro-*"``), ``("hub", hub id)`` for a suite of the hub catalogue
    (:data:`~tangentlens.models.hub_suites.HUB_SUITES`: its hub id or short name, optionally
    prefixed ``"hub:"``). A refused hub id says why; anything else is a ``ValueError`` listing
    the forms."""
    kind, _, rest = spec.partition(":") if ":" in spec else ("", "", spec)
    if kind == "pythia" or (not kind and rest.startswith("EleutherAI/pythia")):
        return "pythia", rest
    catalogued = rest in HUB_SUITES or rest in HUB_ALIASES or rest in REFUSED_HUB_IDS
    if kind == "hub" or (not kind and catalogued and not Path(rest).expanduser().exists()):
        return "hub", resolve_hub_suite(rest).hub_id
    exists = Path(rest).expanduser().exists()
    if kind == "local" or (not kind and (exists or os.sep in rest)):
        if not kind and not exists:
            _refuse_misspelt_hub_id(rest)
        return "local", rest
    if not kind and rest in MINI_SUITE_CONFIGS:
        return "mini", rest
    raise ValueError(
        f"unknown suite {spec!r}; allowed: {', '.join(repr(k) for k in MINI_SUITE_CONFIGS)}, "
        "a Pythia model ('pythia:EleutherAI/pythia-160m'; models: "
        f"{', '.join(PYTHIA_MODELS)}), a hub suite ('hub:allenai/OLMo-1B-hf' or its short "
        f"name; suites: {', '.join(HUB_SUITES)}; short names: {', '.join(HUB_ALIASES)}), or a "
        "checkpoint folder ('local:/path/to/folder')"
    )


def _refuse_misspelt_hub_id(spec: str) -> None:
    """A ``ValueError`` when ``spec``, a path that does not exist, is close to the id or short
    name of a hub suite or a Pythia model (``allenai/OLMo-1b-hf``): most likely that suite,
    misspelt."""
    names = [*HUB_SUITES, *HUB_ALIASES, *PYTHIA_MODELS]
    by_case = {name.lower(): name for name in names}
    close = by_case.get(spec.lower()) or next(
        iter(difflib.get_close_matches(spec, names, n=1, cutoff=0.8)), None
    )
    if close is not None:
        raise ValueError(
            f"unknown suite {spec!r}: no such folder, and no hub suite of that name; did you "
            f"mean {close!r}? (a folder that does not exist yet: 'local:{spec}')"
        )


def check_pythia_model(name: str) -> str:
    """``name`` if it is one of :data:`PYTHIA_MODELS`, else a ``ValueError`` listing them."""
    if name not in PYTHIA_MODELS:
        by_case = {model.lower(): model for model in PYTHIA_MODELS}
        close = by_case.get(name.lower()) or next(
            iter(difflib.get_close_matches(name, PYTHIA_MODELS, n=1, cutoff=0.8)), None
        )
        hint = f" (did you mean {close!r}?)" if close else ""
        raise ValueError(f"unknown Pythia model {name!r}{hint}; allowed: {list(PYTHIA_MODELS)}")
    return name


def checkpoint_folders(path: str | Path) -> dict[int, Path]:
    """Step → checkpoint subfolder of a local suite folder, ascending: every subfolder named
    ``step<N>`` or ``checkpoint-<N>`` (its contents are not checked here). A missing folder, one
    without such subfolders, or two subfolders naming the same step (``step1/`` and
    ``checkpoint-1/``) is a ``ValueError``."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise ValueError(
            f"checkpoint folder {str(root)!r} does not exist or is not a folder; expected a "
            "folder with one Hugging Face checkpoint per subfolder (step1000/, step2000/, …)"
        )
    folders: dict[int, Path] = {}
    for child in sorted(root.iterdir()):
        match = _STEP_DIR.match(child.name)
        if match and child.is_dir():
            step = int(match.group(1))
            if step in folders:
                raise ValueError(
                    f"two checkpoint folders name step {step} in {str(root)!r}: "
                    f"{folders[step].name}/ and {child.name}/; keep one"
                )
            folders[step] = child
    if not folders:
        raise ValueError(
            f"no checkpoints found in {str(root)!r}: expected subfolders named step<N> or "
            "checkpoint-<N>, each holding config.json, weights (safetensors or bin) and "
            "tokenizer files"
        )
    return dict(sorted(folders.items()))


def suite_steps(spec: str) -> tuple[int, ...]:
    """The checkpoint steps, ascending, of the suite ``open_suite(spec)`` opens — without opening
    it: a mini suite's from its config (trained or not), Pythia's :data:`PYTHIA_STEPS`, a hub
    suite's from its catalogue entry, a local folder's step subfolders. An unknown spec or
    Pythia model raises the ``ValueError`` that ``open_suite`` raises."""
    kind, target = parse_suite_spec(spec)
    if kind == "pythia":
        check_pythia_model(target)
        return PYTHIA_STEPS
    if kind == "hub":
        return HUB_SUITES[target].steps
    if kind == "local":
        return tuple(checkpoint_folders(target))
    return MINI_SUITE_CONFIGS[target].schedule()


def checkpoint_headless(folder: str | Path) -> list[str] | None:
    """The architectures the ``config.json`` of checkpoint ``folder`` names when all of them are
    :data:`HEADLESS_ARCHITECTURES` (no language-modelling head), else None. An unreadable
    ``config.json`` is a ``ValueError``."""
    path = Path(folder) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read {path}: {error}") from error
    architectures = config.get("architectures") if isinstance(config, dict) else None
    if architectures and all(name in HEADLESS_ARCHITECTURES for name in architectures):
        return list(architectures)
    return None


def headless_architectures(spec: str) -> list[str] | None:
    """The architectures of the suite ``open_suite(spec)`` opens when its checkpoints have no
    language-modelling head (see :func:`checkpoint_headless`; read from a local suite's last
    checkpoint without opening it), None for a suite with one (Pythia, the mini suites, local
    decoders and MLM encoders)."""
    kind, target = parse_suite_spec(spec)
    if kind != "local":
        return None
    folders = checkpoint_folders(target)
    return checkpoint_headless(folders[max(folders)])


def resolve_loader(loader: str | None, family: str, model_type: str | None = None) -> str:
    """The loader ``loader`` names for a suite of ``family`` (``"decoder"`` / ``"encoder"``)
    whose ``config.json`` names ``model_type`` (None: not known): ``"auto"`` or None →
    ``"hf"`` for :data:`HF_MODEL_TYPES`, ``"bridge"`` for :data:`BRIDGE_MODEL_TYPES`, else
    :data:`DEFAULT_LOADERS`; else one of :data:`LOADERS` that can load that model type (a
    ``ValueError`` naming the one that can)."""
    only_hf, only_bridge = model_type in HF_MODEL_TYPES, model_type in BRIDGE_MODEL_TYPES
    if loader is None or loader == "auto":
        if family not in DEFAULT_LOADERS:
            raise ValueError(f"family must be one of {list(DEFAULT_LOADERS)}, got {family!r}")
        return "hf" if only_hf else "bridge" if only_bridge else DEFAULT_LOADERS[family]
    if loader not in LOADERS:
        raise ValueError(f"loader must be one of {LOADER_CHOICES}, got {loader!r}")
    if only_hf and loader != "hf":
        raise ValueError(
            f"checkpoints of model type {model_type!r} load only through loader 'hf' (or "
            f"'auto'): TransformerLens neither converts nor bridges them; got loader {loader!r}"
        )
    if only_bridge and loader != "bridge":
        raise ValueError(
            f"checkpoints of model type {model_type!r} load only through loader 'bridge' (or "
            f"'auto'): TransformerLens bridges them but does not convert them from a folder; "
            f"got loader {loader!r}"
        )
    if loader == "hf" and model_type is not None and not only_hf:
        raise ValueError(
            f"loader 'hf' loads model types {sorted(HF_MODEL_TYPES)}; this checkpoint is "
            f"{model_type!r}: use loader 'hooked', 'bridge' or 'auto'"
        )
    return loader


def checkpoint_model_type(folder: str | Path) -> str:
    """The ``model_type`` the ``config.json`` of checkpoint ``folder`` names (``""`` when none);
    an unreadable ``config.json`` is a ``ValueError``."""
    path = Path(folder) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read {path}: {error}") from error
    return str(config.get("model_type", "")) if isinstance(config, dict) else ""


def checkpoint_family(folder: str | Path) -> str:
    """``"encoder"`` when the ``config.json`` of checkpoint ``folder`` names an encoder's model
    type (:data:`ENCODER_MODEL_TYPES`), else ``"decoder"``."""
    return "encoder" if checkpoint_model_type(folder) in ENCODER_MODEL_TYPES else "decoder"


def suite_family(spec: str) -> str:
    """The family (``"decoder"`` / ``"encoder"``) of the suite ``open_suite(spec)`` opens,
    without opening it: a mini suite's from its config, Pythia's (decoders), a hub suite's from
    its catalogue entry, a local folder's from the ``config.json`` of its first checkpoint."""
    kind, target = parse_suite_spec(spec)
    if kind == "pythia":
        return "decoder"
    if kind == "hub":
        return HUB_SUITES[target].family
    if kind == "local":
        return checkpoint_family(next(iter(checkpoint_folders(target).values())))
    return MINI_SUITE_CONFIGS[target].family


def suite_loader(spec: str, loader: str | None = None) -> str:
    """The loader ``open_suite(spec).load(step, loader=loader)`` uses: ``"auto"`` or None is a
    hub suite's catalogue loader (:data:`~tangentlens.models.hub_suites.HUB_SUITES`), else the
    family's (:func:`resolve_loader`); a loader that cannot load the suite is a ``ValueError``."""
    kind, target = parse_suite_spec(spec)
    if kind == "hub":
        entry = HUB_SUITES[target]
        chosen = entry.loader if loader in (None, "auto") else loader
        return resolve_loader(chosen, entry.family, entry.config.get("model_type"))
    if kind == "local":
        first = next(iter(checkpoint_folders(target).values()))
        return resolve_loader(loader, checkpoint_family(first), checkpoint_model_type(first))
    return resolve_loader(loader, suite_family(spec))
