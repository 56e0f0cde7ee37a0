"""Checkpoint suites: one interface over hub suites (Pythia and the catalogue of
:mod:`~tangentlens.models.hub_suites`), local folders and the mini suites.

A suite lists its steps and the tokens seen at each, resolves step selections (see
:mod:`tangentlens.models.schedule`) and yields a TransformerLens model at a step, loaded with no
weight processing.

>>> suite = open_suite("mini-pythia")                    # doctest: +SKIP
>>> steps = suite.select("log:8")                        # doctest: +SKIP
>>> model = suite.load(steps[-1])                        # doctest: +SKIP
>>> bridge = suite.load(steps[-1], loader="bridge")      # doctest: +SKIP

``loader`` (see :data:`~tangentlens.models.catalog.LOADERS`): ``"hooked"`` gives a
``HookedTransformer`` / ``HookedEncoder``, ``"bridge"`` a ``TransformerBridge`` booted from the
checkpoint's folder; None or ``"auto"`` the family's default
(:data:`~tangentlens.models.catalog.DEFAULT_LOADERS`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from tangentlens.data import Corpus, load_corpus
from tangentlens.locking import release, try_lock
from tangentlens.models.catalog import (
    check_pythia_model,
    checkpoint_family,
    checkpoint_folders,
    checkpoint_headless,
    checkpoint_model_type,
    parse_suite_spec,
    resolve_loader,
)
from tangentlens.models.configs import MINI_SUITE_CONFIGS, MiniSuiteConfig
from tangentlens.models.hf_lens import HfLens
from tangentlens.models.hub import (
    Download,
    cached_snapshot,
    hf_offline_mode,
    hub_cache_dir,
    offline_requested,
)
from tangentlens.models.hub_suites import HubSuiteEntry, resolve_hub_suite
from tangentlens.models.schedule import (
    PYTHIA_STEPS,
    PYTHIA_TOKENS_PER_STEP,
    select_steps,
)
from tangentlens.models.shapes import pythia_config
from tangentlens.models.training import (
    ProgressCallback,
    TrainingEvent,
    corpus_fingerprint,
    heldout_corpus,
    train_mini_suite,
)
from tangentlens.models.weights import check_finite_files, verify_weight_files, weights_hash
from tangentlens.paths import cache_root

if TYPE_CHECKING:  # loading (TransformerLens) is imported when a checkpoint is loaded
    from transformer_lens import HookedEncoder, HookedTransformer
    from transformer_lens.model_bridge import TransformerBridge

    HookedModel = HookedTransformer | HookedEncoder | TransformerBridge

logger = logging.getLogger(__name__)

Family = Literal["decoder", "encoder"]


@dataclass(frozen=True)
class DuplicateCheckpoints:
    """Two consecutive steps whose weights are identical (same weights hash)."""

    previous: int
    step: int
    weights_hash: str


#: ``config.json`` fields that must agree across a suite's checkpoints (``architectures``: a head
#: that comes and goes would change the loss between steps).
CONFIG_FIELDS: tuple[str, ...] = (
    "architectures",
    "model_type",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
)


#: ``config.json`` fields compared with the config a suite's publisher states (what the memory
#: plan and the planning checks read before anything is loaded).
PUBLISHED_FIELDS: tuple[str, ...] = (*CONFIG_FIELDS, "num_key_value_heads")


def published_differences(published: dict[str, Any], config: dict[str, Any]) -> dict[str, list]:
    """Field → ``[published, cached]`` for the :data:`PUBLISHED_FIELDS` the ``published`` config
    states that ``config`` (a checkpoint's ``config.json``) gives otherwise (a missing
    ``num_key_value_heads`` is ``num_attention_heads``, as transformers reads it)."""
    differs = {}
    for name in PUBLISHED_FIELDS:
        if name not in published:
            continue
        value = config.get(name)
        if name == "num_key_value_heads" and value is None:
            value = config.get("num_attention_heads")
        if json.dumps(value) != json.dumps(published[name]):
            differs[name] = [published[name], value]
    return differs


@dataclass(frozen=True)
class SuiteIntegrity:
    """What :meth:`CheckpointSuite.verify` found: ``duplicates`` (identical weights),
    ``damaged`` (step → what is wrong with its files), ``config_differs`` (field → value at each
    step, for :data:`CONFIG_FIELDS` that differ), ``not_checked`` (steps not on this machine:
    nothing to check without downloading), ``checked`` (the steps that were),
    ``published_differs`` (step → field → ``[published, cached]``: the cached ``config.json``
    is not the one the suite's publisher states, see :func:`published_differences`) and whether
    that published config is confirmed (``published_confirmed``; the catalogue's unverified
    entries are not)."""

    duplicates: list[DuplicateCheckpoints]
    damaged: dict[int, str]
    config_differs: dict[str, dict[int, Any]]
    not_checked: list[int]
    checked: list[int] = field(default_factory=list)
    published_differs: dict[int, dict[str, list]] = field(default_factory=dict)
    published_confirmed: bool = True

    def problems(self) -> list[str]:
        """One line per damaged checkpoint, differing config field, or group of checkpoints
        whose config is not the confirmed published one (a sweep refuses them)."""
        lines = [
            f"checkpoint at step {step} is damaged: {error}" for step, error in self.damaged.items()
        ]
        for field_name, values in self.config_differs.items():
            by_value: dict[str, list[int]] = {}
            for step, value in values.items():
                by_value.setdefault(json.dumps(value), []).append(step)
            parts = "; ".join(
                f"{v} at step{'s' * (len(at) > 1)} {', '.join(map(str, at))}"
                for v, at in by_value.items()
            )
            lines.append(f"config.json field {field_name!r} differs across checkpoints: {parts}")
        if self.published_confirmed:
            lines += [
                f"config.json at {at} is not the suite's published config: {fields}; these "
                "are not its checkpoints (the memory plan and the planning checks read the "
                "published config)"
                for at, fields in self._published_lines("published")
            ]
        return lines

    def warnings(self) -> list[str]:
        """One line per group of checkpoints whose config differs from an unconfirmed published
        config (the catalogue's entry may be wrong: a sweep goes on, and says so)."""
        if self.published_confirmed:
            return []
        return [
            f"config.json at {at} differs from the catalogue's unconfirmed config: {fields}; "
            "the memory plan and the planning checks read the catalogue's"
            for at, fields in self._published_lines("catalogue")
        ]

    def _published_lines(self, source: str) -> list[tuple[str, str]]:
        """``(steps, differing fields)`` per group of steps with the same differences."""
        groups: dict[str, list[int]] = {}
        for step, differs in self.published_differs.items():
            fields = ", ".join(
                f"{name} {json.dumps(cached)} ({source} {json.dumps(published)})"
                for name, (published, cached) in differs.items()
            )
            groups.setdefault(fields, []).append(step)
        return [
            (f"step{'s' * (len(at) > 1)} {', '.join(map(str, at))}", fields)
            for fields, at in groups.items()
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "duplicates": [[d.previous, d.step] for d in self.duplicates],
            "damaged": {str(s): e for s, e in self.damaged.items()},
            "config_differs": {
                f: {str(s): v for s, v in d.items()} for f, d in self.config_differs.items()
            },
            "not_checked": self.not_checked,
            "checked": self.checked,
            "published_differs": {str(s): d for s, d in self.published_differs.items()},
        }


class CheckpointSuite(ABC):
    """A model's checkpoints across training. ``has_lm_head`` is False for checkpoints without
    a language-modelling head (e.g. ``BertModel``): no loss, activation-only probes."""

    kind: str
    name: str
    family: Family
    has_lm_head: bool = True

    @property
    @abstractmethod
    def steps(self) -> tuple[int, ...]:
        """Every step of the suite, ascending."""

    @abstractmethod
    def tokens_seen(self, step: int) -> int | None:
        """Training tokens seen at ``step`` (None when the suite does not know)."""

    @abstractmethod
    def load(
        self,
        step: int,
        *,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        loader: str | None = None,
    ) -> HookedModel:
        """The TransformerLens model at ``step``, with no weight processing, through ``loader``
        (``"hooked"``, ``"bridge"``; None or ``"auto"``: :meth:`loader`)."""

    def loader(self, loader: str | None = None) -> str:
        """The loader ``loader`` resolves to for this suite's family (None / ``"auto"``: the
        family's default); an unknown name is a ``ValueError`` naming the allowed ones."""
        return resolve_loader(loader, self.family)

    @abstractmethod
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The suite's tokenizer (the same at every step)."""

    def analysis_corpus(self) -> Corpus:
        """The text a sweep of this suite analyses by default (``data.corpus = "analysis"``): the
        corpus tangentlens ships (Shakespeare's plays); a mini suite's is the held-out split of
        its training corpus."""
        return load_corpus()

    @abstractmethod
    def weights_hash(self, step: int) -> str | None:
        """Hash of the weights at ``step`` (None when they are not on disk)."""

    @property
    def model_name(self) -> str:
        """The model the suite's checkpoints are of, as SAELens and TransformerLens name it
        (no organisation prefix): ``pythia-70m-deduped`` for ``EleutherAI/pythia-70m-deduped``."""
        return self.name.rstrip("/").rsplit("/", 1)[-1]

    def select(self, selection: str | int | Sequence[int] = "all") -> list[int]:
        """Resolve a step selection ("all", "log:N", "A..B", lists …) to steps of this suite."""
        return select_steps(self.steps, selection)

    def check_step(self, step: int) -> None:
        select_steps(self.steps, [step])

    @abstractmethod
    def cached_folder(self, step: int) -> Path | None:
        """The checkpoint's folder on this machine (None when it would have to be downloaded)."""

    def published_config(self) -> dict[str, Any] | None:
        """The ``config.json`` fields the suite's publisher states, which the memory plan and
        the planning checks read (None: the suite has none beside its checkpoints)."""
        return None

    #: Whether :meth:`published_config` is confirmed (a difference from it is then refused).
    published_confirmed: bool = True

    def verify(self, steps: Sequence[int] | None = None) -> SuiteIntegrity:
        """Check ``steps`` (default all) and the final checkpoint before anything runs: weight
        files whole and readable, the same architecture fields in every ``config.json``, each
        ``config.json`` the published one (:meth:`published_config`, where the suite has one),
        and which checkpoints hold identical weights (any pair, not only consecutive ones)."""
        chosen = sorted({*(steps if steps is not None else self.steps), self.steps[-1]})
        damaged: dict[int, str] = {}
        configs: dict[int, dict[str, Any]] = {}
        digests: dict[int, str] = {}
        not_checked = []
        for step in chosen:
            folder = self.cached_folder(step)
            if folder is None:
                not_checked.append(step)
                continue
            try:  # weights_hash checks the weight files first
                digests[step] = self.weights_hash(step) or ""
                configs[step] = json.loads((folder / "config.json").read_text())
            except (ValueError, OSError) as error:
                damaged[step] = str(error)
        first: dict[str, int] = {}
        duplicates = []
        for step, digest in digests.items():
            if digest in first:
                duplicates.append(DuplicateCheckpoints(first[digest], step, digest))
            else:
                first[digest] = step
        differs = {
            name: {step: config.get(name) for step, config in configs.items()}
            for name in CONFIG_FIELDS
            if len({json.dumps(config.get(name)) for config in configs.values()}) > 1
        }
        published = self.published_config()
        unpublished = {
            step: found
            for step, config in configs.items()
            if published and (found := published_differences(published, config))
        }
        checked = [step for step in chosen if step not in not_checked]
        return SuiteIntegrity(
            duplicates,
            damaged,
            differs,
            not_checked,
            checked=checked,
            published_differs=unpublished,
            published_confirmed=self.published_confirmed,
        )

    def duplicate_steps(self, steps: Sequence[int] | None = None) -> list[DuplicateCheckpoints]:
        """Pairs of checkpoints (among ``steps``, default all, and the final one) whose weights
        are identical: each later step with the earliest step it equals."""
        return self.verify(steps).duplicates

    def describe(self) -> dict[str, Any]:
        """What a results manifest records about the suite."""
        return {"kind": self.kind, "name": self.name, "family": self.family}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {len(self.steps)} steps)"


class HubSuite(CheckpointSuite):
    """A suite whose checkpoints are revisions of one Hugging Face hub repository
    (:meth:`revision` names the one holding a step): offline rules, the local cache, weight
    hashes and the fetch command shared by :class:`PythiaSuite` and :class:`CatalogueSuite`.

    With ``offline=True``, ``TANGENTLENS_OFFLINE=1`` or an unreachable hub only the local Hugging
    Face cache is used, without network retries.
    """

    offline: bool | None

    @abstractmethod
    def revision(self, step: int) -> str:
        """The hub revision (branch) holding ``step``."""

    def tokenizer_revision(self) -> str:
        """The revision the tokenizer is read from: the final checkpoint's."""
        return self.revision(self.steps[-1])

    def tokenizer(self) -> PreTrainedTokenizerBase:
        revision = self.tokenizer_revision()
        if offline_requested(self.offline):
            with hf_offline_mode():
                return AutoTokenizer.from_pretrained(self.name, revision=revision)
        return AutoTokenizer.from_pretrained(self.name, revision=revision)

    def cached_revision(self, revision: str) -> Path | None:
        """The snapshot of ``revision`` in the local Hugging Face cache (None when not cached)."""
        folder = cached_snapshot(self.name, revision)
        return None if folder is None else Path(folder)

    def cached_folder(self, step: int) -> Path | None:
        """The revision's snapshot in the local Hugging Face cache (None when not cached)."""
        self.check_step(step)
        return self.cached_revision(self.revision(step))

    def fetch_command(self, step: int) -> str:
        """The command that downloads the revision of ``step`` where the hub is reachable."""
        return f"hf download {self.name} --revision {self.revision(step)}"

    def missing_downloads(self, steps: Mapping[int, Sequence[str]]) -> list[Download]:
        """Offline, what a run loads that is not in the local cache: the revision of each of
        ``steps`` (step → what it is loaded for, e.g. ``["scored", "fit window"]``) and the
        tokenizer's (:meth:`tokenizer_revision`), each with its ``hf download`` command; online
        nothing (it is downloaded when loaded)."""
        if not offline_requested(self.offline):
            return []
        wanted: dict[str, list[str]] = {}
        for step, purposes in sorted(steps.items()):
            self.check_step(step)
            wanted.setdefault(self.revision(step), []).append(f"step {step}: {', '.join(purposes)}")
        wanted.setdefault(self.tokenizer_revision(), []).append("the tokenizer")
        return [
            Download(
                f"{self.name} revision {revision} ({'; '.join(uses)})",
                f"hf download {self.name} --revision {revision}",
            )
            for revision, uses in wanted.items()
            if self.cached_revision(revision) is None
        ]

    def check_available(self, steps: Sequence[int]) -> None:
        """Offline, every revision of ``steps`` must be in the local cache: the missing ones are
        named with how to fetch them, before a sweep spends hours on the others (a sweep checks
        everything it loads: :func:`tangentlens.sweep.downloads.check_downloads`)."""
        if not offline_requested(self.offline):
            return
        missing = [step for step in steps if self.cached_folder(step) is None]
        if missing:
            fetch = "; ".join(self.fetch_command(step) for step in missing)
            raise ValueError(
                f"{self.name} at step(s) {', '.join(map(str, missing))} is not in the local "
                f"Hugging Face cache ({hub_cache_dir()}) and the hub is offline; fetch it where "
                f"the hub is reachable ({fetch}) or run online"
            )

    def weights_hash(self, step: int) -> str | None:
        """Digest of the cached revision's weights, checked whole first, from the blob names the
        cache already holds (no re-hash); None when the revision is not cached."""
        folder = self.cached_folder(step)
        if folder is None:
            return None
        verify_weight_files(folder)
        return weights_hash(folder)


class PythiaSuite(HubSuite):
    """``EleutherAI/pythia-*`` at any of its 154 revisions (``step{N}``), through
    TransformerLens."""

    kind = "pythia"
    family: Family = "decoder"

    def __init__(self, model_name: str = "EleutherAI/pythia-160m", *, offline: bool | None = None):
        self.name = check_pythia_model(model_name)
        self.offline = offline

    @property
    def steps(self) -> tuple[int, ...]:
        return PYTHIA_STEPS

    def revision(self, step: int) -> str:
        return f"step{step}"

    def tokens_seen(self, step: int) -> int:
        self.check_step(step)
        return step * PYTHIA_TOKENS_PER_STEP

    def load(
        self,
        step: int,
        *,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        loader: str | None = None,
    ) -> HookedModel:
        from tangentlens.models.loading import load_pythia_checkpoint

        loader = self.loader(loader)
        self.check_step(step)
        return load_pythia_checkpoint(
            self.name, step, offline=self.offline, device=device, dtype=dtype, loader=loader
        )

    def tokenizer_revision(self) -> str:
        """``main``: TransformerLens reads Pythia's tokenizer and config there."""
        return "main"

    def published_config(self) -> dict[str, Any]:
        """The published ``config.json`` fields of this Pythia size
        (:data:`~tangentlens.models.shapes.PYTHIA_CONFIGS`)."""
        return pythia_config(self.name)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "tokens_per_step": PYTHIA_TOKENS_PER_STEP}


