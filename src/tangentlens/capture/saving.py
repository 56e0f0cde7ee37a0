"""Save a capture's statistics to one file and load them back, in any process, bit for bit.

The file is a :func:`torch.save` archive that :func:`torch.load` reads with
``weights_only=True``: nothing in it names a Python class to import. The object graph of a
:class:`~tangentlens.capture.CaptureStatistics` is encoded into nested dicts, lists, CPU tensors
and primitives (str, int, float, bool, None):

* a tangentlens object of a registered class (:data:`REGISTERED`) →
  ``{"t": "object", "class": name, "id": n, "state": {attribute: value}}``, its attributes
  (dataclass fields, else every instance attribute); an object met again →
  ``{"t": "ref", "id": n}``;
* ``{"t": kind, ...}`` for a tuple, set, frozenset (``items``), dict or Counter (``keys`` and
  ``values``), numpy array or scalar (``data``, a tensor); a list is a list, a tensor a
  detached CPU tensor, a primitive itself.

Anything else (an object of an unregistered class) is refused when saving, never pickled.

The payload: ``{"format": FORMAT, "version": FORMAT_VERSION, "statistics": …, "extra": …}``.

Shared objects: an object met twice is saved once and loaded as one object, so everything the
code compares by identity stays shared inside one file (each site's ``config`` is the capture's
``statistics``; each site's ``SequenceEnergy.projectors`` is the entry of
``statistics.sequence_energy.projectors``). Objects of two files, or of a file and of the live
process, cannot be the same object: statistics that gather per-sequence energy sums (whose
:class:`~tangentlens.capture.SequenceEnergyConfig` compares by identity) merge only with
statistics captured with the very same config object (a loaded capture's own).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tangentlens.capture.accumulators import (
    AttentionStatistics,
    MomentAccumulator,
    SiteStatistics,
    StatisticsConfig,
    TypeSums,
)
from tangentlens.capture.engine import CaptureConfig
from tangentlens.capture.reservoir import RowReservoir
from tangentlens.capture.sequence_energy import (
    EnergyProjectors,
    SequenceEnergy,
    SequenceEnergyConfig,
)
from tangentlens.capture.stream import CaptureStatistics
from tangentlens.data.masks import MaskPolicy

__all__ = ["FORMAT", "FORMAT_VERSION", "REGISTERED", "load_statistics", "save_statistics"]

#: What the ``format`` entry of a saved capture holds.
FORMAT = "tangentlens.capture_statistics"
#: The version of the encoding this module writes and reads (3: per-sequence energy sums keep
#: ``P_Q`` per method and the drift sums ``Σ (m̂ᵀg) g``, the controls' sums derived from them).
FORMAT_VERSION = 3

#: The classes whose objects are saved (by their state) and rebuilt, by name.
REGISTERED: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        CaptureStatistics,
        CaptureConfig,
        MaskPolicy,
        StatisticsConfig,
        SequenceEnergyConfig,
        EnergyProjectors,
        SiteStatistics,
        MomentAccumulator,
        TypeSums,
        RowReservoir,
        SequenceEnergy,
        AttentionStatistics,
    )
}
_PRIMITIVES = (str, int, float, bool, type(None))
_COLLECTIONS: dict[str, type] = {"tuple": tuple, "set": set, "frozenset": frozenset}
_MAPPINGS: dict[str, type] = {"dict": dict, "counter": Counter}


class _Encoder:
    """Encodes values into what ``torch.load(weights_only=True)`` reads; ``objects[n]`` is the
    object saved with id ``n``."""

    def __init__(self) -> None:
        self.ids: dict[int, int] = {}  # id(obj) → saved id
        self.objects: list[object] = []
        self.open: set[int] = set()  # objects being encoded (a cycle is refused)

    def encode(self, value: Any, where: str) -> Any:
        kind = type(value)
        if kind in _PRIMITIVES:
            return value
        if isinstance(value, torch.Tensor):
            out = value.detach().cpu()
            if out.untyped_storage().nbytes() > out.nbytes:  # a view: not its whole storage
                out = out.clone()
            return out if type(out) is torch.Tensor else out.as_subclass(torch.Tensor)
        if kind is list:
            return [self.encode(v, f"{where}[{i}]") for i, v in enumerate(value)]
        for name, cls in _COLLECTIONS.items():
            if kind is cls:
                items = [self.encode(v, f"{where}[{i}]") for i, v in enumerate(value)]
                return {"t": name, "items": items}
        for name, cls in _MAPPINGS.items():
            if kind is cls:
                for key in value:
                    _check_key(key, where)
                return {
                    "t": name,
                    "keys": [self.encode(k, where) for k in value],
                    "values": [self.encode(v, f"{where}[{k!r}]") for k, v in value.items()],
                }
        if kind is np.ndarray or isinstance(value, np.generic):
            return {
                "t": "ndarray" if kind is np.ndarray else "npscalar",
                "data": _array(value, where),
            }
        if REGISTERED.get(kind.__name__) is kind:
            return self._object(value, where)
        raise ValueError(
            f"cannot save {where}: a {kind.__module__}.{kind.__qualname__} is not supported (only "
            "str, int, float, bool, None, lists, tuples, sets, dicts, Counters, tensors, numpy "
            f"arrays and the tangentlens classes {sorted(REGISTERED)})"
        )

    def _object(self, obj: object, where: str) -> dict[str, Any]:
        key = id(obj)
        if key in self.ids:
            return {"t": "ref", "id": self.ids[key]}
        if key in self.open:
            raise ValueError(f"cannot save {where}: it contains itself (a reference cycle)")
        cls = type(obj)
        attributes = vars(obj)
        if dataclasses.is_dataclass(cls):
            names = [f.name for f in dataclasses.fields(cls)]
            if set(attributes) != set(names):
                raise ValueError(
                    f"cannot save {where}: its attributes {sorted(attributes)} are not the "
                    f"fields {sorted(names)} of {cls.__name__}"
                )
        else:
            names = list(attributes)
        self.open.add(key)
        state = {name: self.encode(getattr(obj, name), f"{where}.{name}") for name in names}
        self.open.discard(key)
        self.ids[key] = len(self.objects)  # numbered when complete, as they are rebuilt
        self.objects.append(obj)
        return {"t": "object", "class": cls.__name__, "id": self.ids[key], "state": state}


def _check_key(key: Any, where: str) -> None:
    """Dict keys must be primitives or tuples of them (they are rebuilt as hashable values)."""
    if type(key) is tuple:
        for part in key:
            _check_key(part, where)
    elif type(key) not in _PRIMITIVES:
        raise ValueError(
            f"cannot save {where}: dict keys must be str, int, float, bool, None or tuples of "
            f"them, got a {type(key).__name__}"
        )


def _array(value: np.ndarray | np.generic, where: str) -> torch.Tensor:
    """A numpy array or scalar as a CPU tensor of the same dtype and shape (a copy)."""
    array = np.array(value, copy=True, order="C")
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    try:
        return torch.from_numpy(array)
    except TypeError as error:
        raise ValueError(
            f"cannot save {where}: numpy dtype {array.dtype} has no tensor equivalent"
        ) from error


class _Decoder:
    """Rebuilds what :class:`_Encoder` wrote."""

    def __init__(self) -> None:
        self.objects: dict[int, object] = {}

    def decode(self, node: Any) -> Any:
        if type(node) in _PRIMITIVES or isinstance(node, torch.Tensor):
            return node
        if type(node) is list:
            return [self.decode(v) for v in node]
        if type(node) is not dict:
            raise ValueError(f"unexpected {type(node).__name__} in the encoded statistics")
        kind = node["t"]
        if kind in _COLLECTIONS:
            return _COLLECTIONS[kind](self.decode(v) for v in node["items"])
        if kind in _MAPPINGS:
            keys, values = node["keys"], node["values"]
            if len(keys) != len(values):
                raise ValueError("a saved dict has different numbers of keys and values")
            pairs = {self.decode(k): self.decode(v) for k, v in zip(keys, values, strict=True)}
            return pairs if kind == "dict" else _MAPPINGS[kind](pairs)
        if kind == "ndarray":
            return node["data"].numpy()
        if kind == "npscalar":
            return node["data"].numpy()[()]
        if kind == "ref":
            return self.objects[node["id"]]
        if kind == "object":
            obj = self._build(node["class"], node["state"])
            self.objects[node["id"]] = obj
            return obj
        raise ValueError(f"unknown node kind {kind!r} in the encoded statistics")

    def _build(self, name: str, encoded: dict[str, Any]) -> object:
        cls = REGISTERED.get(name)
        if cls is None:
            raise ValueError(f"unknown class {name!r} (known: {sorted(REGISTERED)})")
        state = {key: self.decode(value) for key, value in encoded.items()}
        if dataclasses.is_dataclass(cls):  # through the constructor: its checks run
            fields = {f.name: f.init for f in dataclasses.fields(cls)}
            obj = cls(**{k: v for k, v in state.items() if fields.get(k, True)})
            for key in (k for k in state if not fields.get(k, True)):
                object.__setattr__(obj, key, state[key])
            return obj
        obj = cls.__new__(cls)
        vars(obj).update(state)
        return obj


def save_statistics(
    statistics: CaptureStatistics, path: str | Path, extra: dict[str, Any] | None = None
) -> None:
    """Write ``statistics`` and ``extra`` to ``path`` (a :func:`torch.save` file; tensors on the
    CPU), atomically: the file is written next to ``path`` and renamed over it, so ``path`` holds
    either its old content or the whole new file, and a failed save leaves nothing behind.

    Args:
        statistics: the capture to save; every object in it must be of a supported type (see the
            module docstring), else ValueError before anything is written.
        extra: what the caller stores alongside (str keys; values: str, int, float, bool, None,
            lists, tuples, dicts, tensors, numpy arrays), returned by :func:`load_statistics`.
    """
    if not isinstance(statistics, CaptureStatistics):
        raise ValueError(f"statistics must be a CaptureStatistics, got {type(statistics).__name__}")
    extra = {} if extra is None else extra
    if type(extra) is not dict or not all(type(k) is str for k in extra):
        raise ValueError("extra must be a dict with str keys")
    encoder = _Encoder()
    payload = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "statistics": encoder.encode(statistics, "statistics"),
        "extra": encoder.encode(extra, "extra"),
    }
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "xb") as file:
            torch.save(payload, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def load_statistics(path: str | Path) -> tuple[CaptureStatistics, dict[str, Any]]:
    """The capture statistics and the ``extra`` dict saved by :func:`save_statistics` (read
    with ``torch.load(weights_only=True)``; tensors on the CPU, numpy arrays as numpy).

    Raises:
        ValueError: ``path`` is not a tangentlens capture statistics file, or holds another
            format version.
    """
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except OSError:
        raise
    except Exception as error:
        raise ValueError(
            f"{path} is not a tangentlens capture statistics file (expected a torch.save file "
            f"readable with weights_only=True): {error}"
        ) from error
    if type(payload) is not dict or payload.get("format") != FORMAT:
        raise ValueError(
            f"{path} is not a tangentlens capture statistics file (expected a dict with "
            f"format={FORMAT!r}, as save_statistics writes)"
        )
    if payload.get("version") != FORMAT_VERSION:
        raise ValueError(
            f"{path} holds capture statistics of format version {payload.get('version')!r}; "
            f"this tangentlens reads version {FORMAT_VERSION}"
        )
    try:
        decoder = _Decoder()
        statistics = decoder.decode(payload["statistics"])
        extra = decoder.decode(payload["extra"])
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise _corrupt(path, error) from error
    if not isinstance(statistics, CaptureStatistics) or type(extra) is not dict:
        raise ValueError(
            f"{path} is not a tangentlens capture statistics file (expected CaptureStatistics "
            f"and a dict, got {type(statistics).__name__} and {type(extra).__name__})"
        )
    return statistics, extra


def _corrupt(path: str | Path, error: Exception) -> ValueError:
    return ValueError(
        f"{path} holds corrupt tangentlens capture statistics (format {FORMAT!r} version "
        f"{FORMAT_VERSION}): {type(error).__name__}: {error}"
    )
