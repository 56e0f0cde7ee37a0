"""A Hugging Face hub cache holding large Pythia models at real width, built offline.

:func:`write_fake_pythia` lays out ``models--EleutherAI--pythia-<size>`` as huggingface_hub
writes it: ``refs/<revision>`` → commit, ``snapshots/<commit>/<file>`` → link to
``blobs/<sha256 of the file>`` (one blob for a file two revisions share). Each snapshot holds
the published ``config.json`` fields of :data:`tangentlens.models.shapes.PYTHIA_CONFIGS` (width,
heads, MLP, vocabulary: the real ones) with ``num_hidden_layers`` truncated, random weights saved
with ``save_pretrained(..., safe_serialization=True)`` at ``dtype`` (float16, as Pythia's
checkpoints are stored), and a small tokenizer: the real GPT-NeoX tokenizer is not available
offline, so the conftest's ``decoder_tokenizer()`` (a 320-token BPE) stands in for it — it fits
in the padded vocabulary, which is what loading checks.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, PreTrainedTokenizerBase
from transformers.initialization import no_init_weights

from tangentlens.models.shapes import PYTHIA_CONFIGS

__all__ = [
    "commit_of",
    "copy_repo",
    "randomise",
    "repo_dir",
    "share_blob",
    "truncated_config",
    "write_checkpoint_folder",
    "write_fake_pythia",
]

_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}


def repo_dir(hub: Path, model: str) -> Path:
    """The cache folder of ``model`` (``EleutherAI/pythia-1b`` → ``models--EleutherAI--…``)."""
    return Path(hub) / ("models--" + model.replace("/", "--"))


def commit_of(revision: str, model: str) -> str:
    """A stand-in commit hash for ``model``'s ``revision`` (40 hex digits, as the hub's)."""
    return hashlib.sha1(f"{model}@{revision}".encode()).hexdigest()


def truncated_config(model: str, layers: int, dtype: torch.dtype) -> dict:
    """The published config fields of ``model`` with ``layers`` blocks, stored at ``dtype``."""
    return {
        **PYTHIA_CONFIGS[model],
        "num_hidden_layers": layers,
        "torch_dtype": _DTYPE_NAMES[dtype],
        "initializer_range": 0.02,
        "use_cache": True,
    }


def _random_model(config: dict, dtype: torch.dtype, seed: int) -> GPTNeoXForCausalLM:
    """A GPT-NeoX model of ``config`` with every parameter random (weights and biases
    N(0, 0.02²), LayerNorm gains 1 + N(0, 0.02²)), built without the slow default init."""
    with no_init_weights():
        model = GPTNeoXForCausalLM._from_config(GPTNeoXConfig(**config), dtype=dtype)
    return randomise(model, seed, gains="layernorm")


def randomise(model: torch.nn.Module, seed: int, *, gains: str) -> torch.nn.Module:
    """Every parameter of ``model`` N(0, 0.02²), seeded; the weights whose name contains
    ``gains`` (the norms' gains) 1 + that. Returns the model in eval mode."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.normal_(0.0, 0.02, generator=generator)
            if gains in name and name.endswith("weight"):
                parameter.add_(1.0)
    return model.eval()


def write_checkpoint_folder(
    folder: Path,
    model: str,
    tokenizer: PreTrainedTokenizerBase,
    *,
    layers: int = 1,
    dtype: torch.dtype = torch.float16,
    seed: int = 0,
) -> Path:
    """A plain checkpoint folder (no cache layout) of ``model``'s truncated shape: random
    weights saved at ``dtype``, its ``config.json`` and the tokenizer."""
    config = truncated_config(model, layers, dtype)
    weights = _random_model(config, dtype, seed)
    weights.save_pretrained(folder, safe_serialization=True)
    del weights
    (Path(folder) / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer.save_pretrained(folder)
    return Path(folder)


def _store(repo: Path, snapshot: Path, file: Path) -> Path:
    """Move ``file`` into ``blobs/`` under the SHA-256 of its bytes and link it from
    ``snapshot`` (relative link, as huggingface_hub makes them); returns the blob."""
    digest = hashlib.sha256()
    with file.open("rb") as handle:
        while chunk := handle.read(8 << 20):
            digest.update(chunk)
    blob = repo / "blobs" / digest.hexdigest()
    if blob.exists():
        file.unlink()
    else:
        shutil.move(file, blob)
    link = snapshot / file.name
    link.symlink_to(Path("../..") / "blobs" / blob.name)
    return blob


def write_fake_pythia(
    hub: Path,
    model: str,
    revisions: dict[str, int],
    tokenizer: PreTrainedTokenizerBase,
    *,
    layers: int = 1,
    dtype: torch.dtype = torch.float16,
    main: str | None = None,
) -> Path:
    """Add ``model`` to the hub cache ``hub`` at ``revisions`` (revision → seed of its random
    weights; equal seeds give the same bytes, hence one shared blob) and point ``refs/main`` at
    ``main`` (default: the last revision, as Pythia's ``main`` is step143000). Returns the
    model's cache folder."""
    repo = repo_dir(hub, model)
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    for revision, seed in revisions.items():
        commit = commit_of(revision, model)
        snapshot = repo / "snapshots" / commit
        snapshot.mkdir(parents=True)
        with tempfile.TemporaryDirectory(dir=hub, prefix=".staging-") as staging:
            folder = write_checkpoint_folder(
                Path(staging), model, tokenizer, layers=layers, dtype=dtype, seed=seed
            )
            for file in sorted(folder.iterdir()):
                _store(repo, snapshot, file)
        (repo / "refs" / revision).write_text(commit)
    (repo / "refs" / "main").write_text(commit_of(main or list(revisions)[-1], model))
    return repo


def share_blob(hub: Path, model: str, source: str, target: str, file: str) -> None:
    """Make ``target``'s snapshot link ``file`` to the blob ``source``'s links to, as the cache
    does for a file two revisions share (the target's own blob stays, unreferenced)."""
    repo = repo_dir(hub, model)

    def snapshot(revision: str) -> Path:
        return repo / "snapshots" / (repo / "refs" / revision).read_text().strip()

    blob = os.readlink(snapshot(source) / file)
    link = snapshot(target) / file
    link.unlink()
    link.symlink_to(blob)


def copy_repo(hub: Path, source: str, target: str) -> Path:
    """Cache ``target`` as a copy of ``source``'s cache folder: the same refs and snapshot links,
    its blobs hard links to ``source``'s (no bytes copied)."""
    origin, repo = repo_dir(hub, source), repo_dir(hub, target)
    shutil.copytree(origin / "blobs", repo / "blobs", copy_function=os.link)
    shutil.copytree(origin / "snapshots", repo / "snapshots", symlinks=True)
    shutil.copytree(origin / "refs", repo / "refs")
    return repo
