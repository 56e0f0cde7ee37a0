"""The estimator notes a run's manifest records (``estimators``): how its metrics are computed —
the core's own choices (:data:`ESTIMATORS`) and what each probe declares
(:class:`~tangentlens.reporting.Estimator`). ``tangentlens compare`` refuses the rows a note
covers when two runs' notes differ. Light: no torch.
"""

from __future__ import annotations

from tangentlens.core.recipe import Recipe
from tangentlens.registry import builtin_probes

__all__ = ["ESTIMATORS", "estimator_notes"]

#: The core's estimator choices behind the metrics, recorded in every run's manifest beside
#: each probe's own.
ESTIMATORS: dict[str, str] = {
    "fit_window": "frozen_early: the suite's checkpoints with step ≤ early_fraction × final step, "
    "at most window_checkpoints, evenly spaced in step",
    "controls": "exchangeable (headline metrics): Haar k-frames in span(m̂)⊥, m̂ the mean "
    "direction projected out of the proxy (ℝ^d for mean_direction itself), p calibrated under a "
    "proxy uniform in span(m̂)⊥; complement (*_complement_*): Haar k-frames in span(T, m̂)⊥; "
    "Gaussian d × k draws projected onto the allowed subspace, so frames depend on spans only",
    "proxies": "every method fitted on activations centred per checkpoint (window checkpoints "
    "centred before pooling), with the mean direction m̂ projected out; mean_direction = m̂ as a "
    "rank-1 proxy, following the fit policy (pooled window mean or the step's mean); held_out: "
    "fitted on the first half of a step's sequences, energies scored on the second",
    "pretrained_sae": "published SAEs (SAELens registry): the rank latents most often active "
    "(code > 0; ties: larger mean activation) on the raw sampled rows of one step (select_step, "
    "default the first selected; held_out: its fitting half), chosen once; the proxy is the "
    "orthonormalised span of their decoder rows, m̂ projected out as for every method",
    "positions": "one kept-position set for every statistic and the token frequencies; masked-LM: "
    "every non-special original position ([MASK] inputs included), binned by the original token, "
    "gradients at every kept row; analysis text tokenised and packed as in training",
}


def estimator_notes(recipe: Recipe) -> dict[str, str]:
    """The notes of a run of ``recipe``: the core's, every built-in probe's fixed notes, and the
    notes of the recipe's probes for their configs (a note that is a function of the config is
    recorded only for a probe the recipe runs; one that gives None is not recorded)."""
    notes = dict(ESTIMATORS)
    for probe in builtin_probes().values():
        notes.update({e.key: e.text for e in probe.reporting.estimators if isinstance(e.text, str)})
    for entry in recipe.probes.values():
        for estimator in entry.probe.reporting.estimators:
            note = estimator.note(entry.config, recipe)
            if note is not None:
                notes[estimator.key] = note
    return notes
