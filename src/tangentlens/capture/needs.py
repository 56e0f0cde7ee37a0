"""What a probe needs from the capture of a step (:class:`Needs`); light, so a recipe and a plan
read it without torch."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SERVED", "Needs"]

#: What the engine serves where it can, beside what a capture keeps: no capture is refused
#: for lacking them.
SERVED: tuple[str, ...] = ("sequence_sums", "replicates")


@dataclass(frozen=True)
class Needs:
    """What a probe needs from the capture of a step.

    ``gradients``: per-token gradients; ``bins``: frequency bins (per-bin first moments and the
    reservoir's bin column); ``bin_moments``: the d × d second moment of the gradients per bin
    (needs ``bins``); ``type_sums``: per-type centroid sums (of the types the probe names, see
    the probe's ``tracked_types``); ``reservoir``: sampled rows; ``attention``: per-head
    query, key and attention-entropy sums.

    Two requests the engine serves where it can (:data:`SERVED`; a capture that cannot serve
    them is not refused for it): ``sequence_sums``: per-sequence gradient energy sums of the
    proxies, gathered during the capture when the proxies are known before it (fit policy
    ``frozen_early``; needs ``gradients``), so that intervals resample every analysed sequence;
    ``replicates``: a sweep keeps the bootstrap replicates the probe puts in
    ``StepInputs.replicates`` (``replicates/<unit>.parquet``, read by ``tangentlens compare``).
    """

    gradients: bool = False
    bins: bool = False
    bin_moments: bool = False
    type_sums: bool = False
    reservoir: bool = False
    attention: bool = False
    sequence_sums: bool = False
    replicates: bool = False

    def __post_init__(self) -> None:
        if self.bin_moments and not (self.bins and self.gradients):
            raise ValueError(
                "bin_moments are per-bin gradient moments: they need bins=True and gradients=True"
            )
        if self.sequence_sums and not self.gradients:
            raise ValueError("sequence_sums are sums of gradients: they need gradients=True")

    def missing(self, wanted: Needs) -> list[str]:
        """The fields ``wanted`` needs and this does not hold (the requests of :data:`SERVED`
        aside)."""
        return [
            f
            for f in self.__dataclass_fields__
            if f not in SERVED and getattr(wanted, f) and not getattr(self, f)
        ]

    def union(self, other: Needs) -> Needs:
        return Needs(
            **{
                name: getattr(self, name) or getattr(other, name)
                for name in self.__dataclass_fields__
            }
        )
