"""What a sweep loads from the Hugging Face hub, planned before any unit runs.

Offline (``suite.offline``, ``TANGENTLENS_OFFLINE`` / ``HF_HUB_OFFLINE``, or an unreachable
hub) everything a sweep will load must be in the local Hugging Face cache: the revision of every
checkpoint a unit loads (each scored step, each fit-window checkpoint, the step whose activations
choose a published SAE's latents), the revision its tokenizer is read from, and the files of each
published SAE. :func:`sweep_downloads` lists what is missing, :func:`check_downloads` refuses the
sweep in one line naming every missing item with its ``hf download`` command — in a shell file
when there are more than :data:`INLINE`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tangentlens.core.recipe import Recipe
from tangentlens.dictionaries.proxy_config import PRETRAINED_SAE
from tangentlens.models.hub import Download, cached_snapshot, hub_cache_dir, offline_requested
from tangentlens.paths import cache_root
from tangentlens.sweep.plan import Plan

__all__ = ["DOWNLOADS_DIR", "INLINE", "check_downloads", "sae_downloads", "sweep_downloads"]

#: At most this many missing downloads are named in the error line itself; more go to a file.
INLINE = 3
#: Where the file of download commands is written, under the tangentlens cache.
DOWNLOADS_DIR = "downloads"
#: What each kind of unit loads a checkpoint for.
_PURPOSES = {"step": "scored", "window": "fit window", "pretrained": "chooses the SAE latents"}


def sweep_downloads(recipe: Recipe, plan: Plan, suite: Any) -> list[Download]:
    """Offline, what ``plan``'s units will load that is not in the local Hugging Face cache
    (``suite``: the opened suite; a hub suite's revisions and tokenizer, any suite's published
    SAEs); online, nothing."""
    steps: dict[int, list[str]] = {}
    for unit in plan.units:
        if unit.model and unit.step is not None:
            steps.setdefault(unit.step, []).append(_PURPOSES[unit.kind])
    missing = suite.missing_downloads(steps) if hasattr(suite, "missing_downloads") else []
    return missing + sae_downloads(recipe)


def sae_downloads(recipe: Recipe) -> list[Download]:
    """Offline, the published SAEs of ``[proxies.pretrained_sae]`` whose files are
    not in the local Hugging Face cache (SAELens reads each from a folder of its release's
    repository)."""
    spec = getattr(recipe.proxies, PRETRAINED_SAE, None)
    if spec is None or not offline_requested(recipe.suite.offline or None):
        return []
    from tangentlens.dictionaries import pretrained_location

    missing = []
    for sae_id in spec.ids:
        repo, folder = pretrained_location(spec.release, sae_id)
        snapshot = cached_snapshot(repo)
        if snapshot is None or not any((Path(snapshot) / folder).glob("*")):
            missing.append(
                Download(
                    f"SAE {sae_id!r} of release {spec.release!r} ({repo}, folder {folder})",
                    f"hf download {repo} --include '{folder}/*'",
                )
            )
    return missing


def check_downloads(missing: list[Download], recipe: Recipe) -> None:
    """Refuse, in one line, a sweep that would load what is ``missing``: each item with its
    command, or (more than :data:`INLINE`) the first and the file holding every command."""
    if not missing:
        return
    where = f"the local Hugging Face cache ({hub_cache_dir()}) and the hub is offline"
    if len(missing) <= INLINE:
        listed = "; ".join(f"{d.what}: `{d.command}`" for d in missing)
        raise ValueError(
            f"{len(missing)} download(s) this sweep needs are not in {where}: {listed}; fetch "
            "them where the hub is reachable or run online"
        )
    path = _write_commands(missing, recipe)
    first = missing[0]
    raise ValueError(
        f"{len(missing)} downloads this sweep needs are not in {where}, e.g. {first.what}: "
        f"`{first.command}`; every command is in {path} (run it where the hub is reachable, "
        "then copy the cache here) — or run online"
    )


def _write_commands(missing: list[Download], recipe: Recipe) -> Path:
    """A shell file of ``missing``'s commands, each after a comment saying what it fetches."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "--", f"{recipe.name}-{recipe.suite.name}").strip("-")
    path = cache_root() / DOWNLOADS_DIR / f"{name}.sh"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        "#!/bin/sh",
        f"# what `tangentlens sweep --recipe {recipe.name}` loads that the Hugging Face cache "
        "lacked; run where the hub is reachable",
    ]
    for download in missing:
        lines += [f"# {download.what}", download.command]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
