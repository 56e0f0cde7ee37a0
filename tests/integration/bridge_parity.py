"""The tolerances within which a table measured through TransformerLens' ``TransformerBridge``
equals the one measured through ``HookedTransformer`` / ``HookedEncoder`` (same checkpoint, tokens
and settings), and the row-by-row comparison the parity tests make.

Why the tables differ at all: the two loaders run the same float32 weights through different
code — the bridge runs the Hugging Face modules (eager attention, forced by the bridge; torch's
LayerNorm; the fused QKV projection split per head), the hooked path TransformerLens' einsums —
so activations and gradients differ by float32 rounding in another order: measured ≤ 1e-6
relative at every site (``test_bridge.py``). Every statistic is accumulated in float64, so rows
computed in closed form from the moments carry that difference on, amplified at most by their
conditioning. Rows that pass through an iterative fit amplify it more: semi-NMF stops on a
relative-change criterion, so a 1e-7 change of its input moves where it stops and its basis by
~1e-4; nearest-neighbour and rank statistics move when near-ties swap.

Classes (``|a − b| ≤ atol + rtol·|a|``), with the worst row of each measured on micro-pythia and
micro-bert (every per-step probe, the embedding and four site kinds at both blocks, ~2870 rows):

* ``exact`` — counts (kept tokens, excluded positions) and every row's ``n_tokens``: equal
  (measured: equal);
* ``moments`` — every row computed in closed form from the float64 moments (moments, PCA and
  mean-direction proxies with their controls and z-scores, attention, drift, IsoScore, cosine
  anisotropy): ``1e-5 + 1e-5·|a|`` (measured ≤ 5.1e-6 abs on an energy ratio of 6.9, ≤ 1e-6
  abs on z-scores);
* ``neighbours`` — nearest-neighbour and rank statistics (TwoNN, frequency_geometry's curvature
  visibility and Spearman statistics): ``1e-4 + 1e-3·|a|`` (measured ≤ 2.5e-3 abs on a TwoNN
  dimension of 7.2, 8.6e-4 rel on a curvature visibility of 0.07);
* ``fit`` — a semi-NMF fit's quality, ``seminmf_relative_error``: ``2e-3·|a|`` (measured
  ≤ 1.1e-3 rel, micro-bert's block-0 mlp_out, 2026-11-27);
* ``iterative`` — every other row that reads a semi-NMF basis (``method`` naming ``seminmf``:
  its energies, z-scores, p-values, explained variance and m̂ overlap, stability angles): **not
  compared**. Semi-NMF is non-convex and stops in a flat valley, so a 1e-7 change of its input
  ends the fit at another nearby optimum of equal quality — a property of the fit's path, not
  of the loader: 0.19° apart on a 60° angle at first, then on fresh environments 60.83° against
  59.82° (2026-11-26) and 63.83° against 61.76° with z-scores 0.71 against 0.80 (2026-11-27),
  each time at micro-bert's block-0 mlp_out with both fits converged. The fits' inputs are
  what the loaders must agree on, and the moment rows check them; the fit's own determinism
  and its torch/numpy agreement are tested in tests/unit/test_dictionaries.py;
* ``p_value`` — a control may cross the observed statistic: 0.05 (one control of 20; measured
  equal);
* ``flag`` — ``seminmf_converged`` (0/1): a fit that stops at its iteration cap on one side can
  stop just inside its tolerance on the other (measured: 1 flip in 18 fits); not compared.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

TOLERANCES: dict[str, tuple[float, float]] = {
    "exact": (0.0, 0.0),
    "moments": (1e-5, 1e-5),
    "neighbours": (1e-4, 1e-3),
    "fit": (0.0, 2e-3),
    "iterative": (math.inf, 0.0),  # not compared: see the module docstring
    "p_value": (0.05, 0.0),
    "flag": (1.0, 0.0),
}
_NEIGHBOURS = ("twonn_dimension", "freq_distance_spearman", "curvature_visibility")
#: The fields every row carries besides its key: compared with the row's tolerance.
VALUES = ("value", "ci_low", "ci_high")


def tolerance_class(row: Mapping[str, Any]) -> str:
    """The tolerance class of a result row (see the module docstring)."""
    metric, method = row["metric"], row["method"] or ""
    if metric.startswith("excluded_") or metric == "n_tokens":
        return "exact"
    if metric == "seminmf_converged":
        return "flag"
    if metric == "seminmf_relative_error":
        return "fit"
    if "seminmf" in method:
        return "iterative"
    if metric.endswith("p_value"):
        return "p_value"
    if metric.startswith(_NEIGHBOURS):
        return "neighbours"
    return "moments"


def within(a: Any, b: Any, row: Mapping[str, Any]) -> bool:
    """Whether values ``a`` (hooked) and ``b`` (bridge) of ``row`` agree within its class."""
    if a is None or b is None:
        return a is None and b is None
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    atol, rtol = TOLERANCES[tolerance_class(row)]
    return abs(a - b) <= atol + rtol * abs(a)


def keyed(
    rows: Iterable[Mapping[str, Any]], site_key: Callable[[str], Any]
) -> dict[tuple, Mapping[str, Any]]:
    """Rows by ``(site_key(site), probe, method, rank, freq_bin, metric, step)``; a key that
    occurs twice is an error. ``site_key`` maps a loader's hook name to what both loaders share
    (the site kind and block)."""
    out: dict[tuple, Mapping[str, Any]] = {}
    for r in rows:
        key = (
            site_key(r["site"]),
            r["probe"],
            r["method"],
            r["rank"],
            r["freq_bin"],
            r["metric"],
            r["step"],
        )
        if key in out:
            raise AssertionError(f"two rows share the key {key}")
        out[key] = r
    return out


def mismatches(
    hooked: Mapping[tuple, Mapping[str, Any]], bridge: Mapping[tuple, Mapping[str, Any]]
) -> list[tuple]:
    """The keys of rows whose labels (``suite``, ``tokens_seen``, ``layer``, ``n_tokens``) differ
    or whose values fall outside their class's tolerance; the row sets must be identical."""
    assert hooked.keys() == bridge.keys(), set(hooked) ^ set(bridge)
    bad = []
    for key, a in hooked.items():
        b = bridge[key]
        labels = all(a[f] == b[f] for f in ("suite", "tokens_seen", "layer", "n_tokens"))
        if not labels or not all(within(a[f], b[f], a) for f in VALUES):
            bad.append(key)
    return bad
