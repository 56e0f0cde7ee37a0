"""The update s → s′ is scored in the proxy of s, never in the proxy of s′ (which was fitted after
the update and contains its directions: the circular update alignment).

Planted: a random orthonormal frame R of R⁶; the proxy of s spans R's first two columns, the proxy
of s′ the next two. The updates are C Rᵀ with known coefficients C, so the energy fraction of an
update in either proxy is a closed form: ‖C[:, cols]‖²_F / ‖C‖²_F. The energy fraction depends
only on the proxy and the update (not on the control frames), so these values are exact.
"""

import numpy as np
import pytest
import torch

from tangentlens.core.recipe import CaptureSpec, ProxiesSpec, Recipe
from tangentlens.dictionaries import in_window
from tangentlens.probes.subspace_stability import SubspaceStabilityConfig
from tangentlens.probes.tangent_energy import TangentEnergyConfig
from tangentlens.probes.update_alignment import UpdateAlignmentConfig
from tangentlens.registry import AcrossInputs, Transition
from tangentlens.results import StepLabel

EMBED, SITE = "hook_embed", "blocks.0.hook_resid_post"
D = 6
# coefficients of the updates in the frame R: mostly along the proxy of s (columns 0, 1), a
# little along the proxy of s′ (columns 2, 3), some outside both (columns 4, 5)
CENTROID_C = {  # per tracked type id
    5: [3.0, 1.0, 0.5, 0.0, 1.0, 0.0],
    9: [0.0, 2.0, 0.0, 1.0, 0.0, 0.5],
}
EMBED_C = np.array(
    [
        [1.0, 2.0, 0.0, 0.5, 0.0, 0.0],
        [0.0, 1.0, 1.0, 0.0, 1.0, 0.0],
        [2.0, 0.0, 0.0, 0.0, 0.0, 1.0],
    ]
)


def _frame() -> torch.Tensor:
    gen = torch.Generator().manual_seed(11)
    return torch.linalg.qr(torch.randn(D, D, generator=gen, dtype=torch.float64))[0]


def _fraction(C: np.ndarray, cols: slice) -> float:
    """Closed form: the update C Rᵀ's energy in span(R[:, cols]) over its total energy."""
    C = np.asarray(C, dtype=np.float64)
    return float((C[:, cols] ** 2).sum() / (C**2).sum())


def _states() -> tuple[dict, dict]:
    R = _frame()
    old_proxy, new_proxy = R[:, 0:2].contiguous(), R[:, 2:4].contiguous()
    gen = torch.Generator().manual_seed(12)
    old_centroids = torch.randn(3, D, generator=gen, dtype=torch.float64)  # types 5, 7, 9
    moved = {5: 0, 9: 2}
    new_ids = torch.tensor([9, 5, 11])  # another order, type 7 gone, type 11 new
    new_centroids = torch.randn(3, D, generator=gen, dtype=torch.float64)
    for row, type_id in enumerate(new_ids.tolist()):
        if type_id in moved:
            shift = torch.tensor(CENTROID_C[type_id], dtype=torch.float64) @ R.T
            new_centroids[row] = old_centroids[moved[type_id]] + shift
    old_embedding = torch.randn(3, D, generator=gen, dtype=torch.float64)
    new_embedding = old_embedding + torch.from_numpy(EMBED_C) @ R.T
    layers = {EMBED: None, SITE: 0}
    proxies = {"old": {EMBED: {"pca": old_proxy}, SITE: {"pca": old_proxy}}}
    proxies["new"] = {EMBED: {"pca": new_proxy}, SITE: {"pca": new_proxy}}
    before = {
        "step": 10,
        "tokens_seen": 100,
        "layers": layers,
        "proxies": proxies["old"],
        "centroids": {SITE: (torch.tensor([5, 7, 9]), old_centroids)},
        "embedding": old_embedding,
        "embed_site": EMBED,
    }
    now = {
        "step": 20,
        "tokens_seen": 200,
        "layers": layers,
        "proxies": proxies["new"],
        "centroids": {SITE: (new_ids, new_centroids)},
        "embedding": new_embedding,
        "embed_site": EMBED,
    }
    return before, now


def _transition_rows(recipe, before, now, frozen, window):
    """The across rows of the recipe's probes over the one transition ``before`` → ``now``, as
    the sweep's across-steps unit builds it."""
    label = StepLabel(recipe.suite.name, now["step"], now["tokens_seen"], now["layers"])
    transition = Transition(label, before, now, frozen, in_window(before["step"], window))
    inputs = AcrossInputs([], (transition,))
    rows = []
    for entry in recipe.probes.values():
        if entry.probe.across is not None:
            rows += entry.probe.across(inputs, entry.config)
    return rows


