"""The untrained-block experiment (Godey et al. 2024; METHODS.md §3) as a probe: no checkpoint
needed. One row per bias norm N and metric, with ``method = "bias_norm=<N>"``, ``site =
"untrained_block"`` and ``step = -1``: ``input_cosine_anisotropy``, ``output_cosine_anisotropy``,
``norm_ratio`` (output/input mean norm) and ``attention_entropy``."""

from __future__ import annotations

from typing import Any

from tangentlens._lazy import LazyModule
from tangentlens.capture.needs import Needs
from tangentlens.contract import ModelFreeInputs, Probe
from tangentlens.models.configs import UntrainedBlockConfig
from tangentlens.reporting import Reporting, Table
from tangentlens.results import row

untrained = LazyModule("tangentlens.models.untrained_block")

__all__ = ["NAME", "PROBE", "UntrainedBlockConfig", "rows"]

#: The probe's name: its recipe table ``[probes.untrained_block]`` and its rows' ``probe``.
NAME = "untrained_block"


def rows(suite: str, config: UntrainedBlockConfig) -> list[dict[str, Any]]:
    """Runs the experiment of ``config``: one row per bias norm and metric, labelled with
    ``suite``."""
    out = []
    for result in untrained.run_untrained_block(config):
        for metric, value in (
            ("input_cosine_anisotropy", result.input_cosine_anisotropy),
            ("output_cosine_anisotropy", result.output_cosine_anisotropy),
            ("norm_ratio", result.norm_ratio),
            ("attention_entropy", result.attention_entropy_mean),
        ):
            out.append(
                row(
                    suite,
                    -1,
                    0,
                    NAME,
                    metric,
                    value,
                    site="untrained_block",
                    layer=0,
                    method=f"bias_norm={result.bias_norm:g}",
                    n_tokens=config.n_sequences * config.seq_len,
                )
            )
    return out


def _model_free_rows(inputs: ModelFreeInputs, config: UntrainedBlockConfig) -> list[dict[str, Any]]:
    return rows(inputs.suite, config)


#: The probe, declared once (:class:`~tangentlens.contract.Probe`): what the registry runs.
PROBE = Probe(
    name=NAME,
    config=UntrainedBlockConfig,
    scope="model_free",
    needs=Needs(),
    rows=_model_free_rows,
    metrics={
        "input_cosine_anisotropy": "per bias norm N, cosine anisotropy of the block's input",
        "output_cosine_anisotropy": "per bias norm N, of its output",
        "norm_ratio": "mean output norm / mean input norm",
        "attention_entropy": "mean attention entropy (nats)",
    },
    reporting=Reporting(
        tables=(
            Table(
                "input_cosine_anisotropy",
                "untrained block with a common bias of norm N",
                in_compare=False,
                render="tangentlens.probes.render.untrained_block:untrained_block_table",
            ),
        ),
        figures=(),
    ),
)
