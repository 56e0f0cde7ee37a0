"""The metric glossary table of the reference site (``docs/glossary.md``), generated: the core's
rows (:data:`CORE_METRICS`, the capture's and the proxy fit's) and every built-in probe's
declared metrics with their definitions (``Probe.metrics``), built-in probes by scope and name.
A probe's definition is written once, on the probe; ``python -m tangentlens.glossary`` (from the
repository's root; or ``python -m tangentlens.glossary PAGE``) rewrites the table between the
page's glossary markers, and a test fails while the page's table differs from the generated one.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tangentlens.registry import SCOPES, builtin_probes

__all__ = ["BEGIN", "CORE_METRICS", "END", "PAGE", "glossary_table", "write_glossary"]

#: The page the glossary table is written to by default (from the repository's root).
PAGE = "docs/glossary.md"
#: The marker before the generated table in the page.
BEGIN = "<!-- glossary: generated from each probe's metrics by `python -m tangentlens.glossary` -->"
#: The marker after it.
END = "<!-- glossary: end -->"

#: The metrics the core writes (not a probe's), with their definitions.
CORE_METRICS: dict[str, dict[str, str]] = {
    "capture": {
        "mean_loss": "the model's own loss per scored token (next-token CE; MLM for encoders)",
        "n_tokens": "positions kept for the statistics",
        "excluded_<reason>": (
            "positions excluded per reason (`bos`, `position0`, `padding`, `special`, "
            "`no_target`, …)"
        ),
        "duplicate_weights_of": (
            "only at a step whose weights are identical to another checkpoint's (selected or "
            "final; checked before any unit runs): that step"
        ),
    },
    "proxy_fit": {
        "explained_variance": (
            "share of this step's centred activation variance inside the scored proxy, "
            "`tr(QᵀCQ)/tr(C)` (under `frozen_early`: how much the frozen proxy still explains)"
        ),
        "pca_explained_variance": (
            "variance share of the top-`rank` principal directions on the fitted (centred) data"
        ),
        "seminmf_relative_error": "semi-NMF `‖H − ZD‖_F / ‖H‖_F` on the fitted sample",
        "seminmf_svd_bound": (
            "the truncated-SVD error at the same rank (a floor semi-NMF cannot beat)"
        ),
        "seminmf_converged": "1 if semi-NMF met its tolerance, else 0",
        "seminmf_restarts": (
            "how many times a fit whose directions collapsed (codes died: fewer than `rank` "
            "dimensions) was fitted again from the next seed (only such a fit has the row)"
        ),
        "sae_explained_variance": "SAE reconstruction: 1 − ‖H − Ĥ‖² / ‖H − mean‖²",
        "sae_l0": "mean number of active SAE latents per row",
        "mean_direction_overlap": (
            "`‖Qᵀm̂‖²`: how much of the mean direction m̂ the method's span held before m̂ was "
            "projected out of it"
        ),
        "mean_direction_rho": (
            "`ρ = ‖μ‖ / √tr Σ_H` of this step's activations (method `mean_direction`): the "
            "mean's size against the spread; m̂ errs by about `1/(ρ√n)` over n independent "
            "tokens, mostly along the directions a proxy spans (small at initialisation and "
            "after a LayerNorm: 0.15–0.5 on mini-pythia); the energies are read beyond the "
            "drift the gradients see, so that error does not enter them"
        ),
    },
}


def _row(probe: str, metric: str, definition: str) -> str:
    escaped = definition.replace("|", "\\|")
    return f"| `{probe}` | `{metric}` | {escaped} |"


def glossary_table() -> str:
    """The glossary table (markdown, no markers): the core's rows, then each built-in probe's."""
    probes = sorted(builtin_probes().values(), key=lambda p: (list(SCOPES).index(p.scope), p.name))
    lines = ["| probe | metric | definition |", "| --- | --- | --- |"]
    for probe, metrics in [*CORE_METRICS.items(), *((p.name, p.metrics) for p in probes)]:
        lines += [_row(probe, metric, definition) for metric, definition in metrics.items()]
    return "\n".join(lines) + "\n"


def write_glossary(path: str | Path) -> bool:
    """Rewrite the table between :data:`BEGIN` and :data:`END` in ``path``; whether it changed."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    head, found, rest = text.partition(BEGIN + "\n")
    if not found or END not in rest:
        raise ValueError(f"{path} has no glossary markers ({BEGIN!r} … {END!r})")
    new = head + BEGIN + "\n" + glossary_table() + END + rest.split(END, 1)[1]
    path.write_text(new, encoding="utf-8")
    return new != text


if __name__ == "__main__":
    write_glossary(sys.argv[1] if len(sys.argv) > 1 else PAGE)
