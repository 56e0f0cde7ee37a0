"""Query/key drift and attention entropy per head (Godey et al. 2024; METHODS.md §3).

For each captured attention layer (site ``blocks.{l}.attn``, one row per head with
``method = "head{h}"``): ``qk_query_norm`` ‖m_Q‖, ``qk_key_norm`` ‖m_K‖, ``qk_cosine``
cos(m_Q, m_K), ``qk_mean_logit`` ⟨m_Q, m_K⟩/√d_head (queries and keys before rotary embeddings)
and ``attention_entropy`` (nats, mean over kept query positions)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tangentlens.capture.captured import Capture
from tangentlens.capture.needs import Needs
from tangentlens.contract import Probe, StepInputs
from tangentlens.reporting import Figure, Reporting, Table
from tangentlens.results import make_row

__all__ = ["NAME", "PROBE", "QKDriftConfig", "rows"]


@dataclass(frozen=True)
class QKDriftConfig:
    """No settings: every captured attention layer is reported."""


#: The probe's name: its recipe table ``[probes.qk_drift]`` and its rows' ``probe``.
NAME = "qk_drift"


def rows(data: Capture, config: QKDriftConfig) -> list[dict[str, Any]]:
    """One row per captured attention layer, head and metric (``method = "head{h}"``)."""
    import torch  # not at import: reading a recipe loads the probes' modules, not torch

    out: list[dict[str, Any]] = []
    for layer, stats in sorted(data.statistics.attention.items()):
        drift = stats.drift()
        per_head = {
            "qk_query_norm": drift.query_norm,
            "qk_key_norm": drift.key_norm,
            "qk_cosine": drift.cosine,
            "qk_mean_logit": drift.mean_logit,
            "attention_entropy": stats.entropy(),
        }
        # every metric of every head in one transfer (one wait on a GPU per layer)
        read = torch.cat(list(per_head.values())).tolist()
        heads = len(read) // len(per_head)
        values = {m: read[i * heads : (i + 1) * heads] for i, m in enumerate(per_head)}
        for head in range(len(values["attention_entropy"])):
            common = {
                "site": f"blocks.{layer}.attn",
                "layer": layer,
                "method": f"head{head}",
                "n_tokens": stats.count,
            }
            for metric, by_head in values.items():
                out.append(make_row(data, NAME, metric, by_head[head], **common))
    return out


def _step_rows(inputs: StepInputs, config: QKDriftConfig) -> list[dict[str, Any]]:
    return rows(inputs.capture, config)


#: The probe, declared once (:class:`~tangentlens.contract.Probe`): what the registry runs.
PROBE = Probe(
    name=NAME,
    config=QKDriftConfig,
    scope="step",
    needs=Needs(attention=True),
    rows=_step_rows,
    metrics={
        "qk_query_norm": "per head, `‖m_Q‖`",
        "qk_key_norm": "per head, `‖m_K‖`",
        "qk_cosine": "per head, `cos(m_Q, m_K)`",
        "qk_mean_logit": "per head, `⟨m_Q, m_K⟩ / √d_head`",
        "attention_entropy": "per head, mean `−Σⱼ aᵢⱼ log aᵢⱼ` (nats)",
    },
    reporting=Reporting(
        tables=(
            Table(
                "qk_cosine",
                "cos(m_Q, m_K), mean over heads",
                compare_title="cos(m_Q, m_K), mean over shared heads",
                per_method=False,
            ),
            Table(
                "attention_entropy",
                "attention entropy (nats), mean over heads",
                compare_title="attention entropy (nats), shared heads' mean",
                per_method=False,
            ),
        ),
        figures=(
            Figure(
                "qk_drift.png",
                "qk_cosine",
                "cos(m_Q, m_K), mean over heads",
                "Query/key drift over training",
                per_method=False,
            ),
            Figure(
                "qk_drift.png",
                "attention_entropy",
                "attention entropy (nats), mean over heads",
                "Query/key drift over training",
                per_method=False,
            ),
        ),
    ),
)
