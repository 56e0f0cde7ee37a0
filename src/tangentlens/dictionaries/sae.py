"""Sparse-autoencoder dictionaries through SAELens, trained on captured activations.

``SAE(rank, ...)`` trains a TopK (default) or standard (L1) SAE with SAELens' own ``SAETrainer``
on a sample of activations ``H`` (any iterator of batches is SAELens' data provider; ours cycles
through seeded shuffles of ``H``; no wandb, nothing saved unless asked). ``SAE.from_disk(path)``
loads an SAE saved in SAELens' format instead, ``SAE.from_pretrained(release, sae_id)`` a
published one from SAELens' pretrained registry (``sae_lens.SAE.from_pretrained``);
:meth:`SAE.check_target` checks a loaded SAE's model, hook and width against the activations it
is meant for.

The tangent proxy is spanned by decoder rows (``W_dec``, d_sae × d_in, normalised to unit norm):
by default the ``rank`` latents that fire most often on the sample (code > 0; ties broken by the
larger mean activation, then the lower index), or all latents with ``rank=None``. Frequency, not
mean activation, ranks them: it does not depend on how a latent's scale is split between encoder
and decoder (published SAEs differ there), and it favours directions many tokens use over rare
large activations. ``explained_variance_`` (``1 − ‖H − Ĥ‖² / ‖H − mean‖²``) and ``l0_`` (mean
number of active latents per row) are measured on the sample.

SAELens initialises weights from torch's global generator; training runs inside
``torch.random.fork_rng`` seeded with ``seed``, so results are reproducible and the caller's
global random state is left untouched.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from tangentlens.checks import check_choice, check_count, check_matrix
from tangentlens.dictionaries.base import check_fitted
from tangentlens.metrics.subspace import DEFAULT_RANK_RTOL, span_basis
from tangentlens.seeding import seeded_generator
from tangentlens.typing import Activations, ArrayLike, Basis, Codes

__all__ = [
    "SAE",
    "SAE_ARCHITECTURES",
    "check_pretrained",
    "pretrained_location",
    "pretrained_models",
]

#: SAE architectures :class:`SAE` trains: ``topk`` (the ``k`` largest latents per row) or
#: ``standard`` (ReLU + L1 penalty).
SAE_ARCHITECTURES: tuple[str, ...] = ("topk", "standard")


def _bare(model_name: str) -> str:
    """A model name without its organisation prefix, lower-cased."""
    return model_name.rstrip("/").rsplit("/", 1)[-1].lower()


def check_pretrained(release: str, sae_ids: Sequence[str]) -> None:
    """Check that ``release`` is in SAELens' pretrained registry and holds every id of
    ``sae_ids`` (nothing is downloaded)."""
    from sae_lens.loading.pretrained_saes_directory import get_pretrained_saes_directory

    directory = get_pretrained_saes_directory()
    if release not in directory:
        close = difflib.get_close_matches(release, list(directory), n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(
            f"{release!r} is not a release of SAELens' pretrained registry{hint}; see "
            "sae_lens.loading.pretrained_saes_directory.get_pretrained_saes_directory()"
        )
    known = list(directory[release].saes_map)
    for sae_id in sae_ids:
        if sae_id not in known:
            close = difflib.get_close_matches(sae_id, known, n=1, cutoff=0.5)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            listed = ", ".join(known[:8]) + (f", … ({len(known)} in all)" if len(known) > 8 else "")
            raise ValueError(
                f"release {release!r} has no SAE id {sae_id!r}{hint}; its ids: {listed}"
            )


def pretrained_location(release: str, sae_id: str) -> tuple[str, str]:
    """``(repository, folder)``: where on the Hugging Face hub SAELens reads SAE ``sae_id`` of
    ``release`` from (its pretrained registry; nothing is downloaded)."""
    from sae_lens.loading.pretrained_saes_directory import get_pretrained_saes_directory

    check_pretrained(release, [sae_id])
    lookup = get_pretrained_saes_directory()[release]
    return lookup.repo_id, lookup.saes_map[sae_id]


def pretrained_models() -> dict[str, str]:
    """Release → the model its SAEs were trained on, as SAELens' pretrained registry names it
    (a TransformerLens name or alias: ``pythia-70m-deduped``, ``gpt2-small``; read offline from
    the registry SAELens ships)."""
    from sae_lens.loading.pretrained_saes_directory import get_pretrained_saes_directory

    return {release: entry.model for release, entry in get_pretrained_saes_directory().items()}


def _shuffled_batches(H: torch.Tensor, batch_size: int, seed: int) -> Iterator[torch.Tensor]:
    """Endless seeded reshuffles of the rows of ``H``, ``batch_size`` rows at a time (the order
    drawn on the host: the same batches on every device)."""
    gen = seeded_generator(seed, 0x5AE)
    while True:
        order = torch.randperm(H.shape[0], generator=gen).to(H.device)
        for start in range(0, H.shape[0] - batch_size + 1, batch_size):
            yield H[order[start : start + batch_size]]


class SAE:
    """SAE dictionary (SAELens) whose top-``rank`` decoder directions span the proxy.

    Args:
        rank: latents whose decoder rows span the proxy (the most frequently active); ``None``
            keeps every latent.
        architecture: ``"topk"`` (default) or ``"standard"`` (ReLU + L1 penalty).
        d_sae: number of latents (default ``8 × d``).
        k: active latents per row for TopK.
        l1_coefficient: sparsity penalty of the standard SAE.
        training_samples: activation rows seen in training (the sample is cycled).
        batch_size: rows per training step.
        lr: Adam learning rate (constant).
        seed: seeds initialisation and data order.
    """

    def __init__(
        self,
        rank: int | None,
        *,
        architecture: str = "topk",
        d_sae: int | None = None,
        k: int = 16,
        l1_coefficient: float = 5.0,
        training_samples: int = 200_000,
        batch_size: int = 1024,
        lr: float = 3e-4,
        seed: int = 0,
    ) -> None:
        if rank is not None:
            check_count(rank, "rank", minimum=1)
        self.rank = rank
        self.architecture = check_choice(architecture, "architecture", SAE_ARCHITECTURES)
        self.d_sae = None if d_sae is None else check_count(d_sae, "d_sae", minimum=1)
        self.k = check_count(k, "k", minimum=1)
        self.l1_coefficient = float(l1_coefficient)
        self.training_samples = check_count(training_samples, "training_samples", minimum=1)
        self.batch_size = check_count(batch_size, "batch_size", minimum=1)
        self.lr = float(lr)
        self.seed = check_count(seed, "seed", minimum=0)

    # ------------------------------------------------------------------ building

    def _training_sae(self, d_in: int, d_sae: int) -> torch.nn.Module:
        from sae_lens import (
            StandardTrainingSAE,
            StandardTrainingSAEConfig,
            TopKTrainingSAE,
            TopKTrainingSAEConfig,
        )

        if self.architecture == "topk":
            if self.k > d_sae:
                raise ValueError(f"k must be ≤ d_sae = {d_sae}, got {self.k}")
            return TopKTrainingSAE(TopKTrainingSAEConfig(d_in=d_in, d_sae=d_sae, k=self.k))
        cfg = StandardTrainingSAEConfig(d_in=d_in, d_sae=d_sae, l1_coefficient=self.l1_coefficient)
        return StandardTrainingSAE(cfg)

    def fit(self, H: ArrayLike) -> SAE:
        """Train on ``H`` (n × d, n ≥ batch_size), then pick the proxy latents."""
        from sae_lens import SAETrainer
        from sae_lens.config import SAETrainerConfig

        X = check_matrix(H, "H").to(torch.float32)
        n, d = X.shape
        if n < self.batch_size:
            raise ValueError(
                f"SAE training needs at least batch_size = {self.batch_size} rows, got {n}"
            )
        d_sae = self.d_sae or 8 * d
        self._check_rank(d, d_sae)
        trainer_cfg = SAETrainerConfig(
            total_training_samples=self.training_samples,
            train_batch_size_samples=self.batch_size,
            lr=self.lr,
            lr_end=self.lr,
            device=str(X.device),
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            # initialised on the host (the same weights on every device), then moved before the
            # trainer's optimizer binds to the parameters
            sae = self._training_sae(d, d_sae).to(X.device)
            data = _shuffled_batches(X, self.batch_size, self.seed)
            trainer = SAETrainer(cfg=trainer_cfg, sae=sae, data_provider=data)
            self.sae_ = _quiet_fit(trainer)
        self.source_ = "the SAE trained on H"
        return self._measure(X)

    @classmethod
    def from_disk(
        cls, path: str | Path, rank: int | None = None, device: torch.device | str = "cpu"
    ) -> SAE:
        """Load an SAE saved by SAELens (``cfg.json`` + weights) from ``path`` onto ``device``
        (where the activations it reads are); then call :meth:`measure` with the site's
        activations to check its width and pick the latents."""
        import sae_lens

        folder = Path(path)
        if not (folder / "cfg.json").is_file():
            raise ValueError(f"{folder} is not an SAELens SAE folder (no cfg.json)")
        dictionary = cls(rank)
        dictionary.sae_ = sae_lens.SAE.load_from_disk(str(folder), device=str(device))
        dictionary.source_ = f"the SAE at {folder}"
        return dictionary

    @classmethod
    def from_pretrained(
        cls,
        release: str,
        sae_id: str,
        rank: int | None = None,
        device: torch.device | str = "cpu",
    ) -> SAE:
        """Load the SAE ``sae_id`` of ``release`` from SAELens' pretrained registry through
        ``sae_lens.SAE.from_pretrained`` (the Hugging Face cache, the hub when online; onto
        ``device`` in float32); then :meth:`check_target` it and :meth:`measure` it on the
        site's activations."""
        import sae_lens

        check_pretrained(release, [sae_id])
        dictionary = cls(rank)
        dictionary.sae_ = sae_lens.SAE.from_pretrained(release, sae_id, device=str(device))
        dictionary.source_ = f"SAE {sae_id!r} of release {release!r}"
        return dictionary

    @classmethod
    def from_sae_lens(cls, sae: object, rank: int | None = None) -> SAE:
        """Wrap an SAELens ``SAE`` already in memory (loaded or trained by the caller, on any
        device); then :meth:`measure` it on the site's activations to pick the latents by the
        same rule as for the SAEs tangentlens trains."""
        import sae_lens

        if not isinstance(sae, sae_lens.SAE):
            raise ValueError(
                f"expected an SAELens SAE (an instance of sae_lens.SAE), got {type(sae).__name__}"
            )
        dictionary = cls(rank)
        dictionary.sae_ = sae
        hook = sae.cfg.metadata.hook_name
        dictionary.source_ = f"the SAELens {type(sae).__name__}" + (
            f" of hook {hook!r}" if hook else ""
        )
        return dictionary

    @property
    def d_in(self) -> int:
        _check_fitted(self)
        return int(self.sae_.cfg.d_in)

    @property
    def hook_name(self) -> str | None:
        """The TransformerLens hook the SAE was trained on (SAELens' ``cfg.metadata``)."""
        _check_fitted(self)
        return self.sae_.cfg.metadata.hook_name

    @property
    def model_name(self) -> str | None:
        """The model the SAE was trained on (SAELens' ``cfg.metadata``)."""
        _check_fitted(self)
        return self.sae_.cfg.metadata.model_name

    def check_target(self, sites: Mapping[str, int], model_name: str | None) -> str:
        """The site a loaded SAE reads, after checking it against the model: its model name, when
        it and ``model_name`` are known, must be ``model_name`` (compared without organisation
        prefix, ignoring case), its hook one of ``sites`` (hook name → width of every captured
        site), read whole (no head index), and its ``d_in`` that site's width."""
        trained_on = self.model_name
        if None not in (trained_on, model_name) and _bare(trained_on) != _bare(model_name):
            raise ValueError(
                f"{self.source_} was trained on model {trained_on!r}, but the model measured is "
                f"{model_name!r}"
            )
        hook = self.hook_name
        if hook not in sites or self.sae_.cfg.metadata.hook_head_index is not None:
            raise ValueError(
                f"{self.source_} reads hook {hook!r}, which is not a captured site; captured: "
                f"{sorted(sites)} (see the capture's sites and layers)"
            )
        if self.d_in != sites[hook]:
            raise ValueError(
                f"{self.source_} reads d_in = {self.d_in}, but site {hook!r} has width "
                f"{sites[hook]}"
            )
        return hook

    def measure(self, H: ArrayLike) -> SAE:
        """For a loaded SAE: check ``H``'s width against ``d_in``, pick the proxy latents and
        measure explained variance and L0 on ``H``."""
        _check_fitted(self)
        X = check_matrix(H, "H").to(torch.float32)
        if X.shape[1] != self.d_in:
            raise ValueError(
                f"the SAE reads d_in = {self.d_in} but these activations have width {X.shape[1]}: "
                "it was trained for another site or model"
            )
        return self._measure(X)

    def _check_rank(self, d: int, d_sae: int) -> None:
        if self.rank is not None and not self.rank < min(d, d_sae + 1):
            raise ValueError(
                f"rank must be an integer in [1, {min(d - 1, d_sae)}], got {self.rank}"
            )

    def _measure(self, X: torch.Tensor) -> SAE:
        """Explained variance, L0 and the proxy latents on ``X``, on the SAE's device (a loaded
        SAE's device; ``X`` goes there)."""
        self._check_rank(X.shape[1], int(self.sae_.cfg.d_sae))
        weights = self.sae_.W_dec
        X = X.to(weights.device)
        with torch.no_grad():
            codes = self.sae_.encode(X.to(weights.dtype))
            recon = self.sae_.decode(codes).float()
            codes = codes.float()
        centred = (X - X.mean(dim=0)).double().pow(2).sum()
        self.explained_variance_ = float(1 - (X - recon).double().pow(2).sum() / centred)
        active = codes > 0
        self.l0_ = float(active.sum(dim=1).double().mean())
        frequency = active.double().mean(dim=0)
        mean_act = codes.double().mean(dim=0)
        # the ranking on the host: two vectors of d_sae entries
        order = np.lexsort((-mean_act.cpu().numpy(), -frequency.cpu().numpy()))  # frequency first
        n_latents = codes.shape[1] if self.rank is None else self.rank
        self.latents_ = torch.from_numpy(np.sort(order[:n_latents]))
        self.latent_frequency_ = frequency
        return self

    # ------------------------------------------------------------------ use

    @property
    def directions(self) -> torch.Tensor:
        """Unit-norm decoder rows of the proxy latents (r × d), float64."""
        _check_fitted(self)
        if not hasattr(self, "latents_"):
            raise ValueError("no latents selected yet: call fit(H), or measure(H) after loading")
        rows = self.sae_.W_dec.detach()[self.latents_].double()
        return rows / rows.norm(dim=1, keepdim=True).clamp(min=1e-30)

    @property
    def effective_rank_(self) -> int:
        return span_basis(self.directions, DEFAULT_RANK_RTOL).shape[1]

    def encode(self, H: ArrayLike) -> Codes:
        """All latent activations (n × d_sae)."""
        _check_fitted(self)
        with torch.no_grad():
            return self.sae_.encode(check_matrix(H, "H").to(torch.float32))

    def decode(self, Z: ArrayLike) -> Activations:
        """Reconstruction from latent activations (n × d)."""
        _check_fitted(self)
        with torch.no_grad():
            return self.sae_.decode(check_matrix(Z, "Z").to(torch.float32))

    def basis(self) -> Basis:
        """Orthonormal basis (d × r) of the proxy latents' decoder directions."""
        Q = span_basis(self.directions, DEFAULT_RANK_RTOL)
        wanted = self.directions.shape[0]
        if Q.shape[1] < wanted:
            raise ValueError(
                f"the {wanted} selected SAE directions span only {Q.shape[1]} dimensions (the "
                "effective rank collapsed); choose a smaller rank"
            )
        return Q


def _quiet_fit(trainer: object) -> torch.nn.Module:
    """Run ``trainer.fit()`` without SAELens' tqdm bar (it writes to stderr)."""
    import tqdm.auto

    original = tqdm.auto.tqdm

    def silent(*args: object, **kwargs: object) -> object:
        return original(*args, **{**kwargs, "disable": True})

    import sae_lens.training.sae_trainer as module

    module.tqdm = silent  # type: ignore[attr-defined]
    try:
        return trainer.fit()  # type: ignore[attr-defined]
    finally:
        module.tqdm = original  # type: ignore[attr-defined]


def _check_fitted(sae: SAE) -> None:
    check_fitted(sae, "fit(H), SAE.from_disk or SAE.from_pretrained", "sae_")
