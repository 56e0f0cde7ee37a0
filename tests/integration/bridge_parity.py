"""The tolerances within which a table measured through TransformerLens' ``TransformerBridge``
equals the one measured through ``HookedTransformer`` / ``HookedEncoder`` (same checkpoint, tokens
and settings, both loaders in float64), and the row-by-row comparison the parity tests make.

Why float64: the two loaders run the same weights through different code — the bridge runs the
Hugging Face modules (eager attention, forced by the bridge; torch's LayerNorm; the fused QKV
projection split per head), the hooked path TransformerLens' einsums. In float32 their
activations differ by float32 rounding in another order (~1e-7 relative), which a semi-NMF fit
amplifies by degrees (it stops in a flat valley) and nearest-neighbour statistics turn into
swaps; no tolerance measured on one CPU bounds that on another (issue 40). In float64 the
activations differ by float64 rounding, ≲ 1e-12 of their scale
(:data:`tests.numerics.FLOAT64_PARITY`; the parts Hugging Face computes in float32 in any dtype
run in float64: :func:`tests.numerics.hugging_face_in_float64`,
:func:`tests.numerics.share_rotary_tables`).

Classes (``|a − b| ≤ atol + rtol·|a|``):

* ``exact`` — counts (kept tokens, excluded positions) and every row's ``n_tokens``: equal
  (the token masks do not depend on the loader);
* ``moments`` — every row computed in closed form from the float64 moments (moments, PCA and
  mean-direction proxies with their controls, z-scores and p-values, attention, drift,
  IsoScore, cosine anisotropy): ``1e-12 + 1e-9·|a|``. The moments are float64 sums of
  activations that agree to ~1e-13 of their scale; the rows are ratios, square roots and
  eigen-decompositions of them (Weyl: an eigenvalue moves by at most ‖ΔC‖₂; the proxies' and
  controls' subspaces by ‖ΔC‖/gap, Davis–Kahan, with gaps far above 1e-9 here) — so they
  agree to ~1e-13 relative (worst seen: 3.5e-14), 1e-9 leaves four orders of magnitude. A
  p-value is a count of controls at or above the observed statistic: it moves only if a control
  lies within ~1e-13 of it (never seen; the controls' spread is ~1e-2);
* ``sampled`` — every row that reads the float32 row sample (the reservoir: TwoNN, curvature
  visibility, the frequency statistics and their nulls) or a semi-NMF fit of it (``method``
  naming ``seminmf``: energies, angles, fit quality, the convergence flag): the same
  tolerance, compared when the two captures' float32 row samples and semi-NMF's float32 inputs
  are bit for bit equal (:class:`SampleRecorder`) — then both tables compute these rows with
  the same float32 arithmetic from the same data, plus float64 moments. The samples are float32
  copies of float64 activations that agree to ~1e-13: they are equal except where an
  activation lies that close to a float32 rounding boundary (≈ 2⁻²⁹ of the entries, so about
  one table in a thousand); then they differ by one float32 unit in the last place — checked —
  and these rows are not compared, because semi-NMF's stopping point and a nearest-neighbour
  near-tie move by more than any rounding bound for a last-bit change of their input.
"""

from __future__ import annotations

import collections
import hashlib
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pytest
import torch

from tangentlens.capture.reservoir import RowReservoir
from tangentlens.dictionaries.seminmf import SemiNMF

TOLERANCES: dict[str, tuple[float, float]] = {
    "exact": (0.0, 0.0),
    "moments": (1e-12, 1e-9),
    "sampled": (1e-12, 1e-9),  # compared when the samples are equal (SampleRecorder)
}
_SAMPLED = (
    "twonn_dimension",
    "freq_distance_spearman",
    "curvature_visibility",
    "seminmf_",
)
#: The fields every row carries besides its key: compared with the row's tolerance.
VALUES = ("value", "ci_low", "ci_high")


def tolerance_class(row: Mapping[str, Any]) -> str:
    """The tolerance class of a result row (see the module docstring)."""
    metric, method = row["metric"], row["method"] or ""
    if metric.startswith("excluded_") or metric == "n_tokens":
        return "exact"
    if "seminmf" in method or metric.startswith(_SAMPLED):
        return "sampled"
    return "moments"


def within(a: Any, b: Any, row: Mapping[str, Any]) -> bool:
    """Whether values ``a`` (hooked) and ``b`` (bridge) of ``row`` agree within its class."""
    if a is None or b is None:
        return a is None and b is None
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    atol, rtol = TOLERANCES[tolerance_class(row)]
    return abs(a - b) <= atol + rtol * abs(a)


