"""A suite's facts, parsed once from its spec (or read from a model in memory): its kind, family,
loader, checkpoint steps and their revisions, where its tokenizer is read, whether it has a
language-modelling head, its model's name and shape, and why per-head attention statistics cannot
be taken from it. No torch, no model library: a sweep is planned from these alone
(:func:`tangentlens.core.resolve.resolve`), and every check of the plan reads them.

>>> facts = suite_facts("mini-pythia")
>>> facts.kind, facts.family, facts.loader, facts.steps[:3]
('mini', 'decoder', 'hooked', (0, 1, 2))
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tangentlens.models.catalog import (
    ENCODER_MODEL_TYPES,
    check_pythia_model,
    checkpoint_folders,
    checkpoint_headless,
    checkpoint_model_type,
    parse_suite_spec,
    resolve_loader,
)
from tangentlens.models.configs import MINI_SUITE_CONFIGS
from tangentlens.models.hub_suites import HUB_SUITES
from tangentlens.models.schedule import PYTHIA_STEPS
from tangentlens.models.shapes import ModelShape, pythia_config

if TYPE_CHECKING:
    from tangentlens.models.adapter import LensModel

__all__ = ["SuiteFacts", "model_facts", "suite_facts"]


@dataclass(frozen=True)
class SuiteFacts:
    """What is known of a suite (or of one model) before a checkpoint is loaded.

    ``name``: the suite's spec as the recipe names it (a model's label); ``kind``: ``"pythia"``,
    ``"hub"``, ``"local"``, ``"mini"`` or ``"model"`` (a model in memory); ``family``:
    ``"decoder"`` / ``"encoder"``; ``loader``: the loader every checkpoint is loaded with
    (resolved: ``"hooked"``, ``"bridge"`` or ``"hf"``); ``steps``: its checkpoint steps,
    ascending; ``revisions``: each step's hub revision (hub suites) or folder (local suites),
    aligned with ``steps`` (empty for a mini suite, trained on first use); ``tokenizer``: the
    revision or folder its tokenizer is read from; ``headless``: the architectures when they
    have no language-modelling head (empty: a head, so a loss to differentiate);
    ``model_name``: the model the checkpoints are of; ``shape``: its
    :class:`~tangentlens.models.shapes.ModelShape` (None where not known offline, with
    ``unknown_shape`` saying why); ``d_model`` and ``n_layers``: its width and blocks (None when
    unknown); ``attention``: why per-head attention statistics cannot be taken from it (None:
    they can, or it is not known before a checkpoint is loaded); ``no_loss``: why there is no
    loss to differentiate (None: there is)."""

    name: str
    kind: str
    family: str
    loader: str
    steps: tuple[int, ...]
    revisions: tuple[str, ...] = ()
    tokenizer: str = ""
    headless: tuple[str, ...] = ()
    model_name: str = ""
    shape: ModelShape | None = None
    unknown_shape: str = ""
    d_model: int | None = None
    n_layers: int | None = None
    attention: str | None = None
    no_loss: str | None = None

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-able form (the run directory's ``plan.json``)."""
        shape = None if self.shape is None else vars(self.shape)
        return {
            "name": self.name,
            "kind": self.kind,
            "family": self.family,
            "loader": self.loader,
            "steps": list(self.steps),
            "revisions": list(self.revisions),
            "tokenizer": self.tokenizer,
            "headless": list(self.headless),
            "model_name": self.model_name,
            "shape": shape,
            "unknown_shape": self.unknown_shape,
            "attention": self.attention,
            "no_loss": self.no_loss,
        }


def _local_model_name(root: Path) -> str:
    """A local suite's model: its ``suite.json`` ``model_name``, else the folder's name."""
    meta = root / "suite.json"
    try:
        metadata = json.loads(meta.read_text()) if meta.is_file() else {}
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read {meta}: {error}") from error
    named = metadata.get("model_name") if isinstance(metadata, dict) else None
    return str(named or root.absolute().name)


def _shape(read: Callable[[], ModelShape]) -> tuple[ModelShape | None, str]:
    """``(shape, "")``, or ``(None, why)`` when it cannot be read offline."""
    try:
        return read(), ""
    except ValueError as error:
        return None, str(error)