class CatalogueSuite(HubSuite):
    """A suite of the hub catalogue (:data:`~tangentlens.models.hub_suites.HUB_SUITES`: OLMo,
    SmolLM2, Gaperon, EuroBERT, ModernCamemBERT). Loading a step resolves its revision's snapshot
    (the local cache only when offline, else downloaded) and loads that folder through
    :func:`~tangentlens.models.loading.load_local_checkpoint` with the suite's loader."""

    kind = "hub"

    def __init__(self, name: str, *, offline: bool | None = None):
        self.entry: HubSuiteEntry = resolve_hub_suite(name)
        self.name = self.entry.hub_id
        self.family = self.entry.family  # type: ignore[assignment]
        self.offline = offline
        self.published_confirmed = self.entry.verified

    def published_config(self) -> dict[str, Any]:
        """The catalogue's config of the suite (confirmed when the entry is ``verified``)."""
        return self.entry.config

    @property
    def steps(self) -> tuple[int, ...]:
        return self.entry.steps

    def revision(self, step: int) -> str:
        return self.entry.revision(step)

    def tokens_seen(self, step: int) -> int | None:
        self.check_step(step)
        per_step = self.entry.tokens_per_step
        return step * per_step if per_step is not None else None

    def loader(self, loader: str | None = None) -> str:
        """``None`` / ``"auto"``: the catalogue's loader for this suite; else ``loader`` when it
        can load the suite's model type."""
        chosen = self.entry.loader if loader in (None, "auto") else loader
        return resolve_loader(chosen, self.family, self.entry.config.get("model_type"))

    def snapshot(self, step: int) -> Path:
        """The folder of the revision holding ``step``: the cached snapshot offline (a missing
        one is a ``ValueError`` with the fetch command), downloaded online."""
        self.check_step(step)
        if offline_requested(self.offline):
            folder = self.cached_folder(step)
            if folder is None:
                raise ValueError(
                    f"{self.name} at step {step} (revision {self.revision(step)!r}) is not in the "
                    f"local Hugging Face cache ({hub_cache_dir()}); download it where the hub is "
                    f"reachable (`{self.fetch_command(step)}`) or run without offline mode"
                )
            return folder
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(self.name, revision=self.revision(step)))

    def load(
        self,
        step: int,
        *,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        loader: str | None = None,
    ) -> HookedModel | HfLens:
        from tangentlens.models.loading import load_local_checkpoint

        loader = self.loader(loader)
        model = load_local_checkpoint(
            self.snapshot(step), device=device, dtype=dtype, loader=loader
        )
        model.cfg.model_name, model.cfg.checkpoint_value = self.model_name, step
        return model

    def describe(self) -> dict[str, Any]:
        entry = self.entry
        return {
            **super().describe(),
            "tokens_per_step": entry.tokens_per_step,
            "revisions": {str(step): name for step, name in entry.revisions},
            "verified": entry.verified,
            "source": entry.source,
        }


