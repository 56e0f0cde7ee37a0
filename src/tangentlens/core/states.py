"""Each probe's per-step state in a namespace of its own. A step unit saves
``{"step", "layers", "tokens_seen", "proxies", "states": {probe name: its state}}``; an across
probe's transitions give it its own state with those shared keys
(:data:`~tangentlens.contract.STATE_KEYS`), never another probe's. A step state written before
the namespaces (every probe's keys merged into the one dict) is read as it was written."""

from __future__ import annotations

import dataclasses
from typing import Any

from tangentlens.registry import STATE_KEYS, Transition

__all__ = ["own_view"]


def _view(saved: dict[str, Any], name: str) -> dict[str, Any]:
    if "states" not in saved:  # written before the namespaces: one dict for every probe
        return saved
    shared = {key: saved[key] for key in STATE_KEYS if key in saved}
    return {**shared, **saved["states"].get(name, {})}


def own_view(transition: Transition, name: str) -> Transition:
    """The transition as probe ``name`` reads it: each step's shared keys and its own state."""
    return dataclasses.replace(
        transition, before=_view(transition.before, name), now=_view(transition.now, name)
    )
