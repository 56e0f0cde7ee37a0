"""Where tangentlens keeps its caches (trained mini suites, tokenizers)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The user cache directory: ``$TANGENTLENS_CACHE``, else ``$XDG_CACHE_HOME/tangentlens``,
    else ``~/.cache/tangentlens``."""
    explicit = os.environ.get("TANGENTLENS_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "tangentlens"