def suite_facts(spec: str, loader: str = "auto") -> SuiteFacts:
    """The facts of the suite ``open_suite(spec)`` opens, without opening it: the spec parsed
    once (:func:`~tangentlens.models.catalog.parse_suite_spec`), ``loader`` (``"auto"``: the
    suite's default) resolved for its model type. An unknown spec, or a loader that cannot load
    the suite, is a ``ValueError``."""
    kind, target = parse_suite_spec(spec)
    headless: tuple[str, ...] = ()
    if kind == "pythia":
        check_pythia_model(target)
        steps, family, model_type = PYTHIA_STEPS, "decoder", None
        revisions, tokenizer, name = tuple(f"step{s}" for s in steps), "main", target
        shape, unknown = _shape(lambda: ModelShape.from_hf_config(pythia_config(target), target))
    elif kind == "hub":
        entry = HUB_SUITES[target]
        steps, family, model_type = entry.steps, entry.family, entry.config.get("model_type")
        revisions = tuple(entry.revision(s) for s in steps)
        tokenizer, name = revisions[-1], target
        loader = entry.loader if loader == "auto" else loader
        shape, unknown = _shape(lambda: ModelShape.from_hf_config(entry.config, target))
    elif kind == "local":
        folders = checkpoint_folders(target)
        steps, last = tuple(folders), folders[max(folders)]
        model_type = checkpoint_model_type(next(iter(folders.values())))
        family = "encoder" if model_type in ENCODER_MODEL_TYPES else "decoder"
        revisions, tokenizer = tuple(p.name for p in folders.values()), str(last)
        headless = tuple(checkpoint_headless(last) or ())
        name = _local_model_name(Path(target).expanduser())
        shape, unknown = _shape(lambda: ModelShape.from_folder(last))
    else:
        config = MINI_SUITE_CONFIGS[target]
        steps, family, model_type = config.schedule(), config.family, None
        revisions, tokenizer, name = (), "", target
        shape, unknown = ModelShape.from_mini(config), ""
    resolved = resolve_loader(loader, family, model_type)
    return SuiteFacts(
        name=spec,
        kind=kind,
        family=family,
        loader=resolved,
        steps=tuple(steps),
        revisions=revisions,
        tokenizer=tokenizer,
        headless=headless,
        model_name=name,
        shape=shape,
        unknown_shape=unknown,
        d_model=None if shape is None else shape.d_model,
        n_layers=None if shape is None else shape.n_layers,
        attention=_suite_attention(spec, resolved, shape),
        no_loss=(
            f"suite {spec!r} has no language-modelling head (architectures {list(headless)})"
            if headless
            else None
        ),
    )


def _suite_attention(spec: str, loader: str, shape: ModelShape | None) -> str | None:
    """Why a suite's checkpoints give no per-head attention statistics, as far as its loader
    and published shape tell (a loaded model can still lack the hooks: checked again then)."""
    if loader == "hf":
        return (
            f"suite {spec!r} loads through loader 'hf', which hooks the encoder's layers, not "
            "its attention heads (no per-head queries, keys or patterns)"
        )
    if shape is not None and shape.n_kv_heads != shape.n_heads:
        return (
            f"suite {spec!r} uses grouped-query attention ({shape.n_heads} query heads, "
            f"{shape.n_kv_heads} key/value heads): per-head query/key drift needs one key per "
            "query head"
        )
    return None


def model_facts(model: LensModel, name: str, step: int, loss: str) -> SuiteFacts:
    """The facts of one model in memory (:func:`tangentlens.measure`): labelled ``name`` at
    ``step``; ``loss`` is the capture's (``"none"``: no loss to differentiate)."""
    if not model.has_lm_head:
        no_loss: str | None = "the model has no language-modelling head"
    elif loss == "none":
        no_loss = "no loss was chosen"
    else:
        no_loss = None
    return SuiteFacts(
        name=name,
        kind="model",
        family=model.family,
        loader="",
        steps=(step,),
        model_name=model.model_name or name,
        unknown_shape="a model in memory: no memory plan",
        d_model=model.d_model,
        n_layers=model.n_layers,
        attention=model.attention_refusal(),
        no_loss=no_loss,
    )
