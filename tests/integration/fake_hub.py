"""A Hugging Face hub cache holding any suite of the hub catalogue
(:data:`~tangentlens.models.hub_suites.HUB_SUITES`) at its published width, built offline with
random weights from transformers' own config classes.

:func:`write_fake_hub` lays each revision out as :mod:`fake_pythia_hub` does (refs → snapshots →
links into ``blobs/``): the entry's published ``config.json`` fields with ``num_hidden_layers``
truncated, weights N(0, 0.02²) saved in float16, and a small tokenizer (the real ones are not
available offline) that fits the vocabulary.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM
from transformers.initialization import no_init_weights

from tangentlens.models.hub_suites import HUB_SUITES
from tests.integration.conftest import decoder_tokenizer, encoder_tokenizer
from tests.integration.fake_pythia_hub import _store, commit_of, randomise, repo_dir

__all__ = ["publish_folders", "write_fake_hub"]


def _random_model(config: dict, family: str, seed: int) -> torch.nn.Module:
    """The model ``config`` describes, every parameter N(0, 0.02²) (norm gains 1 + that)."""
    fields = {k: v for k, v in config.items() if k not in ("architectures", "model_type")}
    hf_config = AutoConfig.for_model(config["model_type"], **fields)
    auto = AutoModelForCausalLM if family == "decoder" else AutoModelForMaskedLM
    with no_init_weights():
        model = auto.from_config(hf_config, dtype=torch.float16)
    return randomise(model, seed, gains="norm")


def write_fake_hub(
    hub: Path,
    hub_id: str,
    steps: dict[int, int],
    *,
    layers: int = 1,
    vocab: int | None = None,
    **fields: object,
) -> Path:
    """Add catalogue suite ``hub_id`` to the hub cache ``hub`` at ``steps`` (step → seed of its
    random weights) under the entry's revision names, ``refs/main`` at the last one. ``vocab``:
    a vocabulary smaller than the published one (None: the published, where the published
    embedding alone would take gigabytes); ``fields``: other ``config.json`` fields that differ
    from the catalogue's (a narrower model). Returns the repository's cache folder."""
    entry = HUB_SUITES[hub_id]
    config = {**entry.config, "num_hidden_layers": layers, **fields}
    tokenizer = decoder_tokenizer() if entry.family == "decoder" else encoder_tokenizer()
    if vocab is not None:  # the special tokens (the padding row among them) are the tokenizer's
        config["vocab_size"] = vocab
        for name in ("pad", "bos", "eos", "cls", "sep", "mask"):
            config[f"{name}_token_id"] = getattr(tokenizer, f"{name}_token_id", None)
    repo = repo_dir(hub, hub_id)
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    for step, seed in steps.items():
        revision = entry.revision(step)
        commit = commit_of(revision, hub_id)
        snapshot = repo / "snapshots" / commit
        snapshot.mkdir(parents=True)
        with tempfile.TemporaryDirectory(dir=hub, prefix=".staging-") as staging:
            folder = Path(staging)
            model = _random_model(config, entry.family, seed)
            model.save_pretrained(folder, safe_serialization=True)
            del model
            (folder / "config.json").write_text(
                json.dumps({**config, "torch_dtype": "float16"}, indent=2)
            )
            tokenizer.save_pretrained(folder)
            for file in sorted(folder.iterdir()):
                _store(repo, snapshot, file)
        (repo / "refs" / revision).write_text(commit)
    (repo / "refs" / "main").write_text(commit_of(entry.revision(max(steps)), hub_id))
    return repo


def publish_folders(hub: Path, hub_id: str, revisions: dict[str, Path]) -> Path:
    """Add ``hub_id`` to the hub cache ``hub`` with the files of each checkpoint folder as its
    revision (revision → folder), ``refs/main`` at the last one. Returns the repository's cache
    folder."""
    repo = repo_dir(hub, hub_id)
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    for revision, folder in revisions.items():
        commit = commit_of(revision, hub_id)
        snapshot = repo / "snapshots" / commit
        snapshot.mkdir(parents=True)
        with tempfile.TemporaryDirectory(dir=hub, prefix=".staging-") as staging:
            for file in sorted(Path(folder).iterdir()):
                copy = Path(staging) / file.name
                shutil.copyfile(file, copy)
                _store(repo, snapshot, copy)
        (repo / "refs" / revision).write_text(commit)
    (repo / "refs" / "main").write_text(commit_of(list(revisions)[-1], hub_id))
    return repo
