"""The catalogue of checkpoint suites: which specs :func:`tangentlens.models.open_suite` accepts
and each suite's checkpoint steps, known without opening it — the mini suites' from their configs,
Pythia's fixed schedule, a local folder's step subfolders. No torch, no model library: planning a
sweep (a recipe's step selection, the frozen-early fit window) stays light.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Literal

from tangentlens.models.configs import MINI_SUITE_CONFIGS
from tangentlens.models.schedule import PYTHIA_STEPS

__all__ = [
    "HEADLESS_ARCHITECTURES",
    "PYTHIA_MODELS",
    "PYTHIA_SIZES",
    "SUITE_KINDS",
    "check_pythia_model",
    "checkpoint_folders",
    "checkpoint_headless",
    "headless_architectures",
    "parse_suite_spec",
    "suite_steps",
]

SuiteKind = Literal["pythia", "local", "mini"]

SUITE_KINDS: tuple[str, ...] = ("pythia", "local", *MINI_SUITE_CONFIGS)
PYTHIA_SIZES: tuple[str, ...] = (
    "14m", "31m", "70m", "160m", "410m", "1b", "1.4b", "2.8b", "6.9b", "12b",
)  # fmt: skip
PYTHIA_MODELS: tuple[str, ...] = tuple(
    f"EleutherAI/pythia-{size}{suffix}" for size in PYTHIA_SIZES for suffix in ("", "-deduped")
)
#: Hugging Face architectures holding a model without its language-modelling head (``BertModel``:
#: the encoder alone, as sentence-embedding checkpoints ship). They load for activation-only
#: probes; with no head there is no loss to differentiate (the capture loss ``"none"``).
HEADLESS_ARCHITECTURES: tuple[str, ...] = ("BertModel",)
_STEP_DIR = re.compile(r"^(?:step|checkpoint-)(\d+)$")


def parse_suite_spec(spec: str) -> tuple[SuiteKind, str]:
    """``(kind, target)`` of a suite spec: ``("pythia", model name)`` for ``"EleutherAI/pythia-…"``
    (optionally prefixed ``"pythia:"``), ``("local", folder)`` for an existing path, a path with
    a separator or ``"local:PATH"``, ``("mini", name)`` for a mini suite (``"mini-pythia"``,
    ``"mini-bert"``, ``"micro-*"``). Anything else is a ``ValueError`` listing the forms."""
    kind, _, rest = spec.partition(":") if ":" in spec else ("", "", spec)
    if kind == "pythia" or (not kind and rest.startswith("EleutherAI/pythia")):
        return "pythia", rest
    if kind == "local" or (not kind and (Path(rest).expanduser().exists() or os.sep in rest)):
        return "local", rest
    if not kind and rest in MINI_SUITE_CONFIGS:
        return "mini", rest
    raise ValueError(
        f"unknown suite {spec!r}; allowed: {', '.join(repr(k) for k in MINI_SUITE_CONFIGS)}, "
        "a Pythia model ('pythia:EleutherAI/pythia-160m'; models: "
        f"{', '.join(PYTHIA_MODELS)}), or a checkpoint folder ('local:/path/to/folder')"
    )


def check_pythia_model(name: str) -> str:
    """``name`` if it is one of :data:`PYTHIA_MODELS`, else a ``ValueError`` listing them."""
    if name not in PYTHIA_MODELS:
        raise ValueError(f"unknown Pythia model {name!r}; allowed: {list(PYTHIA_MODELS)}")
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
    it: a mini suite's from its config (trained or not), Pythia's :data:`PYTHIA_STEPS`, a local
    folder's step subfolders. An unknown spec or Pythia model raises the ``ValueError`` that
    ``open_suite`` raises."""
    kind, target = parse_suite_spec(spec)
    if kind == "pythia":
        check_pythia_model(target)
        return PYTHIA_STEPS
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