def keyed(
    rows: Iterable[Mapping[str, Any]], site_key: Callable[[str], Any]
) -> dict[tuple, Mapping[str, Any]]:
    """Rows by ``(site_key(site), probe, method, rank, freq_bin, metric, step)``; a key that
    occurs twice is an error. ``site_key`` maps a loader's hook name to what both loaders share
    (the site kind and block)."""
    out: dict[tuple, Mapping[str, Any]] = {}
    for r in rows:
        key = (
            site_key(r["site"]),
            r["probe"],
            r["method"],
            r["rank"],
            r["freq_bin"],
            r["metric"],
            r["step"],
        )
        if key in out:
            raise AssertionError(f"two rows share the key {key}")
        out[key] = r
    return out


def mismatches(
    hooked: Mapping[tuple, Mapping[str, Any]],
    bridge: Mapping[tuple, Mapping[str, Any]],
    *,
    sampled: bool = True,
) -> list[tuple]:
    """The keys of rows whose labels (``suite``, ``tokens_seen``, ``layer``, ``n_tokens``) differ
    or whose values fall outside their class's tolerance; the row sets must be identical.
    ``sampled``: compare the ``sampled`` class too (when :meth:`SampleRecorder.same` holds)."""
    assert hooked.keys() == bridge.keys(), set(hooked) ^ set(bridge)
    bad = []
    for key, a in hooked.items():
        b = bridge[key]
        labels = all(a[f] == b[f] for f in ("suite", "tokens_seen", "layer", "n_tokens"))
        if not labels:
            bad.append(key)
        elif tolerance_class(a) == "sampled" and not sampled:
            continue
        elif not all(within(a[f], b[f], a) for f in VALUES):
            bad.append(key)
    return bad


def _digest(t: torch.Tensor) -> tuple:
    return (t.dtype, tuple(t.shape), hashlib.sha256(t.numpy().tobytes()).hexdigest())


def _one_ulp_apart(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal, or one float32 unit in the last place apart, entry by entry."""
    return bool(((a == b) | (b == torch.nextafter(a, b))).all())


def _snapshot(t: torch.Tensor) -> torch.Tensor:
    """A host copy of ``t`` taken outside torch's dispatch: an emulated accelerator's tensor
    (:mod:`tangentlens.testing`) is read through its ``value``, so no transfer is recorded."""
    raw = getattr(t, "value", t)
    return torch.from_numpy(raw.detach().cpu().numpy().copy())


class SampleRecorder:
    """Records, per run, every float32 matrix offered to a row sample (the reservoir) and every
    semi-NMF input in its working precision — what the ``sampled`` rows are computed from.
    ``runs``: runs recorded earlier (e.g. by a module-scoped fixture) to compare with.

    >>> recorder = SampleRecorder(monkeypatch)
    >>> with recorder.run("hooked"): ...
    >>> with recorder.run("bridge"): ...
    >>> recorder.same("hooked", "bridge")  # bit for bit, as multisets
    """

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, runs: dict[str, list[torch.Tensor]] | None = None
    ) -> None:
        self.runs: dict[str, list[torch.Tensor]] = {} if runs is None else dict(runs)
        self._current: list[torch.Tensor] | None = None
        offer, prepare = RowReservoir.offer, SemiNMF._prepare

        def recording_offer(reservoir, rows, columns):  # RowReservoir.add offers too
            if self._current is not None:
                self._current.extend(
                    _snapshot(c) for c in columns.values() if c.is_floating_point()
                )
            return offer(reservoir, rows, columns)

        def recording_prepare(model, H):
            X = prepare(model, H)
            if self._current is not None:
                self._current.append(_snapshot(X))
            return X

        monkeypatch.setattr(RowReservoir, "offer", recording_offer)
        monkeypatch.setattr(SemiNMF, "_prepare", recording_prepare)

    def run(self, name: str) -> _Run:
        return _Run(self, name)

    def same(self, a: str, b: str) -> bool:
        """Whether runs ``a`` and ``b`` saw the same matrices bit for bit (in any order). When
        not, every matrix of one must be within one float32 unit in the last place of a matrix
        of the other (both paths agree to float64 rounding): asserted."""
        first, second = self.runs[a], self.runs[b]
        assert len(first) == len(second) > 0
        digests = collections.Counter(_digest(t) for t in second)
        unmatched = [t for t in first if not _take(digests, _digest(t))]
        if not unmatched:
            return True
        others = [t for t in second if _digest(t) not in {_digest(u) for u in first}]
        for t in unmatched:  # pair each with a matrix of the same shape one ulp away
            partner = next(
                (i for i, u in enumerate(others) if u.shape == t.shape and _one_ulp_apart(t, u)),
                None,
            )
            assert partner is not None, "a sampled matrix differs by more than one float32 ulp"
            others.pop(partner)
        return False


def _take(counter: collections.Counter, key: tuple) -> bool:
    if counter[key] > 0:
        counter[key] -= 1
        return True
    return False


class _Run:
    def __init__(self, recorder: SampleRecorder, name: str) -> None:
        self.recorder, self.name = recorder, name

    def __enter__(self) -> None:
        self.recorder._current = self.recorder.runs.setdefault(self.name, [])

    def __exit__(self, *exc: object) -> None:
        self.recorder._current = None
