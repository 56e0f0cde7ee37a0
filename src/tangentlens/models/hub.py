"""Offline-first access to the Hugging Face Hub.

Users with internet load Pythia revisions from the hub; without it (``offline=True``,
``TANGENTLENS_OFFLINE=1``, ``HF_HUB_OFFLINE=1``, or a hub that does not answer within a second)
only the local cache is read, and no time is lost on network retries — a hub call that cannot
connect otherwise retries for minutes before failing.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass

logger = logging.getLogger(__name__)

HUB_HOST = "huggingface.co"
PROBE_TIMEOUT_S = 1.5
_TRUE = {"1", "true", "yes", "on"}


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


@functools.cache
def hub_reachable(host: str = HUB_HOST, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the hub opens within ``timeout`` seconds (asked once per
    process). Name resolution has no timeout of its own, so the probe runs in a daemon thread."""
    answer: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((host, 443), timeout=timeout):
                answer.append(True)
        except OSError:
            answer.append(False)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    reachable = bool(answer and answer[0])
    if not reachable:
        logger.info("%s is not reachable: using the local Hugging Face cache only", host)
    return reachable


def offline_requested(offline: bool | None = None) -> bool:
    """Resolve the offline setting: an explicit ``offline`` wins; ``None`` means offline when
    ``TANGENTLENS_OFFLINE`` or ``HF_HUB_OFFLINE`` is set, or when the hub does not answer."""
    if offline is not None:
        return bool(offline)
    if _env_flag("TANGENTLENS_OFFLINE") or _env_flag("HF_HUB_OFFLINE"):
        return True
    return not hub_reachable()


@contextlib.contextmanager
def hf_offline_mode() -> Iterator[None]:
    """Within the block, huggingface_hub and transformers read only the local cache.

    ``HF_HUB_OFFLINE`` is read once at import time, so setting the variable is not enough after
    ``huggingface_hub`` was imported: the module constant is switched too, and both are restored
    on exit.
    """
    from huggingface_hub import constants

    saved_env = os.environ.get("HF_HUB_OFFLINE")
    saved_constant = constants.HF_HUB_OFFLINE
    os.environ["HF_HUB_OFFLINE"] = "1"
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = saved_constant
        if saved_env is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = saved_env


def hub_cache_dir() -> str:
    """The Hugging Face hub cache folder that huggingface_hub reads (fixed when it is imported
    from ``HF_HUB_CACHE`` / ``HF_HOME``)."""
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


@dataclass(frozen=True)
class Download:
    """Something a run loads that is not in the local Hugging Face cache: ``what`` it is (and
    what for), and the ``command`` that downloads it where the hub is reachable."""

    what: str
    command: str


def cached_snapshot(repo_id: str, revision: str = "main") -> str | None:
    """The folder of ``repo_id``'s ``revision`` in the local Hugging Face cache (None when it
    is not cached); nothing is downloaded."""
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo_id, revision=revision, local_files_only=True)
    except Exception:  # not cached
        return None
