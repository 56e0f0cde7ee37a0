"""What tangentlens reads of a model, whichever loader made it: :class:`LensModel`, the one
object a capture, a probe's planning and :func:`tangentlens.measure` ask (its kinds and
:func:`~tangentlens.models.lens.lens_model` are in :mod:`tangentlens.models.lens` and
:mod:`tangentlens.models.hf_lens`).

A lens names its sites (:meth:`LensModel.hook_name`, :meth:`~LensModel.parse_site`,
:meth:`~LensModel.residual_sites`) from the templates of its loader and family
(:mod:`tangentlens.models.sites`); the same site kind means the same tensor on every loader (the
parity tests compare them), even where the bridge names it differently (BERT's block output is
``blocks.{l}.hook_normalized_resid_post`` on ``HookedEncoder``, ``blocks.{l}.hook_resid_post`` on
the bridge).

>>> lens_model(model).hook_name("resid_post", 3)          # doctest: +SKIP
'blocks.3.hook_resid_post'

The loss head: :meth:`LensModel.head_input` runs the body up to the unembedding's input
``U`` (batch, pos, d_model) — decoders after the final norm, encoders after the MLM head's
transform — and :meth:`LensModel.logits` maps rows of ``U`` to logits ``U W_U + b_U``, so the
capture never holds batch × pos × vocabulary logits.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping
from typing import Any, Literal

import torch
from jaxtyping import Float

from tangentlens.models.sites import Family, SiteTemplates
from tangentlens.typing import Tokens

__all__ = ["HeadInput", "HookFn", "LensModel", "Loader"]

#: The loader a lens comes from (one of :data:`tangentlens.models.catalog.LOADERS`).
Loader = Literal["hooked", "bridge", "hf"]
#: A hook body: the site's tensor in, the tensor the model goes on with out (or None: unchanged).
HookFn = Callable[[torch.Tensor], torch.Tensor | None]
#: The unembedding's input ``U`` (batch, pos, d_model): what :meth:`LensModel.head_input` returns.
HeadInput = Float[torch.Tensor, "batch pos d_model"]


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
    def site_kinds(self) -> tuple[str, ...]:
        """The site kinds this model offers, in canonical order."""
        return tuple(self.templates)

    def hook_name(self, kind: str, layer: int | None = None) -> str:
        """The full hook name of site ``kind`` at block ``layer`` (no layer for ``embed``); a
        kind this model lacks is refused with the ones it offers."""
        templates = self.templates
        if kind not in templates:
            raise ValueError(
                f"site {kind!r} does not exist in this {self.family}{self._lacks(kind)}; "
                f"allowed: {list(templates)}"
            )
        template = templates[kind]
        if "{l}" not in template:
            if layer is not None:
                raise ValueError(f"site {kind!r} takes no layer, got layer={layer}")
            return template
        n_layers = self.n_layers
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < n_layers:
            raise ValueError(
                f"layer for site {kind!r} must be an integer in [0, {n_layers}), got {layer!r}"
            )
        return template.format(l=layer)

    def _lacks(self, kind: str) -> str:
        """Why this model has no site ``kind``, as a parenthesis for the refusal ("" if no
        reason is known)."""
        if kind == "resid_mid" and self.family == "decoder":
            return " (parallel attention and MLP: no resid_mid)"
        return ""

    def residual_sites(self) -> list[str]:
        """The residual stream after every block, first to last."""
        return [self.hook_name("resid_post", layer) for layer in range(self.n_layers)]

    def parse_site(self, name: str) -> tuple[str, int | None]:
        """Inverse of :meth:`hook_name`: ``(kind, layer)`` of a full hook name this model
        offers."""
        for kind in self.templates:
            layers = [None] if kind == "embed" else range(self.n_layers)
            for layer in layers:
                if self.hook_name(kind, layer) == name:
                    return kind, layer
        raise ValueError(
            f"unknown hook site {name!r}; allowed: {', '.join(self.templates)} at layers 0.."
            f"{self.n_layers - 1}, e.g. {self.hook_name('resid_post', 0)!r}"
        )

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
                f"{blocks[:8]} for every block (see tangentlens.models.LensModel.hook_name)"
            )
