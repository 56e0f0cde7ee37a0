"""Proxies a researcher brings: a basis, a fitted tangentlens dictionary, or an SAELens SAE.

``proxies`` maps a method name (the ``method`` of its rows) to one of

* a **basis** — a d × k tensor or array whose columns span the proxy (any basis: it is
  orthonormalised by SVD, keeping singular values above ``rtol · σ_max``; the effective rank is
  the rows' ``rank``);
* a **fitted tangentlens dictionary** (``PCA``, ``SemiNMF``, ``SAE`` of
  :mod:`tangentlens.dictionaries`, anything with ``basis()``): its ``basis()``;
* an **SAELens SAE** (``sae_lens.SAE``, or a tangentlens ``SAE`` loaded with ``from_disk`` /
  ``from_pretrained``): the span of the decoder rows of its ``rank`` most frequently active
  latents on the capture's sampled activation rows of its site, raw as the SAE reads them — the
  rule of the SAEs tangentlens trains and of published SAEs in a sweep; its explained variance
  and L0 on those rows are reported;

or to a mapping ``{site: one of those}`` for a proxy per site. A basis or dictionary given
without sites applies to every captured site of its width; an SAE applies to its own hook.
Every proxy is checked against the capture: its width against the site's, its hook against the
captured sites, its rank against the complement the matched-rank controls are drawn from
(``k ≤ d − 1 − k``: the complement controls avoid the proxy and m̂). Like every fitted proxy,
the mean direction m̂ is then projected out of it
(:func:`tangentlens.proxies.add_fixed_proxy`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from tangentlens.capture.captured import Capture
from tangentlens.dictionaries import SAE, span_basis
from tangentlens.dictionaries.proxy_config import METHODS
from tangentlens.metrics.subspace import DEFAULT_RANK_RTOL
from tangentlens.proxies import MEAN_DIRECTION, FixedProxy

__all__ = ["RESERVED_METHODS", "resolve_proxies"]

#: Method names a user proxy may not take (the fitted proxies' and published SAEs').
RESERVED_METHODS: tuple[str, ...] = (*METHODS, MEAN_DIRECTION, "pretrained_sae")


def _is_sae(value: object) -> bool:
    """An SAE whose proxy latents are still to be chosen: an SAELens SAE, or a tangentlens SAE
    loaded (``from_disk``, ``from_pretrained``) and not yet measured. A fitted tangentlens SAE
    is a dictionary like the others (its ``basis()``)."""
    if isinstance(value, SAE):
        return not hasattr(value, "latents_")
    try:
        import sae_lens
    except ImportError:  # pragma: no cover - sae-lens is a dependency
        return False
    return isinstance(value, sae_lens.SAE)


def _widths(capture: Capture) -> dict[str, int]:
    return {site: int(s.h.sum.shape[0]) for site, s in capture.statistics.sites.items()}


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"a proxy's name must be a non-empty string, got {name!r}")
    if name in RESERVED_METHODS:
        raise ValueError(
            f"proxy name {name!r} is taken by tangentlens' own proxies ({RESERVED_METHODS}); "
            "name yours differently"
        )
    return name


def _basis_of(value: object, name: str, site: str, width: int, rtol: float) -> torch.Tensor:
    """The orthonormalised span (d × r, float64) of a user basis or dictionary."""
    if callable(getattr(value, "basis", None)):
        value = value.basis()  # type: ignore[attr-defined]
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(value)
    if not isinstance(value, torch.Tensor):
        raise ValueError(
            f"proxy {name!r}: expected a d × k basis (torch tensor or numpy array), a fitted "
            f"tangentlens dictionary (with basis()) or an SAELens SAE, got {type(value).__name__}"
        )
    if value.ndim != 2 or value.is_complex() or not value.is_floating_point():
        raise ValueError(
            f"proxy {name!r}: a basis must be a real 2-D float matrix (d × k), got shape "
            f"{tuple(value.shape)} and dtype {value.dtype}"
        )
    if value.shape[0] != width:
        hint = " (it looks transposed: pass d × k, columns spanning the proxy)" * (
            value.shape[1] == width
        )
        raise ValueError(
            f"proxy {name!r} has {value.shape[0]} rows but site {site!r} is {width} wide: "
            f"expected a {width} × k basis{hint}"
        )
    if not bool(torch.isfinite(value).all()):
        raise ValueError(f"proxy {name!r} has NaN or infinite entries")
    return span_basis(value.detach().cpu().double().T, rtol)


def _sae_proxy(
    value: object,
    name: str,
    site: str | None,
    capture: Capture,
    widths: dict[str, int],
    rank: int,
    model_name: str | None,
) -> tuple[str, FixedProxy]:
    """An SAE's site and proxy: the span of its ``rank`` most frequent latents on the site's
    sampled rows, with its explained variance and L0 there. ``site``: where it was given (a
    captured site), None for its own hook."""
    sae = SAE.from_sae_lens(value.sae_ if isinstance(value, SAE) else value, rank)
    hook = sae.hook_name
    if hook is None and site is None:
        raise ValueError(
            f"proxy {name!r}: the SAE names no hook (cfg.metadata.hook_name is None); give "
            f"its site: proxies={{{name!r}: {{'blocks.L.hook_resid_post': sae}}}}"
        )
    if hook is not None and site not in (None, hook):
        raise ValueError(
            f"proxy {name!r}: the SAE reads hook {hook!r} but is given for site {site!r}; an "
            "SAE measures the site it was trained on"
        )
    if hook is not None:
        target = sae.check_target(widths, model_name)  # captured, read whole, of its width
    elif sae.d_in != widths[site]:
        raise ValueError(
            f"proxy {name!r}: the SAE reads d_in = {sae.d_in}, but site {site!r} has width "
            f"{widths[site]}"
        )
    else:
        target = site
    reservoir = capture.statistics.sites[target].reservoir
    if reservoir is None or not len(reservoir):
        raise ValueError(
            f"proxy {name!r}: an SAE's latents are chosen on the capture's sampled activation "
            "rows, and this capture kept none: capture with reservoir ≥ 1"
        )
    sae = sae.measure(reservoir.columns()["H"])
    diagnostics = {"sae_explained_variance": sae.explained_variance_, "sae_l0": sae.l0_}
    return target, FixedProxy(sae.basis(), diagnostics)


def resolve_proxies(
    proxies: Mapping[str, Any],
    capture: Capture,
    *,
    rank: int,
    rtol: float = DEFAULT_RANK_RTOL,
    model_name: str | None = None,
) -> dict[str, dict[str, FixedProxy]]:
    """``{site: {method: FixedProxy}}`` of the user's ``proxies`` (see the module docstring),
    checked against ``capture``. ``rank``: latents of an SAE's proxy (the tangent_energy rank);
    ``rtol``: the rank tolerance of a basis's orthonormalisation; ``model_name``: the model's
    name, checked against an SAE's when both are known."""
    if not isinstance(proxies, Mapping):
        raise ValueError(
            "proxies must map a method name to a basis, dictionary or SAE (or to {site: …}), "
            f"got {type(proxies).__name__}"
        )
    widths = _widths(capture)
    out: dict[str, dict[str, FixedProxy]] = {}
    for name, value in proxies.items():
        name = _check_name(name)
        if isinstance(value, Mapping):
            targets: list[tuple[str | None, Any]] = []
            for site, item in value.items():
                if site not in widths:
                    raise ValueError(
                        f"proxy {name!r}: site {site!r} is not captured; captured: {sorted(widths)}"
                    )
                targets.append((site, item))
        elif _is_sae(value):
            targets = [(None, value)]
        else:
            if callable(getattr(value, "basis", None)):
                value = value.basis()  # a fitted dictionary: its span
            d = _declared_width(value)
            targets = [(site, value) for site, w in widths.items() if d is None or w == d]
            if not targets:
                transposed = value.shape[1] in widths.values()  # type: ignore[union-attr]
                hint = "it looks transposed: " * transposed
                raise ValueError(
                    f"proxy {name!r} is {d} wide, but no captured site is: widths "
                    f"{sorted(set(widths.values()))} ({hint}pass a d × k basis, d = the site's "
                    "width)"
                )
        for site, item in targets:
            if _is_sae(item):
                site, proxy = _sae_proxy(item, name, site, capture, widths, rank, model_name)
            else:
                basis = _basis_of(item, name, site, widths[site], rtol)
                proxy = FixedProxy(basis)
            _check_complement(name, site, proxy.basis)
            out.setdefault(site, {})[name] = proxy
    return out


def _declared_width(value: object) -> int | None:
    """The row count of a basis (None when it is no matrix: :func:`_basis_of` says why)."""
    shape = getattr(value, "shape", None)
    if shape is not None and len(shape) == 2:
        return int(shape[0])
    return None


def _check_complement(name: str, site: str, basis: torch.Tensor) -> None:
    d, k = basis.shape
    if k > d - 1 - k:
        raise ValueError(
            f"proxy {name!r} at {site!r} has rank {k} in width {d}: its complement controls "
            f"are {k}-frames outside the proxy and the mean direction, a "
            f"{d - 1 - k}-dimensional space, so the rank must be at most {(d - 1) // 2}"
        )