class LocalSuite(CheckpointSuite):
    """A folder with one Hugging Face-format subfolder per checkpoint (``step1000/`` or
    ``checkpoint-1000/``). No hub call of any kind.

    ``tokens_per_step`` comes from the argument, else from the folder's ``suite.json``, else the
    suite reports tokens seen as unknown.
    """

    kind = "local"

    def __init__(self, path: str | Path, *, tokens_per_step: int | None = None):
        self._folders = checkpoint_folders(path)
        self.root = Path(path).expanduser()
        self.name = str(self.root)
        self.metadata: dict[str, Any] = self._read_metadata(self.root)
        per_step = tokens_per_step or self.metadata.get("tokens_per_step")
        if per_step is not None and int(per_step) < 1:
            raise ValueError(f"tokens_per_step must be a positive integer, got {per_step}")
        self.tokens_per_step: int | None = int(per_step) if per_step is not None else None
        self.family = self._family()
        self.has_lm_head = checkpoint_headless(self._folders[self.steps[-1]]) is None
        self._hashes: dict[int, str] = {}

    @staticmethod
    def _read_metadata(root: Path) -> dict[str, Any]:
        meta = root / "suite.json"
        if not meta.exists():
            return {}
        try:
            return json.loads(meta.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"{meta} is not valid JSON: {error}") from error

    def _family(self) -> Family:
        return checkpoint_family(next(iter(self._folders.values())))  # type: ignore[return-value]

    @property
    def steps(self) -> tuple[int, ...]:
        return tuple(self._folders)

    def folder(self, step: int) -> Path:
        self.check_step(step)
        return self._folders[step]

    def tokens_seen(self, step: int) -> int | None:
        self.check_step(step)
        return step * self.tokens_per_step if self.tokens_per_step is not None else None

    def loader(self, loader: str | None = None) -> str:
        """``None`` / ``"auto"``: the loader the checkpoints' ``config.json`` model type needs
        (``"hf"`` for EuroBERT / ModernBERT, ``"bridge"`` for OLMo), else the family's
        default; else ``loader`` when it can load that model type."""
        model_type = checkpoint_model_type(self._folders[self.steps[-1]])
        return resolve_loader(loader, self.family, model_type)

    def load(
        self,
        step: int,
        *,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        loader: str | None = None,
    ) -> HookedModel | HfLens:
        """The checkpoint at ``step`` through ``loader`` (None / ``"auto"``: the one its
        ``config.json`` model type allows — ``"hf"`` for EuroBERT / ModernBERT, which load as an
        :class:`~tangentlens.models.hf_lens.HfLens` — else the family's default)."""
        from tangentlens.models.loading import load_local_checkpoint

        folder = self.folder(step)
        model = load_local_checkpoint(
            folder, device=device, dtype=dtype, loader=self.loader(loader)
        )
        # named and stepped as TransformerLens names a Pythia revision it loads
        model.cfg.model_name, model.cfg.checkpoint_value = self.model_name, step
        return model

    def tokenizer(self) -> PreTrainedTokenizerBase:
        return AutoTokenizer.from_pretrained(self.folder(self.steps[-1]), local_files_only=True)

    def cached_folder(self, step: int) -> Path:
        return self.folder(step)

    @property
    def model_name(self) -> str:
        """``suite.json``'s ``model_name`` when given, else the folder's name."""
        return str(self.metadata.get("model_name") or self.root.absolute().name)

    def weights_hash(self, step: int) -> str:
        if step not in self._hashes:
            folder = self.folder(step)
            verify_weight_files(folder)
            check_finite_files(folder, f"weights in {folder}")  # the bytes are read here anyway
            self._hashes[step] = weights_hash(folder)
        return self._hashes[step]

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "tokens_per_step": self.tokens_per_step}


