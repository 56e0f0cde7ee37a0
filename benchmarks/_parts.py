"""The GPU benchmark's parts: which run, in which order, and which fit a time budget (no
model library imported: :mod:`benchmarks.bench_gpu` runs them)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "H100_SECONDS",
    "PARTS",
    "RECIPES",
    "SMALLEST",
    "Budget",
    "Part",
    "check_choices",
    "ordered_parts",
]

#: Model → the recipe its sweep runs and the hub suite its prediction is for.
RECIPES = {"pythia-160m": "pythia_160m", "pythia-1b": "pythia_1b"}
#: The parts, in the order they run.
PARTS: tuple[str, ...] = ("capture", "step", "memory", "suite")
#: The smallest shape, standing for both models on the CPU (``--device cpu --quick``).
SMALLEST = "pythia-14m"
#: Estimated seconds of each part on one H100, by model (see :mod:`benchmarks.bench_gpu`):
#: capture = model build, warm-up and the timed passes of both paths in two dtypes; step = the
#: one-step sweep (data, 8 window captures, the fit, the step) and the paired reruns; memory
#: and suite alone = a one-step sweep without pairs (0 when the step part's is at hand).
H100_SECONDS: dict[tuple[str, str], float] = {
    ("capture", "pythia-160m"): 45.0,
    ("step", "pythia-160m"): 200.0,
    ("memory", "pythia-160m"): 90.0,
    ("suite", "pythia-160m"): 90.0,
    ("capture", "pythia-1b"): 150.0,
    ("step", "pythia-1b"): 235.0,
    ("memory", "pythia-1b"): 120.0,
    ("suite", "pythia-1b"): 120.0,
}


@dataclass(frozen=True)
class Part:
    """One part to run: its ``name`` (one of :data:`PARTS`), the ``model`` it stands for and
    the ``shape`` actually measured (the model itself on a GPU, :data:`SMALLEST` on the CPU)."""

    name: str
    model: str
    shape: str

    @property
    def label(self) -> str:
        return f"{self.name} {self.shape}"


def check_choices(parts: tuple[str, ...], models: tuple[str, ...]) -> None:
    """A ``ValueError`` naming the allowed parts or models when one given is not one."""
    for what, given, allowed in (("part", parts, PARTS), ("model", models, tuple(RECIPES))):
        unknown = [g for g in given if g not in allowed]
        if unknown:
            raise ValueError(f"unknown {what}(s) {unknown}; allowed: {list(allowed)}")


def ordered_parts(
    parts: tuple[str, ...] | None, models: tuple[str, ...] | None, device: str
) -> list[Part]:
    """The parts to run, model by model (pythia-160m first), in :data:`PARTS` order; on the CPU
    the smallest shape stands for every model and runs once."""
    parts, models = parts or PARTS, models or tuple(RECIPES)
    check_choices(parts, models)
    on_gpu = device.startswith("cuda")
    out: list[Part] = []
    seen: set[tuple[str, str]] = set()
    for model in (m for m in RECIPES if m in models):
        shape = model if on_gpu else SMALLEST
        for name in (p for p in PARTS if p in parts):
            if (name, shape) not in seen:
                seen.add((name, shape))
                out.append(Part(name, model, shape))
    return out


class Budget:
    """Which parts fit ``seconds`` (None: every part): a part runs while its estimate —
    :data:`H100_SECONDS` scaled by the first measured part's time over its own estimate —
    fits what is left."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.spent = 0.0
        self.scale: float | None = None

    def estimate(self, part: Part, reused: bool) -> float:
        """Seconds ``part`` should take here (0 for memory and suite reusing the step's)."""
        if reused:
            return 0.0
        return H100_SECONDS[(part.name, part.model)] * (self.scale or 1.0)

    def refusal(self, part: Part, reused: bool) -> str | None:
        """Why ``part`` is skipped (None: it runs)."""
        if self.seconds is None:
            return None
        estimate, left = self.estimate(part, reused), self.seconds - self.spent
        if estimate <= left:
            return None
        return f"estimated {estimate:.0f} s, {max(left, 0):.0f} s of --budget-s left"

    def record(self, part: Part, reused: bool, seconds: float) -> None:
        """``part`` took ``seconds``: spent, and the first one sets the scale."""
        self.spent += seconds
        if self.scale is None and not reused:
            self.scale = seconds / H100_SECONDS[(part.name, part.model)]
