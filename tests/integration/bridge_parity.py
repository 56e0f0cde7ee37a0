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
* ``iterative`` — rows of a semi-NMF proxy (``method`` naming ``seminmf``, stability angles in
  degrees included): ``1e-3 + 3e-2·|a|`` (measured ≤ 0.19° on a 60° angle, 2.1e-3 rel, until a
  fresh environment on 2026-11-26 gave 60.83° against 59.82°, 1.7e-2 rel, on micro-bert's
  block-0 mlp_out: both fits met their tolerance, at relative errors 0.60878 and 0.60846 — two
  nearby local optima of a non-convex fit, not a loader difference); their
  z-scores (``iterative_z``), which divide that by the controls' spread: ``5e-2 + 1e-2·|a|``
  (measured ≤ 9e-3 abs);
* ``p_value`` — a control may cross the observed statistic: 0.05 (one control of 20; measured
  equal), ``iterative_p_value`` 0.1 (measured 0.048 = one control of 21);
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
    "iterative": (1e-3, 3e-2),
    "iterative_z": (5e-2, 1e-2),
    "p_value": (0.05, 0.0),
    "iterative_p_value": (0.1, 0.0),
    "flag": (1.0, 0.0),
}
_NEIGHBOURS = ("twonn_dimension", "freq_distance_spearman", "curvature_visibility")
#: The fields every row carries besides its key: compared with the row's tolerance.
VALUES = ("value", "ci_low", "ci_high")


def tolerance_class(row: Mapping[str, Any]) -> str:
    """The tolerance class of a result row (see the module docstring)."""
    metric, method = row["metric"], row["method"] or ""
    iterative = "seminmf" in method
    if metric.startswith("excluded_") or metric == "n_tokens":
        return "exact"
    if metric == "seminmf_converged":
        return "flag"
    if metric.endswith("p_value"):
        return "iterative_p_value" if iterative else "p_value"
    if iterative:
        return "iterative_z" if metric.endswith("_z") else "iterative"
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