class MiniSuite(LocalSuite):
    """A built-in suite the toolkit trains itself (``mini-pythia``, ``mini-bert``), cached in the
    user cache directory under a hash of its training config and corpus."""

    def __init__(self, path: Path, name: str, config: MiniSuiteConfig):
        super().__init__(path)
        self.kind = name if name in MINI_SUITE_CONFIGS else "mini"
        self.name = name
        self.config = config

    @property
    def model_name(self) -> str:
        return self.name

    def analysis_corpus(self) -> Corpus:
        """The held-out split of the training corpus: never trained on; the analysis default."""
        return heldout_corpus(self.config)

    def validation_loss(self) -> dict[int, float]:
        """Held-out loss per step over every scored token (next-token CE, or MLM CE)."""
        return {int(s): c["val_loss"] for s, c in self.metadata["checkpoints"].items()}

    def masked_validation_loss(self) -> dict[int, float]:
        """Encoders: held-out MLM loss per step at the ``[MASK]``-input positions only (the 10 %
        of scored positions that keep their token can be copied); empty for decoders."""
        return {
            int(s): c["val_loss_mask"]
            for s, c in self.metadata["checkpoints"].items()
            if "val_loss_mask" in c
        }

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "path": str(self.root),
            "config": self.config.to_dict(),
        }


