"""Classic-geometry probes on statistics captured from the micro suite, checked against the
metrics applied directly to the captured numbers."""

import pytest
import torch

from tangentlens.metrics import (
    centred_anisotropy_from_moments,
    cosine_anisotropy_from_sums,
    qk_drift_from_means,
)
from tangentlens.probes import cosine_drift, frequency_geometry, qk_drift, shape_of_learning
from tangentlens.results import ROW_FIELDS


def _by_key(rows):
    assert all(tuple(r) == ROW_FIELDS for r in rows)
    return {(r["site"], r["method"], r["freq_bin"], r["metric"]): r for r in rows}


def test_cosine_drift(micro_step_data):
    table = _by_key(cosine_drift.rows(micro_step_data, cosine_drift.CosineDriftConfig()))
    site = "blocks.1.hook_resid_post"
    h = micro_step_data.statistics.sites[site].h
    row = table[(site, "-", "all", "cosine_anisotropy")]
    assert row["value"] == cosine_anisotropy_from_sums(h.sum_unit, h.n_nonzero)
    assert row["layer"] == 1 and row["n_tokens"] == h.count
    assert table[(site, "-", "all", "drift_norm")]["value"] == pytest.approx(
        float(h.sum.norm() / h.count)
    )
    assert ("-", "across_layers", "all", "drift_cosine_pearson") not in table  # 2 sites < 3


def test_shape_of_learning(micro_step_data):
    config = shape_of_learning.ShapeOfLearningConfig(twonn_batch=512)
    table = _by_key(shape_of_learning.rows(micro_step_data, config))
    site = "blocks.0.hook_resid_post"
    h = micro_step_data.statistics.sites[site].h
    assert table[(site, "-", "all", "centred_anisotropy")]["value"] == pytest.approx(
        centred_anisotropy_from_moments(h.count, h.sum, h.second_moment)
    )
    dim = table[(site, "-", "all", "twonn_dimension")]["value"]
    assert 1 < dim < 32
    assert 0 < table[(site, "-", "all", "isoscore")]["value"] <= 1
    with pytest.raises(ValueError, match="twonn_fit must be"):
        shape_of_learning.ShapeOfLearningConfig(twonn_fit="mle")


def test_qk_drift(micro_step_data):
    table = _by_key(qk_drift.rows(micro_step_data, qk_drift.QKDriftConfig()))
    stats = micro_step_data.statistics.attention[1]
    ref = qk_drift_from_means(stats.sum_q / stats.count, stats.sum_k / stats.count)
    assert table[("blocks.1.attn", "head1", "all", "qk_cosine")]["value"] == pytest.approx(
        float(ref.cosine[1])
    )
    entropy = table[("blocks.0.attn", "head0", "all", "attention_entropy")]
    assert entropy["layer"] == 0 and 0 < entropy["value"] < torch.log(torch.tensor(32.0))


def test_frequency_geometry(micro_step_data):
    config = frequency_geometry.FrequencyGeometryConfig(min_count=3, k=16, tangent_dim=4)
    table = _by_key(frequency_geometry.rows(micro_step_data, config))
    site = "blocks.1.hook_resid_post"
    spearman = table[(site, "-", "all", "freq_distance_spearman")]["value"]
    assert -1 <= spearman <= 1
    visibility = [table[(site, "-", str(b), "curvature_visibility")]["value"] for b in range(3)]
    assert all(v > 0 for v in visibility)
