"""One forward and one backward pass of the model's own loss → activations ``H`` and per-token
gradients ``G = ∂L/∂H`` at every requested hook site.

How: parameters are frozen for the pass (no weight gradients are computed), forward hooks record
the site tensors without changing them, and one ``torch.autograd.grad(L, site tensors)`` returns
every site's gradient. The first site whose tensor does not yet require a gradient (nothing
upstream of it does, parameters being frozen) is replaced by an identical leaf that does, so the
backward pass stops there.

The loss (recorded with every result):

* ``next_token`` (decoders): cross-entropy of position ``t``'s logits against token ``t + 1``;
  the last position of each row predicts nothing, so its gradient is exactly zero: it is excluded
  from the statistics as ``no_target``; targets equal to the pad id are not scored;
* ``mlm`` (encoders): BERT's corruption (15 % of non-special positions; 80 % [MASK], 10 % random,
  10 % kept), each sequence's drawn from a generator seeded by ``(seed, sequence index)`` so the
  masks do not depend on the batch size; cross-entropy at the chosen (scored) positions.

Which positions the statistics keep (one set for activation moments, gradient moments, the row
reservoir and attention, so proxies and energies describe the same tokens):
:func:`tangentlens.data.masks.analysis_mask` of the **original** tokens. For MLM that keeps every
scored position — the ``[MASK]`` inputs carry ~80 % of the loss — and every unscored one, and
each position is binned (frequency bins, per-type sums) by its original token, never by the
``[MASK]`` id or a random replacement; ``CapturedBatch.tokens`` holds those original ids,
``inputs`` what the model read. A ``[MASK]`` input's activations describe a masked context (at
the embedding, the ``[MASK]`` vector itself), and they enter the activation statistics like any
other kept row: about 12 % of kept rows at 15 % × 80 %. Gradient statistics are *not* restricted
to scored positions: ``G = ∂L/∂H`` is the true gradient at every kept row; unscored rows are
exactly zero at the last block (~85 % of rows there) but not below it, where attention carries
the loss to every position; zero rows add nothing to the pooled energy sums.

``reduction="sum"`` (the only one) differentiates the summed token loss, so a token's gradient
does not depend on the batch size or on the other rows of its batch. A per-batch mean is not
offered: dividing each batch by its own number of scored tokens would weight tokens of small or
sparsely scored batches (the last batch, MLM) up in every pooled ratio; a constant scale would
change no ratio.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from jaxtyping import Bool, Float

from tangentlens.data.masks import MaskPolicy, analysis_mask
from tangentlens.data.mlm import IGNORE_INDEX, mlm_corrupt
from tangentlens.data.packing import SpecialTokens
from tangentlens.seeding import seeded_generator
from tangentlens.typing import Tokens

__all__ = [
    "LOSSES",
    "REDUCTIONS",
    "AttentionTensors",
    "CaptureConfig",
    "CapturedBatch",
    "capture_batch",
    "frozen_parameters",
]

LOSSES: tuple[str, ...] = ("next_token", "mlm")
REDUCTIONS: tuple[str, ...] = ("sum",)

SiteTensor = Float[torch.Tensor, "batch pos d"]


@dataclass(frozen=True)
class CaptureConfig:
    """What one capture pass records.

    Args:
        sites: full TransformerLens hook names whose activations (and gradients) are kept.
        loss: ``"next_token"`` (decoders) or ``"mlm"`` (encoders).
        gradients: also compute ``G = ∂L/∂H`` at every site (one backward pass).
        reduction: ``"sum"`` of the token losses that ``G`` differentiates (the only one).
        mlm_probability: share of non-special positions the masked-LM loss scores.
        seed: seeds the masked-LM corruption, with each sequence's index.
        attention_layers: layers whose queries, keys and attention pattern are kept.
        mask_policy: which positions the statistics exclude (BOS, position 0, padding, special).
    """

    sites: tuple[str, ...]
    loss: str = "next_token"
    gradients: bool = True
    reduction: str = "sum"
    mlm_probability: float = 0.15
    seed: int = 0
    attention_layers: tuple[int, ...] = ()
    mask_policy: MaskPolicy = field(default_factory=MaskPolicy)

    def __post_init__(self) -> None:
        if isinstance(self.sites, str) or not all(isinstance(s, str) for s in self.sites):
            raise ValueError(f"sites must be a sequence of hook names, got {self.sites!r}")
        object.__setattr__(self, "sites", tuple(self.sites))
        if not self.sites and not self.attention_layers:
            raise ValueError("nothing to capture: give at least one site or attention layer")
        if len(set(self.sites)) != len(self.sites):
            raise ValueError(f"sites must be distinct, got {list(self.sites)}")
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {self.loss!r}")
        if self.reduction not in REDUCTIONS:
            raise ValueError(
                f"reduction must be one of {REDUCTIONS}, got {self.reduction!r} (a per-batch "
                "mean would reweight tokens across batches)"
            )
        if not 0 < self.mlm_probability < 1:
            raise ValueError(f"mlm_probability must be in (0, 1), got {self.mlm_probability!r}")
        layers = tuple(self.attention_layers)
        if any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in layers):
            raise ValueError(f"attention_layers must be integers ≥ 0, got {layers!r}")
        object.__setattr__(self, "attention_layers", layers)

    @property
    def causal(self) -> bool:
        return self.loss == "next_token"


@dataclass(frozen=True)
class AttentionTensors:
    """One layer's queries and keys (batch, pos, head, d_head; before rotary embeddings) and
    attention pattern (batch, head, query, key)."""

    q: Float[torch.Tensor, "batch pos head d_head"]
    k: Float[torch.Tensor, "batch pos head d_head"]
    pattern: Float[torch.Tensor, "batch head query key"]


@dataclass(frozen=True)
class CapturedBatch:
    """The result of :func:`capture_batch` for one token batch.

    ``tokens`` is the token each position stands for (the original text: for masked-LM capture
    the token before corruption — what bins and per-type sums use); ``inputs`` what the model
    read (after masked-LM corruption; equal to ``tokens`` for decoders); ``keep`` the positions
    the statistics use (see the module docstring); ``scored`` the positions the loss scores;
    ``excluded`` counts excluded positions per reason (``bos``, ``position0``, ``padding``,
    ``special``, ``no_target``; ``total`` = excluded by any); ``loss`` is the reduced loss and
    ``n_scored`` the number of tokens it scores. ``gradients`` is empty when the config asks
    for none.
    """

    tokens: Tokens
    inputs: Tokens
    scored: Bool[torch.Tensor, "batch pos"]
    keep: Bool[torch.Tensor, "batch pos"]
    excluded: dict[str, int]
    activations: dict[str, SiteTensor]
    gradients: dict[str, SiteTensor]
    attention: dict[int, AttentionTensors]
    loss: float
    n_scored: int

    def rows(
        self, site: str
    ) -> tuple[Float[torch.Tensor, "n d"], Float[torch.Tensor, "n d"] | None]:
        """Kept rows ``(H, G)`` of ``site`` (``G`` None without gradients), row-major order."""
        if site not in self.activations:
            raise ValueError(f"site {site!r} was not captured; captured: {list(self.activations)}")
        h = self.activations[site][self.keep]
        g = self.gradients[site][self.keep] if site in self.gradients else None
        return h, g


@contextmanager
def frozen_parameters(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode and ``requires_grad=False`` on every parameter; both restored on exit."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    was_training = model.training
    for p, _ in flags:
        p.requires_grad_(False)
    model.eval()
    try:
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
        model.train(was_training)


def _attention_names(model: torch.nn.Module, layers: tuple[int, ...]) -> dict[str, tuple[int, str]]:
    from tangentlens.models.sites import hook_name

    names = {}
    for layer in layers:
        for kind in ("q", "k", "pattern"):
            names[hook_name(model, kind, layer)] = (layer, kind)
    return names


def _check_sites(model: torch.nn.Module, sites: tuple[str, ...]) -> None:
    unknown = [s for s in sites if s not in model.hook_dict]
    if unknown:
        blocks = [n for n in model.hook_dict if n.startswith("blocks.0.")]
        raise ValueError(
            f"unknown hook site(s) {unknown}; this model offers e.g. {blocks[:8]} for every block "
            "(see tangentlens.models.hook_name)"
        )


def _check_finite(tensors: dict[str, torch.Tensor], what: str, step: int | None) -> None:
    if not tensors:
        return
    flags = torch.stack([torch.isfinite(t).all() for t in tensors.values()]).tolist()  # one sync
    bad = [site for site, ok in zip(tensors, flags, strict=True) if not ok]
    if bad:
        at = "" if step is None else f" at step {step}"
        raise ValueError(
            f"non-finite {what} (NaN or inf) at site {bad[0]!r}{at}: the checkpoint or the "
            "input is broken; nothing from this batch was accumulated"
        )


def _loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    n_scored = int((labels != IGNORE_INDEX).sum())
    total = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        labels.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )
    return total, n_scored


def _inputs_and_labels(
    tokens: Tokens,
    config: CaptureConfig,
    special: SpecialTokens,
    vocab_size: int,
    first_sequence: int,
) -> tuple[Tokens, torch.Tensor]:
    if config.causal:
        labels = torch.full_like(tokens, IGNORE_INDEX)
        labels[:, :-1] = tokens[:, 1:]
        if special.pad_id is not None:
            labels[labels == special.pad_id] = IGNORE_INDEX
        return tokens, labels
    if special.mask_id is None:
        raise ValueError("the mlm loss needs special.mask_id (the tokenizer's [MASK] id)")
    pairs = [
        mlm_corrupt(
            row[None],
            special_ids=special.all_ids(),
            mask_id=special.mask_id,
            vocab_size=vocab_size,
            probability=config.mlm_probability,
            generator=seeded_generator(config.seed, first_sequence + i),
        )
        for i, row in enumerate(tokens.cpu())
    ]
    inputs = torch.cat([p[0] for p in pairs]).to(tokens.device)
    return inputs, torch.cat([p[1] for p in pairs]).to(tokens.device)


def capture_batch(
    model: torch.nn.Module,
    tokens: Tokens,
    config: CaptureConfig,
    special: SpecialTokens,
    *,
    first_sequence: int = 0,
    step: int | None = None,
) -> CapturedBatch:
    """Capture ``config.sites`` (and attention) for one ``(batch, pos)`` token batch.

    ``model`` is a TransformerLens ``HookedTransformer`` or ``HookedEncoder``;
    ``first_sequence`` is the stream index of the batch's first row (it seeds the masked-LM
    corruption); ``step`` only names the checkpoint in error messages.
    Non-finite activations or gradients raise ``ValueError`` naming the site and step.
    """
    shape_ok = isinstance(tokens, torch.Tensor) and tokens.ndim == 2
    if not shape_ok or tokens.shape[0] < 1 or tokens.shape[1] < 2:
        raise ValueError(
            "tokens must be a (batch, pos) integer tensor with batch ≥ 1 and pos ≥ 2, got "
            f"{type(tokens).__name__} {tuple(getattr(tokens, 'shape', ()))}"
        )
    _check_sites(model, config.sites)
    vocab_size = model.cfg.d_vocab
    if int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size:
        raise ValueError(
            f"token ids must lie in [0, {vocab_size}) (the model's vocabulary), got "
            f"[{int(tokens.min())}, {int(tokens.max())}]"
        )
    tokens = tokens.to(model.cfg.device)
    inputs, labels = _inputs_and_labels(tokens, config, special, vocab_size, first_sequence)
    attention_names = _attention_names(model, config.attention_layers)
    site_set = set(config.sites)
    activations: dict[str, torch.Tensor] = {}
    raw_attention: dict[int, dict[str, torch.Tensor]] = {}

    def record(tensor: torch.Tensor, hook: object) -> torch.Tensor:
        name = hook.name  # type: ignore[attr-defined]
        if name in attention_names:
            layer, kind = attention_names[name]
            raw_attention.setdefault(layer, {})[kind] = tensor.detach()
        if name in site_set:
            if config.gradients and not tensor.requires_grad:
                tensor = tensor.detach().requires_grad_(True)
            activations[name] = tensor
        return tensor

    names = sorted(site_set | set(attention_names))
    with frozen_parameters(model), model.hooks(fwd_hooks=[(n, record) for n in names]):
        if config.gradients:
            with torch.enable_grad():
                logits = model(inputs, return_type="logits")
                loss, n_scored = _loss(logits, labels)
                grads = torch.autograd.grad(
                    loss, [activations[s] for s in config.sites], allow_unused=True
                )
        else:
            with torch.inference_mode():
                logits = model(inputs, return_type="logits")
                loss, n_scored = _loss(logits, labels)
            grads = ()
    gradients = {
        s: torch.zeros_like(activations[s]) if g is None else g
        for s, g in zip(config.sites, grads, strict=False)  # no gradients: grads is empty
    }
    activations = {s: activations[s].detach() for s in config.sites}
    _check_finite(activations, "activations", step)
    _check_finite(gradients, "gradients", step)
    # kept positions come from the original tokens: an MLM [MASK] or random input is kept
    masks = analysis_mask(tokens, special, causal=config.causal, policy=config.mask_policy)
    keep, excluded = masks.keep, dict(masks.excluded)
    loss_value = float(loss.detach())
    if not math.isfinite(loss_value):
        at = "" if step is None else f" at step {step}"
        raise ValueError(f"the loss is not finite{at} ({loss_value}): the checkpoint is broken")
    return CapturedBatch(
        tokens=tokens,
        inputs=inputs,
        scored=labels != IGNORE_INDEX,
        keep=keep,
        excluded=excluded,
        activations=activations,
        gradients=gradients,
        attention={
            layer: AttentionTensors(q=t["q"], k=t["k"], pattern=t["pattern"])
            for layer, t in sorted(raw_attention.items())
        },
        loss=loss_value,
        n_scored=n_scored,
    )
