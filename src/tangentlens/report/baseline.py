"""The step-0 baseline, shown beside the later steps in the tables, findings and figures.

With random weights the headline metrics are not at their "nothing learned" values: the
architecture already shapes activations and gradients (a LayerNorm's Jacobian projects out the
mean and rescales by 1/σ, so gradients concentrate in the activations' top directions and a
proxy's ``energy_ratio`` reads above 1 at step 0; post-LN sites can read below 1). A change over
training is read against the step-0 value, not against 1 or 0, so the report labels step 0
``0 (init)`` (:func:`tangentlens.drawing.tables.step_label`) and says so in one line when a run
has no step 0.

>>> baseline_notice([{"step": 10}, {"step": 40}, {"step": -1}])
'no step-0 baseline in this run (first step 10): nothing is compared with initialisation'
>>> baseline_notice([{"step": 0}, {"step": 40}]) is None
True
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tangentlens.findings import INIT_STEP

__all__ = ["baseline_notice"]


def baseline_notice(rows: Iterable[dict[str, Any]]) -> str | None:
    """One line when the rows have checkpoint steps but not step 0; None otherwise.

    Model-free rows (at :data:`~tangentlens.contract.MODEL_FREE_STEP`) are not checkpoints."""
    steps = {r["step"] for r in rows if r["step"] is not None and r["step"] >= 0}
    if not steps or INIT_STEP in steps:
        return None
    return (
        f"no step-0 baseline in this run (first step {min(steps)}): "
        "nothing is compared with initialisation"
    )
