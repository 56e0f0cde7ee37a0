"""The ``"hf"`` loader's adapter: a Hugging Face masked-LM encoder that TransformerLens neither
converts nor bridges (EuroBERT, ModernBERT — ModernCamemBERT is one), run as it is, read
through forward hooks on its own modules.

Sites (:func:`~tangentlens.models.sites.hf_templates`; every one a module's input or output, so
a hook sees the tensor the model goes on with and may replace it):

============================== ==========================================================
``embed.hook_embed``           the token embedding's output (``W_E`` rows)
``blocks.{l}.hook_resid_pre``  layer ``l``'s input (block 0: ModernBERT's normed embedding)
``blocks.{l}.hook_resid_post`` layer ``l``'s output — the last one **before** the encoder's
                               final norm (``output_hidden_states`` replaces that entry by
                               the normed state, which is why no site is read from it)
``blocks.{l}.hook_attn_out``   the attention module's output (after its output projection)
``blocks.{l}.hook_mlp_out``    the MLP's output
============================== ==========================================================

No per-head query, key or pattern site: :meth:`HfLens.attention_refusal` says so. The loss head
is the model's own modules: :meth:`HfLens.head_input` runs the base model (its layers and final
norm) and, for ModernBERT, the prediction head (dense, activation, norm), up to the input of the
decoder ``U W_U + b_U`` (EuroBERT's ``lm_head``, ModernBERT's ``decoder``), which the capture
applies a chunk of scored rows at a time. Gradients need nothing of the model: the capture
differentiates the head's input with respect to the hooked tensors (``torch.autograd.grad``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float

from tangentlens.models.adapter import HeadInput, HookFn, LensModel, Loader
from tangentlens.models.sites import SITE_KINDS, Family, SiteTemplates, hf_templates
from tangentlens.typing import Tokens

__all__ = ["HF_ENCODERS", "HfConfig", "HfEncoderParts", "HfLens"]


@dataclass(frozen=True)
class HfEncoderParts:
    """Where a model type keeps its parts: ``architecture`` (the masked-LM class a checkpoint's
    ``config.json`` must name), attribute names on the base model (``final_norm``) and on each
    layer (``attention``, its output a tuple whose first entry is the output; ``mlp``), and on
    the masked-LM model (``head``: the transform before the decoder, None when there is none)."""

    architecture: str
    final_norm: str
    attention: str
    mlp: str
    head: str | None


#: ``config.json`` model type → its parts (the model types of
#: :data:`~tangentlens.models.catalog.HF_MODEL_TYPES`).
HF_ENCODERS: dict[str, HfEncoderParts] = {
    "eurobert": HfEncoderParts("EuroBertForMaskedLM", "norm", "self_attn", "mlp", None),
    "modernbert": HfEncoderParts("ModernBertForMaskedLM", "final_norm", "attn", "mlp", "head"),
}


@dataclass
class HfConfig:
    """What tangentlens records of an ``"hf"``-loaded model, named as on a TransformerLens
    config (``model_name``, ``checkpoint_value``, ``original_architecture``) so that suites
    label it alike."""

    model_name: str | None
    original_architecture: str
    checkpoint_value: int | None = None


class HfLens(LensModel):
    """A Hugging Face ``EuroBertForMaskedLM`` / ``ModernBertForMaskedLM`` (``module``), raw
    weights, with the tokenizer it was loaded with."""

    loader: Loader = "hf"
    family: Family = "encoder"

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        tokenizer: Any = None,
        model_name: str | None = None,
    ) -> None:
        config = getattr(model, "config", None)
        model_type = getattr(config, "model_type", None)
        parts = HF_ENCODERS.get(str(model_type))
        if parts is None or type(model).__name__ != parts.architecture:
            allowed = [p.architecture for p in HF_ENCODERS.values()]
            raise ValueError(
                f"loader 'hf' measures {allowed} (a masked-LM head: the loss), got "
                f"{type(model).__name__}"
            )
        self.module = model
        self.parts = parts
        self._tokenizer = tokenizer
        self._cfg = HfConfig(model_name or config.name_or_path or None, parts.architecture)
        self.n_layers, self.d_model = int(config.num_hidden_layers), int(config.hidden_size)
        self.n_heads = int(config.num_attention_heads)
        self.n_kv_heads = int(getattr(config, "num_key_value_heads", None) or self.n_heads)
        self.d_head = int(getattr(config, "head_dim", None) or self.d_model // self.n_heads)
        self.d_vocab = int(model.get_input_embeddings().weight.shape[0])
        self.n_ctx = int(config.max_position_embeddings)
        self._templates = hf_templates()
        self._modules = self._site_modules()

    def _site_modules(self) -> dict[str, tuple[torch.nn.Module, str]]:
        """Hook name → (module, ``"input"`` / ``"output"`` / ``"output[0]"``: which tensor)."""
        layers = self.module.base_model.layers
        sites: dict[str, tuple[torch.nn.Module, str]] = {
            self._templates["embed"]: (self.module.get_input_embeddings(), "output")
        }
        for layer, block in enumerate(layers):
            name = {k: v.format(l=layer) for k, v in self._templates.items() if "{l}" in v}
            sites[name["resid_pre"]] = (block, "input")
            sites[name["resid_post"]] = (block, "output")
            sites[name["attn_out"]] = (getattr(block, self.parts.attention), "output[0]")
            sites[name["mlp_out"]] = (getattr(block, self.parts.mlp), "output")
        return sites

    @property
    def cfg(self) -> HfConfig:
        return self._cfg

    @property
    def device(self) -> torch.device:
        return self.W_E.device

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def architecture(self) -> str:
        return self.parts.architecture

    @property
    def W_E(self) -> Float[torch.Tensor, "d_vocab d_model"]:  # noqa: N802 (TransformerLens' name)
        """The token embedding matrix (what ``update_alignment`` differences across steps)."""
        return self.module.get_input_embeddings().weight

    @property
    def has_lm_head(self) -> bool:
        return True

    @property
    def templates(self) -> SiteTemplates:
        return self._templates

    @property
    def hook_points(self) -> Collection[str]:
        return self._modules

    def _lacks(self, kind: str) -> str:
        if kind in SITE_KINDS:
            return f" (loader 'hf' hooks {self.architecture}'s layers, not its attention heads)"
        return ""

    def attention_refusal(self) -> str:
        return (
            f"{self.describe()} is loaded with loader 'hf', which hooks its layers, not its "
            "attention heads (no per-head queries, keys or patterns)"
        )

    def describe(self) -> str:
        return f"Hugging Face {self.architecture}"

    @contextlib.contextmanager
    def hooks(self, hooks: Mapping[str, HookFn]) -> Iterator[None]:
        self._check_names(hooks)
        handles = []
        try:
            for name, fn in hooks.items():
                module, where = self._modules[name]
                if where == "input":
                    handles.append(module.register_forward_pre_hook(_on_input(fn)))
                else:
                    handles.append(module.register_forward_hook(_on_output(fn, where)))
            yield
        finally:
            for handle in handles:
                handle.remove()

    def head_input(self, inputs: Tokens, loss: str) -> HeadInput:
        """The decoder's input ``U`` (batch, pos, d_model): the base model's output (after its
        final norm), through the prediction head where there is one; for loss ``"none"`` the
        last layer's output, before the final norm."""
        base = self.module.base_model
        if loss == "none":
            last: list[torch.Tensor] = []
            with self.hooks({f"blocks.{self.n_layers - 1}.hook_resid_post": last.append}):
                base(input_ids=inputs)
            return last[0]
        normed = base(input_ids=inputs).last_hidden_state
        if self.parts.head is None:
            return normed
        return getattr(self.module, self.parts.head)(normed)

    def unembedding(self) -> tuple[Float[torch.Tensor, "d_model d_vocab"], torch.Tensor]:
        decoder = self.module.get_output_embeddings()
        weight = decoder.weight.T
        bias = decoder.bias
        if bias is None:
            bias = torch.zeros(weight.shape[1], dtype=weight.dtype, device=weight.device)
        return weight, bias


def _on_input(fn: HookFn) -> Callable[..., tuple[Any, ...] | None]:
    """A forward pre-hook handing ``fn`` the module's first positional input."""

    def hook(module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        out = fn(args[0])
        return None if out is None else (out, *args[1:])

    return hook


def _on_output(fn: HookFn, where: str) -> Callable[..., Any]:
    """A forward hook handing ``fn`` the module's output (``"output[0]"``: its first entry)."""

    def hook(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        if where == "output":
            return fn(output)
        out = fn(output[0])
        return None if out is None else (out, *output[1:])

    return hook