def mini_suite_dir(name: str, config: MiniSuiteConfig, cache_dir: Path | None = None) -> Path:
    """Where the trained suite lives: ``<cache>/suites/<name>-<hash of config and corpus>``."""
    root = cache_dir if cache_dir is not None else cache_root() / "suites"
    return root / f"{name}-{config.cache_key(corpus_fingerprint(config))}"


def ensure_mini_suite(
    name: str = "mini-pythia",
    *,
    config: MiniSuiteConfig | None = None,
    cache_dir: Path | None = None,
    train: bool = True,
    progress: ProgressCallback | None = None,
) -> MiniSuite:
    """The mini suite ``name`` (or a custom ``config``), trained on first use and cached.

    Training writes into a temporary folder that is renamed into place only when complete, so an
    interrupted training leaves no half-written suite behind. It holds a lock
    (``.<suite folder>.training`` beside it, :mod:`tangentlens.locking`): a second process that
    needs the same suite meanwhile (two sweeps started together, a test run's workers) waits for
    it instead of training it again; a lock on another host that has not moved for
    :data:`TRAINING_STALE_S` seconds (its training touches it at every checkpoint) is an error
    naming it.
    """
    if config is None:
        if name not in MINI_SUITE_CONFIGS:
            raise ValueError(f"unknown mini suite {name!r}; allowed: {list(MINI_SUITE_CONFIGS)}")
        config = MINI_SUITE_CONFIGS[name]
    target = mini_suite_dir(name, config, cache_dir)
    if not (target / "suite.json").exists():
        if not train:
            raise ValueError(
                f"mini suite {name!r} is not trained yet (expected at {target}); run "
                f"`tangentlens train-suite {name}`"
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        lock = target.parent / f".{target.name}.training"
        if _wait_for_training(name, target, lock):
            try:
                if not (target / "suite.json").exists():  # (finished while the lock was taken)
                    _train_into(name, config, target, _touching(lock, progress))
            finally:
                release(lock)
    return MiniSuite(target, name, config)


#: A training lock on another host untouched for this long (seconds) is not waited for.
TRAINING_STALE_S = 900.0


def _wait_for_training(name: str, target: Path, lock: Path) -> bool:
    """Take the training ``lock`` of ``target`` (True), or wait while another process trains it
    until the suite is there (False)."""
    waiting = False
    while True:
        holder, _ = try_lock(lock)
        if holder is None:
            return True
        if (target / "suite.json").exists():
            return False
        if not waiting:
            logger.warning(
                "mini suite %s is being trained by pid %s on %s: waiting for it",
                name, holder["pid"], holder["host"],
            )  # fmt: skip
            waiting = True
        with contextlib.suppress(FileNotFoundError):
            if time.time() - lock.stat().st_mtime > TRAINING_STALE_S:
                raise ValueError(
                    f"mini suite {name!r} has been training on host {holder['host']} (pid "
                    f"{holder['pid']}) without a checkpoint for {TRAINING_STALE_S / 60:.0f} "
                    f"min; delete {lock} if that training is dead"
                )
        time.sleep(1.0)


def _touching(lock: Path, progress: ProgressCallback | None) -> ProgressCallback:
    """``progress``, and the training ``lock``'s time set to now at every checkpoint (a waiting
    process tells a live training from a dead one on another host by it)."""

    def report(event: TrainingEvent) -> None:
        if event.phase == "checkpoint":
            with contextlib.suppress(OSError):
                os.utime(lock)
        if progress is not None:
            progress(event)

    return report


def _train_into(
    name: str, config: MiniSuiteConfig, target: Path, progress: ProgressCallback
) -> None:
    """Train the suite into a temporary folder beside ``target``, renamed into place whole."""
    staging = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=target.parent))
    try:
        logger.info("training mini suite %s into %s", name, target)
        train_mini_suite(config, staging, name, progress)
        try:
            os.rename(staging, target)
        except OSError:  # another process finished the same suite first
            if not (target / "suite.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def open_suite(spec: str, *, offline: bool | None = None, train: bool = True) -> CheckpointSuite:
    """A suite from a short spec: ``"mini-pythia"``, ``"mini-bert"``, a Pythia model name
    (``"EleutherAI/pythia-160m"``, optionally prefixed ``"pythia:"``), a hub catalogue suite
    (``"allenai/OLMo-1B-hf"``, ``"olmo-1b"``, optionally prefixed ``"hub:"``), or a folder of
    checkpoints (optionally prefixed ``"local:"``); see
    :func:`~tangentlens.models.catalog.parse_suite_spec`.
    :func:`~tangentlens.models.catalog.suite_steps` gives the same suite's steps without opening
    it."""
    kind, target = parse_suite_spec(spec)
    if kind == "pythia":
        return PythiaSuite(target, offline=offline)
    if kind == "hub":
        return CatalogueSuite(target, offline=offline)
    if kind == "local":
        return LocalSuite(target)
    return ensure_mini_suite(target, train=train)