def test_update_s_to_s_prime_is_scored_in_the_proxy_of_s_not_of_s_prime():
    recipe = Recipe(
        name="transition",
        capture=CaptureSpec(embed=True),
        proxies=ProxiesSpec(methods=("pca",), rank=2),
        probes={
            "tangent_energy": TangentEnergyConfig(),
            "update_alignment": UpdateAlignmentConfig(draws=19),
        },
    )
    before, now = _states()
    rows = _transition_rows(recipe, before, now, None, ())
    got = {
        (r["site"], r["metric"]): r
        for r in rows
        if r["probe"] == "update_alignment" and r["metric"].endswith("_energy_fraction")
    }
    centroid = np.array([CENTROID_C[5], CENTROID_C[9]])
    # right: the proxy of s (R's columns 0, 1); the circular version reads columns 2, 3
    want = {
        (SITE, "centroid_update_energy_fraction"): _fraction(centroid, slice(0, 2)),
        (EMBED, "embedding_update_energy_fraction"): _fraction(EMBED_C, slice(0, 2)),
    }
    circular = {
        (SITE, "centroid_update_energy_fraction"): _fraction(centroid, slice(2, 4)),
        (EMBED, "embedding_update_energy_fraction"): _fraction(EMBED_C, slice(2, 4)),
    }
    # by hand: centroid (9 + 1 + 4) / (11.25 + 5.25), embedding (5 + 1 + 4) / (5.25 + 3 + 5)
    assert list(want.values()) == pytest.approx([28 / 33, 40 / 53], rel=1e-12)
    assert list(circular.values()) == pytest.approx([1.25 / 16.5, 1.25 / 13.25], rel=1e-12)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert abs(value - circular[key]) > 0.2  # the planted data tells the two apart
        assert got[key]["value"] == pytest.approx(value, rel=1e-12), (key, circular[key])
        assert got[key]["step"] == 20 and got[key]["method"] == "pca" and got[key]["rank"] == 2
    assert got[(SITE, "centroid_update_energy_fraction")]["n_tokens"] == 2  # types 5 and 9


@pytest.mark.parametrize(
    ("s", "s_prime", "marked"),
    [(10, 20, True), (200, 400, True), (299, 300, True), (300, 400, False), (400, 500, False)],
)
def test_a_transition_is_in_window_when_the_frozen_fit_saw_data_after_its_start(s, s_prime, marked):
    """Frozen proxies fitted on checkpoints (0, 100, 200, 300): s → s′ is scored under the
    ``*_in_window_*`` names when s < 300 — 200 → 400 straddles the window's end, and the fit saw
    step 300 — and as the headline from s = 300 on (the fit saw nothing after it)."""
    recipe = Recipe(
        name="transition",
        capture=CaptureSpec(embed=True),
        proxies=ProxiesSpec(methods=("pca",), rank=2, fit_policy="frozen_early"),
        probes={
            "tangent_energy": TangentEnergyConfig(),
            "update_alignment": UpdateAlignmentConfig(draws=19),
            "subspace_stability": SubspaceStabilityConfig(),
        },
    )
    before, now = _states()
    before["step"], now["step"] = s, s_prime
    # the frozen proxies span R's last two columns: neither step's own refit
    R = _frame()
    frozen = {EMBED: {"pca": R[:, 4:6].contiguous()}, SITE: {"pca": R[:, 4:6].contiguous()}}
    rows = _transition_rows(recipe, before, now, frozen, (0, 100, 200, 300))
    metrics = {r["metric"] for r in rows if r["probe"] == "update_alignment"}
    inside = {m for m in metrics if "_in_window_" in m}
    assert bool(inside) == marked and (inside == metrics) == marked
    fraction = "centroid_update{}_energy_fraction".format("_in_window" if marked else "")
    value = next(r["value"] for r in rows if r["metric"] == fraction and r["site"] == SITE)
    centroid = np.array([CENTROID_C[5], CENTROID_C[9]])
    assert value == pytest.approx(_fraction(centroid, slice(4, 6)), rel=1e-12)
    # the refits of s and s′ (R's columns 0, 1 and 2, 3) are orthogonal: 90° between them
    stability = [r for r in rows if r["probe"] == "subspace_stability"]
    angles = [r for r in stability if not r["metric"].endswith("_random")]
    assert {(r["site"], r["method"]) for r in angles} == {(EMBED, "pca@prev"), (SITE, "pca@prev")}
    assert all(r["value"] == pytest.approx(90.0) and r["step"] == s_prime for r in angles)
    assert {r["metric"] for r in angles} == {"principal_angle_mean", "principal_angle_max"}
    # each beside its random-subspace baseline (same site, method, rank)
    assert len(stability) == 2 * len(angles)
