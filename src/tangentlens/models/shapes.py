"""A model's shape from its ``config.json`` alone — no torch, no weights: what the sweep's memory
plan (:mod:`tangentlens.core.memory`) multiplies out before anything is loaded.

:class:`ModelShape` knows the three families tangentlens loads into TransformerLens: GPT-NeoX
(Pythia, the mini decoders), BERT encoders (with or without their MLM head) and Llama-style
decoders (Llama, Mistral, Qwen2). :data:`PYTHIA_CONFIGS` holds the published Pythia sizes, so a
Pythia sweep is planned before any revision is downloaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tangentlens.models.catalog import checkpoint_folders, parse_suite_spec
from tangentlens.models.configs import MINI_SUITE_CONFIGS, MiniSuiteConfig
from tangentlens.models.hub_suites import HUB_SUITES

__all__ = ["FAMILIES", "PYTHIA_CONFIGS", "ModelShape", "pythia_config", "suite_shape"]

#: Model families the memory plan knows (TransformerLens' layouts differ in what they save).
FAMILIES: tuple[str, ...] = ("gpt_neox", "bert", "llama")

_FAMILY_OF = {
    "GPTNeoXForCausalLM": "gpt_neox",
    "BertForMaskedLM": "bert",
    "BertModel": "bert",
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "llama",
    # planned as Llama's layout (the catalogue's bridge / hf loaders are not measured: estimates)
    "OlmoForCausalLM": "llama",
    "EuroBertForMaskedLM": "llama",
    "ModernBertForMaskedLM": "llama",
}

#: Pythia sizes → (hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
#: vocab_size), as in the published ``config.json`` of ``EleutherAI/pythia-<size>[-deduped]``.
_PYTHIA = {
    "14m": (128, 6, 4, 512, 50304),
    "31m": (256, 6, 8, 1024, 50304),
    "70m": (512, 6, 8, 2048, 50304),
    "160m": (768, 12, 12, 3072, 50304),
    "410m": (1024, 24, 16, 4096, 50304),
    "1b": (2048, 16, 8, 8192, 50304),
    "1.4b": (2048, 24, 16, 8192, 50304),
    "2.8b": (2560, 32, 32, 10240, 50304),
    "6.9b": (4096, 32, 32, 16384, 50432),
    "12b": (5120, 36, 40, 20480, 50688),
}


def pythia_config(model: str) -> dict[str, Any]:
    """The ``config.json`` fields of ``EleutherAI/pythia-<size>[-deduped]`` that shape the model
    (a ``ValueError`` for another name)."""
    size = model.removeprefix("EleutherAI/pythia-").removesuffix("-deduped")
    if size not in _PYTHIA or not model.startswith("EleutherAI/pythia-"):
        raise ValueError(f"unknown Pythia model {model!r}; sizes: {list(_PYTHIA)}")
    hidden, layers, heads, intermediate, vocab = _PYTHIA[size]
    return {
        "architectures": ["GPTNeoXForCausalLM"],
        "model_type": "gpt_neox",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "intermediate_size": intermediate,
        "vocab_size": vocab,
        "max_position_embeddings": 2048,
        "rotary_pct": 0.25,
        "rotary_emb_base": 10000,
        "use_parallel_residual": True,
        "hidden_act": "gelu",
        "layer_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 0,
    }


#: Every published Pythia model's shaping config fields.
PYTHIA_CONFIGS: dict[str, dict[str, Any]] = {
    f"EleutherAI/pythia-{size}{suffix}": pythia_config(f"EleutherAI/pythia-{size}")
    for size in _PYTHIA
    for suffix in ("", "-deduped")
}


def _field(config: dict[str, Any], name: str, where: str) -> int:
    value = config.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: config field {name!r} must be an integer ≥ 1, got {value!r}")
    return value


@dataclass(frozen=True)
class ModelShape:
    """What the memory plan needs of a model: ``family`` (one of :data:`FAMILIES`), blocks,
    widths, heads (``n_kv_heads`` < ``n_heads`` for grouped-query attention), vocabulary,
    context (``n_ctx``), ``rotary_dim`` (0 without rotary embeddings), and ``has_head``: a
    language-modelling head (a plain ``BertModel`` has none)."""

    family: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_mlp: int
    d_vocab: int
    n_ctx: int
    rotary_dim: int
    has_head: bool = True

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], where: str = "config.json") -> ModelShape:
        """The shape a Hugging Face ``config.json`` (as a dict) describes; an architecture the
        plan does not know is a ``ValueError`` naming the known ones."""
        architectures = config.get("architectures") or []
        family = next((_FAMILY_OF[a] for a in architectures if a in _FAMILY_OF), None)
        if family is None:
            raise ValueError(
                f"{where}: architectures {architectures} have no memory plan; known: "
                f"{sorted(_FAMILY_OF)}"
            )
        d = _field(config, "hidden_size", where)
        heads = _field(config, "num_attention_heads", where)
        rotary = 0
        if family == "gpt_neox":
            rotary = int((d // heads) * float(config.get("rotary_pct", 1.0)))
        elif family == "llama":
            rotary = d // heads
        return cls(
            family=family,
            n_layers=_field(config, "num_hidden_layers", where),
            d_model=d,
            n_heads=heads,
            n_kv_heads=int(config.get("num_key_value_heads") or heads),
            d_mlp=_field(config, "intermediate_size", where),
            d_vocab=_field(config, "vocab_size", where),
            n_ctx=_field(config, "max_position_embeddings", where),
            rotary_dim=rotary,
            has_head="BertModel" not in architectures,
        )

    @classmethod
    def from_folder(cls, folder: str | Path) -> ModelShape:
        """The shape of the checkpoint folder's ``config.json``."""
        path = Path(folder) / "config.json"
        try:
            config = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"cannot read {path}: {error}") from error
        return cls.from_hf_config(config, str(path))

    @classmethod
    def from_mini(cls, config: MiniSuiteConfig) -> ModelShape:
        """The shape of a mini suite's models (what :mod:`tangentlens.models.training` builds)."""
        decoder = config.architecture == "pythia"
        return cls(
            family="gpt_neox" if decoder else "bert",
            n_layers=config.n_layers,
            d_model=config.d_model,
            n_heads=config.n_heads,
            n_kv_heads=config.n_heads,
            d_mlp=config.d_mlp,
            d_vocab=config.vocab_size,
            n_ctx=config.seq_len,
            rotary_dim=(config.d_model // config.n_heads) // 4 if decoder else 0,
        )

    def n_parameters(self) -> int:
        """Parameters of the TransformerLens model (its layout: separate biases everywhere,
        zero biases included where TransformerLens keeps them)."""
        d, m, v, layers = self.d_model, self.d_mlp, self.d_vocab, self.n_layers
        kv = self.n_kv_heads * self.d_head
        if self.family == "gpt_neox":
            block = 4 * d * d + 4 * d + 2 * d * m + m + d + 4 * d
            return v * d + layers * block + 2 * d + d * v + v
        if self.family == "bert":
            block = 4 * d * d + 4 * d + 2 * d * m + m + d + 4 * d
            embed = v * d + self.n_ctx * d + 2 * d + 2 * d
            # HookedEncoder always holds the MLM head, the pooler and the next-sentence head
            heads = d * d + d + 2 * d + d * v + v + d * d + d + 2 * d + 2
            return embed + layers * block + heads
        # llama: grouped K/V, gated MLP, RMS norms (weights only), zero attention/MLP biases
        attention = 2 * d * d + 2 * d * kv + 2 * d + 2 * kv
        block = attention + 3 * d * m + m + d + 2 * d
        return v * d + layers * block + d + d * v + v

    def n_buffer_bytes(self, itemsize: int) -> int:
        """Bytes of the TransformerLens model's buffers: per block a float32 constant and, with
        rotary embeddings, sine and cosine tables (n_ctx × rotary_dim, at the weights' dtype)."""
        return self.n_layers * (4 + 2 * self.n_ctx * self.rotary_dim * itemsize)


def suite_shape(spec: str) -> ModelShape:
    """The shape of the models of the suite ``spec`` (see
    :func:`~tangentlens.models.catalog.parse_suite_spec`), without opening it: a mini suite's
    from its config, Pythia's from :data:`PYTHIA_CONFIGS`, a hub catalogue suite's from its
    published config (:data:`~tangentlens.models.hub_suites.HUB_SUITES`), a local folder's from the
    ``config.json`` of its last checkpoint (the integrity check refuses configs that differ
    across checkpoints before any unit runs)."""
    kind, target = parse_suite_spec(spec)
    if kind == "pythia":
        return ModelShape.from_hf_config(pythia_config(target), target)
    if kind == "hub":
        return ModelShape.from_hf_config(HUB_SUITES[target].config, target)
    if kind == "local":
        return ModelShape.from_folder(list(checkpoint_folders(target).values())[-1])
    return ModelShape.from_mini(MINI_SUITE_CONFIGS[target])
