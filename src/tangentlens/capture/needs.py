"""What a probe needs from the capture of a step (:class:`Needs`); light, so a recipe and a plan
read it without torch."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Needs"]


@dataclass(frozen=True)
class Needs:
    """What a probe needs from the capture of a step.

    ``gradients``: per-token gradients; ``bins``: frequency bins (per-bin first moments and the
    reservoir's bin column); ``bin_moments``: the d × d second moment of the gradients per bin
    (needs ``bins``); ``type_sums``: per-type centroid sums (of the types the probe names, see
    ``tracked_types`` of frequency_geometry and update_alignment); ``reservoir``: sampled rows;
    ``attention``: per-head query, key and attention-entropy sums.
    """

    gradients: bool = False
    bins: bool = False
    bin_moments: bool = False
    type_sums: bool = False
    reservoir: bool = False
    attention: bool = False

    def __post_init__(self) -> None:
        if self.bin_moments and not (self.bins and self.gradients):
            raise ValueError(
                "bin_moments are per-bin gradient moments: they need bins=True and gradients=True"
            )

    def missing(self, wanted: Needs) -> list[str]:
        """The fields ``wanted`` needs and this does not hold."""
        return [f for f in self.__dataclass_fields__ if getattr(wanted, f) and not getattr(self, f)]

    def union(self, other: Needs) -> Needs:
        return Needs(
            **{
                name: getattr(self, name) or getattr(other, name)
                for name in self.__dataclass_fields__
            }
        )
