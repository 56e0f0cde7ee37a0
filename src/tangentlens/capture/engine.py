"""One forward and one backward pass of the model's own loss → activations ``H`` and per-token
gradients ``G = ∂L/∂H`` at every requested hook site.

How: parameters are frozen for the pass (no weight gradients are computed), forward hooks record
the site tensors without changing them, and one ``torch.autograd.grad`` through the model's body
returns every site's gradient. The first site whose tensor does not yet require a gradient
(nothing upstream of it does, parameters being frozen) is replaced by an identical leaf that does,
so the backward pass stops there.

The loss head never exists for the whole batch at once: the body runs to the unembedding's input
``U`` (decoders: the final residual stream after ``ln_final``; encoders: after the MLM head's
transform), and the unembedding and cross-entropy run on the **scored** positions only, at most
:func:`~tangentlens.capture.chunks.loss_chunk_rows` of them at a time, each chunk in its own small
graph on a detached copy of its rows of ``U``; the chunks' gradients ``∂L/∂U`` are scattered into
one buffer that the backward pass through the body starts from. Peak memory of the loss is that of
one chunk's logits (:data:`~tangentlens.capture.chunks.LOSS_CHUNK_BYTES`), not batch × pos × vocab.
Logits enter the cross-entropy in float32 at least. The unembedding is computed from its
weights (``U W_U + b_U``), so its hooks (``unembed.*``) cannot be captured; ``ln_final.*`` and
``mlm_head.*`` run on the whole batch and can. The model is read through
:mod:`tangentlens.models.lens` (a ``HookedTransformer``, ``HookedEncoder`` or
``TransformerBridge``): on a bridge, the Hugging Face forward pass is stopped at the
unembedding's input, so no logits are computed for the batch.

The loss (recorded with every result):

* ``next_token`` (decoders): cross-entropy of position ``t``'s logits against token ``t + 1``;
  the last position of each row predicts nothing, so its gradient is exactly zero: it is excluded
  from the statistics as ``no_target``; targets equal to the pad id are not scored;
* ``mlm`` (encoders): BERT's corruption (15 % of non-special positions; 80 % [MASK], 10 % random,
  10 % kept), each sequence's drawn from a generator seeded by ``(seed, sequence index)`` so the
  masks do not depend on the batch size; cross-entropy at the chosen (scored) positions;
* ``none``: activations only, for checkpoints without a language-modelling head (no head runs,
  no gradients; the loss is NaN and nothing is scored; encoder-style masks, no ``position0``).

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

Attention layers are reduced inside their forward hooks (queries, keys and the pattern's entropy
summed over the kept positions into an :class:`~tangentlens.capture.AttentionStatistics`): the
capture keeps no reference to a layer's queries, keys or pattern.

Where the work runs: everything of a batch stays on the model's device, and the host waits for
it once per batch. The masks, the masked-LM corruption, the kept positions (one flat index per
batch, shared by every site and attention layer: gathered with ``index_select``, no boolean
mask) and the scored positions are made on the host from the host's tokens and sent to the
device in one copy (:func:`~tangentlens.capture.transfer.upload_many`); the kept rows are
counted on the host; the loss and one finiteness sum per site tensor come back in one transfer
at the end of the batch — the batch's only wait.

``reduction="sum"`` (the only one) differentiates the summed token loss, so a token's gradient
does not depend on the batch size or on the other rows of its batch. A per-batch mean is not
offered: dividing each batch by its own number of scored tokens would weight tokens of small or
sparsely scored batches (the last batch, MLM) up in every pooled ratio; a constant scale would
change no ratio.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from jaxtyping import Bool, Float, Int

from tangentlens.capture.accumulators import AttentionStatistics
from tangentlens.capture.chunks import loss_chunk_rows
from tangentlens.capture.transfer import upload_many
from tangentlens.checks import finite_elementwise, finite_sums
from tangentlens.data.masks import MaskPolicy, analysis_mask
from tangentlens.data.mlm import IGNORE_INDEX, mlm_corrupt
from tangentlens.data.packing import SpecialTokens
from tangentlens.seeding import seeded_generator
from tangentlens.typing import TokenMask, Tokens

if TYPE_CHECKING:  # the capture reads models through the adapter of tangentlens.models
    from tangentlens.models.adapter import LensModel

__all__ = [
    "LOSSES",
    "REDUCTIONS",
    "CaptureConfig",
    "CapturedBatch",
    "capture_batch",
    "frozen_parameters",
]

#: The losses a capture differentiates (``CaptureConfig.loss``): next-token cross-entropy
#: (decoders), masked-LM (encoders), or none (activations only, for a model without a head).
LOSSES: tuple[str, ...] = ("next_token", "mlm", "none")
#: How token losses are reduced before the backward pass: summed (a token's gradient does not depend
#: on the batch).
REDUCTIONS: tuple[str, ...] = ("sum",)

SiteTensor = Float[torch.Tensor, "batch pos d"]
HeadInput = Float[torch.Tensor, "batch pos d_model"]


@dataclass(frozen=True)
class CaptureConfig:
    """What one capture pass records.

    Args:
        sites: full TransformerLens hook names whose activations (and gradients) are kept.
        loss: ``"next_token"`` (decoders), ``"mlm"`` (encoders) or ``"none"`` (activations only,
            for a checkpoint without a language-modelling head; needs ``gradients=False``).
        gradients: also compute ``G = ∂L/∂H`` at every site (one backward pass).
        score_loss: compute the loss of a forward-only capture (its ``mean_loss``); ``False``
            skips the language-modelling head (logits and cross-entropy) for captures that read
            activations only. The analysis mask still follows ``loss``. Needs ``gradients=False``.
        reduction: ``"sum"`` of the token losses that ``G`` differentiates (the only one).
        mlm_probability: share of non-special positions the masked-LM loss scores.
        seed: seeds the masked-LM corruption, with each sequence's index.
        attention_layers: layers whose queries, keys and attention entropy are summed.
        mask_policy: which positions the statistics exclude (BOS, position 0, padding, special).
    """

    sites: tuple[str, ...]
    loss: str = "next_token"
    gradients: bool = True
    score_loss: bool = True
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
        if self.loss == "none" and self.gradients:
            raise ValueError(
                "loss 'none' computes no loss, so there is no gradient to capture: set "
                "gradients=False, or use loss 'next_token' / 'mlm' with a model that has its "
                "language-modelling head"
            )
        if self.gradients and not self.score_loss:
            raise ValueError(
                "score_loss=False skips the loss, so there is no gradient to capture: set "
                "gradients=False, or keep score_loss=True"
            )
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

    @property
    def scores(self) -> bool:
        """Whether the capture computes the loss (a head to score and ``score_loss``)."""
        return self.loss != "none" and self.score_loss


@dataclass(frozen=True)
class CapturedBatch:
    """The result of :func:`capture_batch` for one token batch.

    ``tokens`` is the token each position stands for (the original text: for masked-LM capture
    the token before corruption — what bins and per-type sums use); ``inputs`` what the model
    read (after masked-LM corruption; equal to ``tokens`` for decoders); ``keep`` the positions
    the statistics use (see the module docstring), ``host_keep`` the same mask on the CPU (it
    is made there: the bookkeeping of ids and bins needs no copy back from the device);
    ``scored`` the positions the loss scores;
    ``kept`` the kept positions' flat indices (row-major over ``(batch, pos)``) on the model's
    device, the gather every site's rows share;
    ``excluded`` counts excluded positions per reason (``bos``, ``position0``, ``padding``,
    ``special``, ``no_target``; ``total`` = excluded by any); ``attention`` this batch's
    attention statistics per layer (on the model's device); ``loss`` is the reduced loss (NaN
    for loss ``none``) and ``n_scored`` the number of tokens it scores. ``gradients`` is empty
    when the config asks for none.
    """

    tokens: Tokens
    inputs: Tokens
    scored: Bool[torch.Tensor, "batch pos"]
    keep: TokenMask
    host_keep: TokenMask
    kept: Int[torch.Tensor, " n"]
    excluded: dict[str, int]
    activations: dict[str, SiteTensor]
    gradients: dict[str, SiteTensor]
    attention: dict[int, AttentionStatistics]
    loss: float
    n_scored: int

    def rows(
        self, site: str
    ) -> tuple[Float[torch.Tensor, "n d"], Float[torch.Tensor, "n d"] | None]:
        """Kept rows ``(H, G)`` of ``site`` (``G`` None without gradients), row-major order."""
        if site not in self.activations:
            raise ValueError(f"site {site!r} was not captured; captured: {list(self.activations)}")
        h = self.activations[site].flatten(0, 1).index_select(0, self.kept)
        g = None
        if site in self.gradients:
            g = self.gradients[site].flatten(0, 1).index_select(0, self.kept)
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


def _attention_names(lens: LensModel, layers: tuple[int, ...]) -> dict[str, tuple[int, str]]:
    names = {}
    for layer in layers:
        for kind in ("q", "k", "pattern"):
            names[lens.hook_name(kind, layer)] = (layer, kind)
    return names


def _check_sites(lens: LensModel, sites: tuple[str, ...]) -> None:
    unknown = [s for s in sites if s not in lens.hook_points]
    if unknown:
        blocks = [n for n in lens.hook_points if n.startswith("blocks.0.")]
        raise ValueError(
            f"unknown hook site(s) {unknown}; this model offers e.g. {blocks[:8]} for every block "
            "(see tangentlens.models.LensModel.hook_name)"
        )
    in_unembed = [s for s in sites if s.startswith("unembed.")]
    if in_unembed:
        raise ValueError(
            f"site(s) {in_unembed} lie in the unembedding, which the capture runs on the scored "
            "positions only, a chunk at a time; capture its input instead "
            "('ln_final.hook_normalized' in decoders, 'mlm_head.ln.hook_normalized' in encoders)"
        )


def _check_reached(activations: dict[str, torch.Tensor], config: CaptureConfig) -> None:
    missing = [s for s in config.sites if s not in activations]
    if missing:
        head = " (loss 'none' runs no head)" if config.loss == "none" else ""
        raise ValueError(
            f"site(s) {missing} were not reached by the capture's forward pass{head}; capture "
            "sites of the embedding, the blocks or the final norm"
        )


def _finite_or_raise(
    tensors: dict[str, torch.Tensor], sums: list[float], what: str, step: int | None
) -> None:
    """Raise naming the first site of ``tensors`` holding a NaN or inf, from each tensor's
    sum read back (``sums``; a non-finite sum is checked element by element)."""
    for (site, tensor), total in zip(tensors.items(), sums, strict=True):
        if not (math.isfinite(total) or finite_elementwise(tensor)):
            at = "" if step is None else f" at step {step}"
            half = (
                f"; the model runs in {str(tensor.dtype).removeprefix('torch.')}, whose range "
                "overflows easily: a likely cause (try suite.dtype = 'float32')"
                if tensor.dtype in (torch.float16, torch.bfloat16)
                else ""
            )
            raise ValueError(
                f"non-finite {what} (NaN or inf) at site {site!r}{at}: the checkpoint or the "
                f"input is broken{half}; nothing from this batch was accumulated"
            )


def _logits(lens: LensModel, x: Float[torch.Tensor, "n d_model"]) -> torch.Tensor:
    """Logits ``(n, d_vocab)`` of unembedding inputs ``x`` (see
    :meth:`~tangentlens.models.adapter.LensModel.logits`: ``x W_U + b_U``, soft-capped, in float32
    at least)."""
    return lens.logits(x)


def _written_loss(
    lens: LensModel, x: Float[torch.Tensor, "n d_model"], targets: Int[torch.Tensor, " n"]
) -> tuple[torch.Tensor, Float[torch.Tensor, "n d_model"]]:
    """Summed cross-entropy of rows ``x`` against ``targets`` and ``∂loss/∂x``, written out on
    one logits buffer (:attr:`LensModel.plain_logits` models: float32 or float64):
    ``z = x W_U + b_U``; ``loss = Σ (log Σ exp z − z_target)``; the buffer becomes
    ``softmax(z) − one-hot`` in place; ``∂loss/∂x = (p − y) W_Uᵀ``. No autograd graph and no
    log-probabilities or logits gradient beside the buffer."""
    z = _logits(lens, x)  # plain: the product itself, no cast or cap
    rows = torch.arange(targets.shape[0], device=z.device)
    picked = z[rows, targets]
    top = z.amax(dim=1, keepdim=True)
    z.sub_(top).exp_()
    sums = z.sum(dim=1, keepdim=True)
    loss = (sums.log() + top).squeeze(1).sub(picked).sum()
    z.div_(sums)
    z[rows, targets] -= 1
    return loss, z @ lens.unembedding()[0].T


def _chunked_loss(
    lens: LensModel,
    head_in: HeadInput,
    labels: Int[torch.Tensor, "batch pos"],
    scored: Int[torch.Tensor, " n"],
) -> tuple[torch.Tensor, HeadInput | None]:
    """Summed cross-entropy of the scored positions (``scored``: their flat indices on the
    device, made on the host), a chunk of at most ``loss_chunk_rows(d_vocab)`` positions at a
    time; returns ``(loss, ∂loss/∂head_in)``, the loss a float64 0-d tensor on the device (read
    with the batch's other scalars), the gradient None unless ``head_in`` requires one (written
    out where the logits are plain: :func:`_written_loss`; through autograd otherwise:
    half-precision weights cast to float32, a soft cap)."""
    flat = head_in.detach().reshape(-1, head_in.shape[-1])
    targets = labels.reshape(-1)
    rows = loss_chunk_rows(lens.d_vocab_out)
    grad = torch.zeros_like(flat) if head_in.requires_grad else None
    written = grad is not None and lens.plain_logits
    total = torch.zeros((), dtype=torch.float64, device=flat.device)
    for index in scored.split(rows):
        x = flat[index]  # a leaf: each chunk's graph ends here
        if written:
            loss, chunk_grad = _written_loss(lens, x, targets[index])
            grad.index_copy_(0, index, chunk_grad)  # type: ignore[union-attr]
            total += loss.double()
            continue
        if grad is not None:
            x.requires_grad_(True)
        loss = torch.nn.functional.cross_entropy(_logits(lens, x), targets[index], reduction="sum")
        if grad is not None:
            grad.index_copy_(0, index, torch.autograd.grad(loss, x)[0])
        total += loss.detach().double()
    return total, None if grad is None else grad.view_as(head_in)


def _inputs_and_labels(
    tokens: Tokens,
    config: CaptureConfig,
    special: SpecialTokens,
    vocab_size: int,
    first_sequence: int,
) -> tuple[Tokens, Int[torch.Tensor, "batch pos"]]:
    if config.loss != "mlm":  # next_token; "none" scores nothing
        labels = torch.full_like(tokens, IGNORE_INDEX)
        if config.loss == "next_token":
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
        for i, row in enumerate(tokens)
    ]
    return torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs])


def capture_batch(
    model: torch.nn.Module | LensModel,
    tokens: Tokens,
    config: CaptureConfig,
    special: SpecialTokens,
    *,
    first_sequence: int = 0,
    step: int | None = None,
    precision: str = "float64",
) -> CapturedBatch:
    """Capture ``config.sites`` (and attention) for one ``(batch, pos)`` token batch.

    ``model`` is a TransformerLens ``HookedTransformer``, ``HookedEncoder`` or
    ``TransformerBridge`` (or its :class:`~tangentlens.models.adapter.LensModel`);
    ``first_sequence`` is the stream index of the batch's first row (it seeds the masked-LM
    corruption); ``step`` only names the checkpoint in error messages; ``precision``: of the
    attention entropy's per-row sums (:class:`~tangentlens.capture.AttentionStatistics`).
    Non-finite activations or gradients raise ``ValueError`` naming the site and step.
    """
    from tangentlens.models.lens import lens_model

    lens = lens_model(model)
    shape_ok = isinstance(tokens, torch.Tensor) and tokens.ndim == 2
    if not shape_ok or tokens.shape[0] < 1 or tokens.shape[1] < 2:
        raise ValueError(
            "tokens must be a (batch, pos) integer tensor with batch ≥ 1 and pos ≥ 2, got "
            f"{type(tokens).__name__} {tuple(getattr(tokens, 'shape', ()))}"
        )
    _check_sites(lens, config.sites)
    vocab_size = lens.d_vocab
    host = tokens.cpu()  # the batches come from the host: checks and bookkeeping stay there
    if int(host.min()) < 0 or int(host.max()) >= vocab_size:
        raise ValueError(
            f"token ids must lie in [0, {vocab_size}) (the model's vocabulary), got "
            f"[{int(host.min())}, {int(host.max())}]"
        )
    # the masks and the masked-LM corruption are made on the host, where the batches come
    # from, and go to the device once; kept positions come from the original tokens (an MLM
    # [MASK] or random input is kept)
    inputs, labels = _inputs_and_labels(host, config, special, vocab_size, first_sequence)
    masks = analysis_mask(host, special, causal=config.causal, policy=config.mask_policy)
    kept = torch.nonzero(masks.keep.reshape(-1)).squeeze(1)
    scored = torch.nonzero(labels.reshape(-1) != IGNORE_INDEX).squeeze(1)
    n_kept = len(kept)
    device = lens.device
    tokens, inputs, labels, keep, kept, scored = upload_many(
        [host, inputs, labels, masks.keep, kept, scored], device
    )
    keep = keep.bool()
    attention_names = _attention_names(lens, config.attention_layers)
    site_set = set(config.sites)
    activations: dict[str, torch.Tensor] = {}
    attention = {  # made here, not in the hooks: they must not be inference tensors
        layer: AttentionStatistics(lens.n_heads, lens.d_head, tokens.device, precision)
        for layer in sorted(config.attention_layers)
    }

    def recorder(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
        def record(tensor: torch.Tensor) -> torch.Tensor:
            if name in attention_names:  # reduced here: nothing of the layer is kept
                layer, kind = attention_names[name]
                attention[layer].update(kind, tensor.detach(), keep, kept=kept, n_kept=n_kept)
            if name in site_set:
                if config.gradients and not tensor.requires_grad:
                    tensor = tensor.detach().requires_grad_(True)
                activations[name] = tensor
            return tensor

        return record

    hooks = {name: recorder(name) for name in sorted(site_set | set(attention_names))}
    loss = torch.full((), math.nan, dtype=torch.float64, device=device)
    n_scored = 0
    with frozen_parameters(lens.module), lens.hooks(hooks):
        if config.gradients:
            with torch.enable_grad():
                head_in = lens.head_input(inputs, config.loss)
                _check_reached(activations, config)
                loss, grad_head = _chunked_loss(lens, head_in, labels, scored)
                n_scored = len(scored)
                site_tensors = [activations[s] for s in config.sites]
                grads = (
                    torch.autograd.grad(
                        head_in, site_tensors, grad_outputs=grad_head, allow_unused=True
                    )
                    if grad_head is not None and site_tensors
                    else [None] * len(site_tensors)
                )
                del head_in, grad_head
        else:
            with torch.inference_mode():
                head_in = lens.head_input(inputs, config.loss)
                _check_reached(activations, config)
                if config.scores:
                    loss, _ = _chunked_loss(lens, head_in, labels, scored)
                    n_scored = len(scored)
                del head_in
            grads = ()
    gradients = {
        s: torch.zeros_like(activations[s]) if g is None else g
        for s, g in zip(config.sites, grads, strict=False)  # no gradients: grads is empty
    }
    activations = {s: activations[s].detach() for s in config.sites}
    # the batch's one wait: the loss and a finiteness sum per site tensor, read together
    sums = [loss, *finite_sums(activations.values()), *finite_sums(gradients.values())]
    read = torch.stack([t.to(device, torch.float64) for t in sums]).tolist()
    value, n = read[0], len(activations)
    _finite_or_raise(activations, read[1 : 1 + n], "activations", step)
    _finite_or_raise(gradients, read[1 + n :], "gradients", step)
    if config.scores and not math.isfinite(value):
        at = "" if step is None else f" at step {step}"
        raise ValueError(f"the loss is not finite{at} ({value}): the checkpoint is broken")
    return CapturedBatch(
        tokens=tokens,
        inputs=inputs,
        scored=labels != IGNORE_INDEX,
        keep=keep,
        host_keep=masks.keep,
        kept=kept,
        excluded=dict(masks.excluded),
        activations=activations,
        gradients=gradients,
        attention=attention,
        loss=value,
        n_scored=n_scored,
    )
