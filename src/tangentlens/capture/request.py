"""What one capture keeps, resolved once (:class:`CaptureRequest`): from what the probes declared
they need (:class:`~tangentlens.capture.needs.Needs`) and the recipe's settings, by
:func:`tangentlens.core.resolve.resolve`. The capture builds its statistics from it
(:meth:`CaptureRequest.statistics`), the memory plan multiplies out the same fields, and the
capture records what it kept (``Capture.kept``). Light: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tangentlens.capture.needs import Needs
from tangentlens.checks import check_count

if TYPE_CHECKING:
    from tangentlens.capture.accumulators import StatisticsConfig
    from tangentlens.capture.sequence_energy import SequenceEnergyConfig

__all__ = ["CaptureRequest"]


@dataclass(frozen=True)
class CaptureRequest:
    """One capture's request.

    ``needs``: what it keeps — the union of the probes' needs (and the sampled rows a proxy fit
    reads); ``n_bins``: frequency bins kept (0 without ``needs.bins``); ``reservoir``: rows
    sampled per site (0 without ``needs.reservoir``); ``type_limit``: at most how many token
    types get per-type sums (the probes' ``max_tracked_types`` added up; 0 without
    ``needs.type_sums``; the types themselves are named from the analysis data's counts);
    ``sequence_sums``: per-sequence gradient energy sums of proxies known before the capture
    (a probe needs them and the proxies are frozen early); ``seed``: of the reservoir's
    sampling and the masked-LM masking.

    >>> CaptureRequest(Needs(reservoir=True), reservoir=512).kept == Needs(reservoir=True)
    True
    """

    needs: Needs
    n_bins: int = 0
    reservoir: int = 0
    type_limit: int = 0
    sequence_sums: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("n_bins", "reservoir", "type_limit", "seed"):
            check_count(getattr(self, name), name, minimum=0)
        for wanted, count, name in (
            (self.needs.bins, self.n_bins, "n_bins"),
            (self.needs.reservoir, self.reservoir, "reservoir"),
        ):
            if not wanted and count:
                kept = name.removeprefix("n_")
                raise ValueError(f"{name} = {count} but the needs keep no {kept}")
        if self.sequence_sums and not self.needs.gradients:
            raise ValueError("sequence_sums sum gradients: the needs must keep gradients")

    @property
    def gradients(self) -> bool:
        """Whether the capture runs a backward (per-token gradients)."""
        return self.needs.gradients

    @property
    def kept(self) -> Needs:
        """What the capture holds for the probes: ``needs`` less what it could not keep (bins
        at ``n_bins`` 0, sampled rows at ``reservoir`` 0) and the requests it serves where it
        can (per-sequence sums, replicates)."""
        needs = self.needs
        bins = needs.bins and self.n_bins > 0
        return Needs(
            gradients=needs.gradients,
            bins=bins,
            bin_moments=bins and needs.bin_moments,
            type_sums=needs.type_sums,
            reservoir=needs.reservoir and self.reservoir > 0,
            attention=needs.attention,
        )

    def statistics(
        self,
        *,
        vocab_size: int | None,
        type_ids: tuple[int, ...] | None,
        sequence_energy: SequenceEnergyConfig | None,
        precision: str,
    ) -> StatisticsConfig:
        """The capture's :class:`~tangentlens.capture.StatisticsConfig`: ``vocab_size`` and
        ``type_ids`` name the per-type sums' types (with ``needs.type_sums``),
        ``sequence_energy`` the projectors of the per-sequence sums (with ``sequence_sums``)."""
        from tangentlens.capture.accumulators import StatisticsConfig

        if (sequence_energy is not None) != self.sequence_sums:
            raise ValueError(
                "sequence_energy projectors are given exactly when the request gathers "
                f"per-sequence sums (sequence_sums = {self.sequence_sums})"
            )
        kept = self.kept
        return StatisticsConfig(
            gradients=kept.gradients,
            n_bins=self.n_bins,
            gradient_bin_moments=kept.bin_moments,
            type_sums=kept.type_sums,
            vocab_size=vocab_size if kept.type_sums else None,
            type_ids=type_ids if kept.type_sums else None,
            reservoir_size=self.reservoir,
            seed=self.seed,
            sequence_energy=sequence_energy,
            precision=precision,
        )
