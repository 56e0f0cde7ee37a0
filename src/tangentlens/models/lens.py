"""The kinds of model tangentlens measures (TransformerLens' two, and Hugging Face encoders
TransformerLens cannot load), each behind one adapter
(:class:`~tangentlens.models.adapter.LensModel`), and :func:`lens_model`, which wraps a model in
its own.

* :class:`HookedLens` — a ``HookedTransformer`` (decoders) or ``HookedEncoder`` (BERT-style
  encoders), TransformerLens' own re-implementation loaded from converted weights;
* :class:`BridgeLens` — a ``TransformerBridge`` (``TransformerBridge.boot_transformers``): the
  Hugging Face model itself, raw weights, eager attention, with TransformerLens hook points
  wrapped around its modules. Decoders (``…ForCausalLM``: next-token loss) and BERT masked-LM
  encoders (``BertForMaskedLM``; a ``BertModel`` checkpoint boots with a head the checkpoint
  does not hold, so it is marked headless and its head set to NaN by the loader);
* :class:`~tangentlens.models.hf_lens.HfLens` (:mod:`tangentlens.models.hf_lens`) — the
  Hugging Face masked-LM model itself, for the encoders TransformerLens neither converts nor
  bridges (EuroBERT, ModernBERT), read through forward hooks on its modules.

:func:`lens_model` wraps a model (a lens passes through unchanged); nothing outside
:mod:`tangentlens.models` tells the kinds apart. On the bridge the forward pass to the loss head
is stopped at the unembedding's input hook (``unembed.hook_in``; for loss ``none`` after the
last block), so no logits are computed at all.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

import torch

from tangentlens.models.adapter import HeadInput, HookFn, LensModel, Loader
from tangentlens.models.catalog import HEADLESS_ARCHITECTURES, HF_MODEL_TYPES
from tangentlens.models.hf_lens import HfLens
from tangentlens.models.sites import (
    SITE_KINDS,
    Family,
    SiteTemplates,
    bridge_templates,
    hooked_templates,
)
from tangentlens.typing import Tokens

__all__ = ["BRIDGE_ENCODERS", "BridgeLens", "HookedLens", "lens_model"]

#: Bridge architectures read as BERT-style masked-LM encoders (a ``BertModel`` boots as one).
BRIDGE_ENCODERS: tuple[str, ...] = ("BertForMaskedLM",)


def _observe(fn: HookFn) -> Callable[..., torch.Tensor | None]:
    """A TransformerLens hook function (``fn(tensor, hook=…)``) around ``fn``."""

    def hook(tensor: torch.Tensor, hook: Any = None) -> torch.Tensor | None:
        return fn(tensor)

    return hook


class HookedLens(LensModel):
    """A ``HookedTransformer`` or ``HookedEncoder``."""

    loader: Loader = "hooked"

    def __init__(self, model: torch.nn.Module) -> None:
        from transformer_lens import HookedEncoder, HookedTransformer

        if isinstance(model, HookedEncoder):
            self.family: Family = "encoder"
        elif isinstance(model, HookedTransformer):
            self.family = "decoder"
        else:
            raise ValueError(f"expected a HookedTransformer or HookedEncoder, got {type(model)}")
        cfg = model.cfg
        self.module = model
        self.n_layers, self.d_model = int(cfg.n_layers), int(cfg.d_model)
        self.n_heads, self.d_head = int(cfg.n_heads), int(cfg.d_head)
        self.n_kv_heads = int(getattr(cfg, "n_key_value_heads", None) or cfg.n_heads)
        self.d_vocab, self.n_ctx = int(cfg.d_vocab), int(cfg.n_ctx)
        self._templates = hooked_templates(self.family, bool(cfg.parallel_attn_mlp))

    @property
    def has_lm_head(self) -> bool:
        return self.cfg.original_architecture not in HEADLESS_ARCHITECTURES

    @property
    def templates(self) -> SiteTemplates:
        return self._templates

    @property
    def hook_points(self) -> Collection[str]:
        return self.module.hook_dict

    def hooks(self, hooks: Mapping[str, HookFn]) -> contextlib.AbstractContextManager[None]:
        self._check_names(hooks)
        return self.module.hooks(fwd_hooks=[(n, _observe(f)) for n, f in hooks.items()])

    def head_input(self, inputs: Tokens, loss: str) -> HeadInput:
        model = self.module
        if self.family == "encoder":
            resid = model.encoder_output(inputs, None, None)
        else:
            resid = model(inputs, stop_at_layer=self.n_layers)
        if loss == "none":
            return resid
        if self.family == "encoder":
            return model.mlm_head(resid)
        return model.ln_final(resid) if self.cfg.normalization_type is not None else resid

    def unembedding(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.module.unembed.W_U, self.module.unembed.b_U


class _HeadReachedError(Exception):
    """Raised inside the bridge's forward pass once the unembedding's input exists."""

    def __init__(self, tensor: torch.Tensor) -> None:
        super().__init__("head input reached")
        self.tensor = tensor


class BridgeLens(LensModel):
    """A ``TransformerBridge`` of a decoder (``…ForCausalLM``) or a BERT masked-LM encoder."""

    loader: Loader = "bridge"

    def __init__(self, model: torch.nn.Module) -> None:
        from transformer_lens.model_bridge import TransformerBridge

        if not isinstance(model, TransformerBridge):
            raise ValueError(f"expected a TransformerBridge, got {type(model).__name__}")
        if getattr(model, "_weights_processed", False):
            raise ValueError(
                "this TransformerBridge's weights were processed (enable_compatibility_mode / "
                "process_weights: LayerNorm folded, writing weights and unembedding centred, "
                "which deletes the mean direction tangentlens measures); use one booted with "
                "TransformerBridge.boot_transformers(...) and left unprocessed"
            )
        self.module = model
        cfg = model.cfg
        architecture = str(getattr(cfg, "architecture", None) or "")
        if architecture in BRIDGE_ENCODERS:
            self.family = "encoder"
        elif architecture.endswith("ForCausalLM"):
            self.family = "decoder"
        else:
            raise ValueError(
                f"TransformerBridge of {architecture or 'an unknown architecture'}: tangentlens "
                f"measures decoders (…ForCausalLM, next-token loss) and {list(BRIDGE_ENCODERS)} "
                "encoders (masked-LM loss)"
            )
        hf_config = model.original_model.config
        self.n_layers, self.d_model = int(cfg.n_layers), int(cfg.d_model)
        self.n_heads = int(cfg.n_heads)
        self.d_head = int(getattr(cfg, "d_head", None) or self.d_model // self.n_heads)
        self.n_kv_heads = int(
            getattr(hf_config, "num_key_value_heads", None)
            or getattr(cfg, "n_key_value_heads", None)
            or self.n_heads
        )
        self.d_vocab = int(model.original_model.get_input_embeddings().weight.shape[0])
        self.n_ctx = int(cfg.n_ctx)
        self._hf_architectures = list(getattr(hf_config, "architectures", None) or [])
        self._names = frozenset(model.hook_dict)
        self._templates = bridge_templates(self.family, architecture, self._names, self.n_layers)

    @property
    def architecture(self) -> str:
        return str(self.cfg.architecture)

    @property
    def has_lm_head(self) -> bool:
        """False when the checkpoint's ``config.json`` names only a headless architecture
        (``BertModel``): the bridge booted it with a head the checkpoint does not hold."""
        return not (
            self._hf_architectures
            and all(a in HEADLESS_ARCHITECTURES for a in self._hf_architectures)
        )

    @property
    def templates(self) -> SiteTemplates:
        return self._templates

    @property
    def hook_points(self) -> Collection[str]:
        return self._names

    def _lacks(self, kind: str) -> str:
        if reason := super()._lacks(kind):
            return reason
        if kind in SITE_KINDS:
            return f" (the bridge of {self.architecture} has no such hook at every block)"
        return ""

    @contextlib.contextmanager
    def hooks(self, hooks: Mapping[str, HookFn]) -> Iterator[None]:
        self._check_names(hooks)
        # the bridge resolves aliases (blocks.{l}.hook_resid_post → blocks.{l}.hook_out) and
        # would skip a name it cannot resolve without a word: all were checked above
        with self.module.hooks(fwd_hooks=[(n, _observe(f)) for n, f in hooks.items()]):
            yield

    def head_input(self, inputs: Tokens, loss: str) -> HeadInput:
        stop_at = f"blocks.{self.n_layers - 1}.hook_resid_post" if loss == "none" else None
        stop_at = stop_at or "unembed.hook_in"

        def reached(tensor: torch.Tensor) -> torch.Tensor:
            raise _HeadReachedError(tensor)

        options = {"use_cache": False} if self.family == "decoder" else {}
        with self.hooks({stop_at: reached}):
            try:
                self.module(inputs, **options)
            except _HeadReachedError as head:
                return head.tensor
        raise ValueError(
            f"the forward pass of this {self.describe()} never reached {stop_at!r}: its "
            "unembedding is not where TransformerLens' bridge names it"
        )

    def unembedding(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.module.unembed.W_U, self.module.unembed.b_U


def lens_model(model: Any) -> LensModel:
    """``model`` as a :class:`LensModel` (a lens unchanged): a ``HookedTransformer`` /
    ``HookedEncoder``, a ``TransformerBridge``, or a Hugging Face masked-LM model of
    :data:`~tangentlens.models.catalog.HF_MODEL_TYPES` (an
    :class:`~tangentlens.models.hf_lens.HfLens` without a tokenizer; ``load_local_checkpoint``
    gives one with it); anything else is a ``ValueError``."""
    if isinstance(model, LensModel):
        return model
    from transformer_lens import HookedEncoder, HookedTransformer
    from transformer_lens.model_bridge import TransformerBridge

    if isinstance(model, HookedEncoder | HookedTransformer):
        return HookedLens(model)
    if isinstance(model, TransformerBridge):
        return BridgeLens(model)
    if getattr(getattr(model, "config", None), "model_type", None) in HF_MODEL_TYPES:
        return HfLens(model)
    raise ValueError(
        "expected a TransformerLens HookedTransformer, HookedEncoder or TransformerBridge, or a "
        f"Hugging Face masked-LM model of {sorted(HF_MODEL_TYPES)}, got {type(model).__name__}"
    )
