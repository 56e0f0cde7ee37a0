"""One adapter over the kinds of model tangentlens measures (TransformerLens' two, and Hugging
Face encoders TransformerLens cannot load): what a capture, a probe's planning and
:func:`tangentlens.measure` need of a model, asked of one object.

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
:mod:`tangentlens.models` tells the kinds apart. Sites are named by :mod:`tangentlens.models.sites`
per loader and family; the same site kind means the same tensor on both loaders (the parity
tests compare them), even where the bridge names it differently (BERT's block output is
``blocks.{l}.hook_normalized_resid_post`` on ``HookedEncoder``, ``blocks.{l}.hook_resid_post``
on the bridge).

The loss head: :meth:`LensModel.head_input` runs the body up to the unembedding's input
``U`` (batch, pos, d_model) — decoders after the final norm, encoders after the MLM head's
transform — and :meth:`LensModel.logits` maps rows of ``U`` to logits ``U W_U + b_U``, so the
capture never holds batch × pos × vocabulary logits. On the bridge the forward pass is stopped
at the unembedding's input hook (``unembed.hook_in``; for loss ``none`` after the last block),
so no logits are computed at all.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, Literal

import torch
from jaxtyping import Float

from tangentlens.models.catalog import HEADLESS_ARCHITECTURES, HF_MODEL_TYPES
from tangentlens.models.sites import Family, SiteTemplates, bridge_templates, hooked_templates
from tangentlens.typing import Tokens

__all__ = ["BRIDGE_ENCODERS", "BridgeLens", "HookedLens", "LensModel", "lens_model"]

#: The loader a lens comes from (one of :data:`tangentlens.models.catalog.LOADERS`).
Loader = Literal["hooked", "bridge", "hf"]
#: A hook body: the site's tensor in, the tensor the model goes on with out (or None: unchanged).
HookFn = Callable[[torch.Tensor], torch.Tensor | None]
HeadInput = Float[torch.Tensor, "batch pos d_model"]

#: Bridge architectures read as BERT-style masked-LM encoders (a ``BertModel`` boots as one).
BRIDGE_ENCODERS: tuple[str, ...] = ("BertForMaskedLM",)


class LensModel(ABC):
    """What tangentlens reads of a model, whichever loader made it.

    Attributes: ``module`` (the ``torch.nn.Module`` to freeze, move and run), ``loader``
    (``"hooked"``, ``"bridge"`` or ``"hf"``), ``family`` (``"decoder"`` or ``"encoder"``),
    ``n_layers``, ``d_model``, ``n_heads``, ``n_kv_heads`` (key/value heads: fewer than
    ``n_heads`` under grouped-query attention), ``d_head``, ``d_vocab`` (rows of the input
    embedding), ``n_ctx`` (longest input), ``device``.
    """

    module: torch.nn.Module
    loader: Loader
    family: Family
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_vocab: int
    n_ctx: int

    @property
    def cfg(self) -> Any:
        """The TransformerLens config object (``HookedTransformerConfig`` or the bridge's)."""
        return self.module.cfg

    @property
    def device(self) -> torch.device:
        return torch.device(self.cfg.device)

    @property
    def tokenizer(self) -> Any:
        """The tokenizer attached to the model (None when it has none)."""
        return getattr(self.module, "tokenizer", None)

    @property
    def model_name(self) -> str | None:
        """The model's name as its loader recorded it (a suite sets the suite's)."""
        name = getattr(self.cfg, "model_name", None)
        return str(name) if name else None

    @property
    def checkpoint(self) -> int | None:
        """The training step the model was loaded at, when recorded (``cfg.checkpoint_value``)."""
        value = getattr(self.cfg, "checkpoint_value", None)
        return int(value) if value is not None else None

    @property
    @abstractmethod
    def has_lm_head(self) -> bool:
        """Whether the model has a language-modelling head, hence a loss and gradients."""

    @property
    @abstractmethod
    def templates(self) -> SiteTemplates:
        """Site kind → hook-name template (``{l}`` for the block) of every kind this model
        offers, in canonical order."""

    @property
    @abstractmethod
    def hook_points(self) -> Collection[str]:
        """Every hook name the model accepts (aliases included)."""

    @property
    def architecture(self) -> str:
        """The Hugging Face architecture the model was loaded from (``GPTNeoXForCausalLM``…)."""
        return str(
            getattr(self.cfg, "original_architecture", None)
            or getattr(self.cfg, "architecture", None)
            or type(self.module).__name__
        )

    def describe(self) -> str:
        """``"TransformerBridge (GPTNeoXForCausalLM)"``: what error messages call the model."""
        return f"{type(self.module).__name__} ({self.architecture})"

    def attention_refusal(self) -> str | None:
        """Why the per-head attention statistics (queries, keys, pattern entropy) cannot be
        taken from this model, or None when they can."""
        missing = [k for k in ("q", "k", "pattern") if k not in self.templates]
        if missing:
            return (
                f"{self.describe()} exposes no per-head attention {'/'.join(missing)} "
                f"(hook points such as blocks.0.attn.hook_{missing[0]})"
            )
        if self.n_kv_heads != self.n_heads:
            return (
                f"{self.describe()} uses grouped-query attention ({self.n_heads} query heads, "
                f"{self.n_kv_heads} key/value heads): per-head query/key drift needs one key per "
                "query head"
            )
        return None

    @abstractmethod
    def hooks(self, hooks: Mapping[str, HookFn]) -> contextlib.AbstractContextManager[None]:
        """Within the block, each ``hooks[name]`` sees the tensor at hook ``name`` on every
        forward pass (and may replace it). Unknown names are a ``ValueError``."""

    @abstractmethod
    def head_input(self, inputs: Tokens, loss: str) -> HeadInput:
        """The unembedding's input ``U`` for ``inputs`` (batch, pos): decoders after the final
        norm, encoders after the MLM head's transform; for loss ``"none"`` the residual stream
        after the last block (no head runs)."""

    @abstractmethod
    def unembedding(self) -> tuple[Float[torch.Tensor, "d_model d_vocab"], torch.Tensor]:
        """``(W_U, b_U)``: the unembedding's weight (d_model × d_vocab_out) and bias."""

    @property
    def d_vocab_out(self) -> int:
        """Columns of the unembedding (logits per position)."""
        return int(self.unembedding()[0].shape[1])

    def logits(self, x: Float[torch.Tensor, "n d_model"]) -> Float[torch.Tensor, "n d_vocab"]:
        """Logits of unembedding inputs ``x``: ``x W_U + b_U`` (no copy of ``W_U``ᵀ per call),
        soft-capped as the model does, in float32 at least."""
        weight, bias = self.unembedding()
        logits = torch.addmm(bias, x, weight)
        cap = self._soft_cap()
        if cap is not None:
            logits = cap * torch.tanh(logits / cap)
        return logits.to(torch.promote_types(logits.dtype, torch.float32))

    def _soft_cap(self) -> float | None:
        """The model's logit soft cap, None when it has none."""
        cap = getattr(self.cfg, "output_logits_soft_cap", None)
        return cap if cap is not None and cap > 0 else None

    @property
    def plain_logits(self) -> bool:
        """Whether :meth:`logits` is just ``x W_U + b_U`` at the weights' dtype (float32 or
        float64 weights, no soft cap): the loss gradient can then be written out on that
        buffer."""
        wide = self.unembedding()[0].dtype in (torch.float32, torch.float64)
        return wide and self._soft_cap() is None

    def _check_names(self, names: Collection[str]) -> None:
        unknown = [n for n in names if n not in self.hook_points]
        if unknown:
            blocks = [n for n in self.hook_points if n.startswith("blocks.0.")]
            raise ValueError(
                f"unknown hook site(s) {unknown} in this {self.describe()}; it offers e.g. "
                f"{blocks[:8]} for every block (see tangentlens.models.hook_name)"
            )


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
        from tangentlens.models.hf_lens import HfLens

        return HfLens(model)
    raise ValueError(
        "expected a TransformerLens HookedTransformer, HookedEncoder or TransformerBridge, or a "
        f"Hugging Face masked-LM model of {sorted(HF_MODEL_TYPES)}, got {type(model).__name__}"
    )
