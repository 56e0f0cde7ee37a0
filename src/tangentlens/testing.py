"""Testing code that must run where the model is, on a machine without an accelerator.

:func:`emulated_accelerator` gives an *emulated device*: tensors that report a device other than
the CPU (``torch.device("meta")``) while their values live in CPU memory, so code takes the path
it takes on a GPU — and is refused what a GPU refuses:

* one op mixing a device tensor with a CPU tensor of one or more dimensions (a 0-d CPU tensor
  is a scalar, as on CUDA; a device tensor may be indexed with CPU index tensors, as on CUDA,
  not a CPU tensor with device indices);
* ``.numpy()`` of a device tensor (on a GPU: "can't convert cuda:0 device type tensor to
  numpy");
* a random draw on the device from a CPU ``torch.Generator`` (an accelerator draws with its
  own generators: :func:`tangentlens.seeding.seeded_generators` with ``device=``; a CPU
  generator seeded exactly as a device generator of this block passes for one).

Every copy from the device to the host is recorded (:class:`Transfers`): ``.cpu()``,
``.to("cpu")``, ``.tolist()``, a copy into a CPU tensor, and each scalar read (``float()``,
``.item()``, ``bool()``; a GPU waits for its queue there). A test asserts what crossed — e.g.
that no matrix did (:meth:`Transfers.matrices`) — so a stray ``.cpu()`` fails on the CPU as it
would cost on a GPU. Values are the CPU's, so the device path is checked against the CPU path
within a stated tolerance (the same arithmetic, reordered where the device path batches it).

Every point where a CUDA device makes the host wait for its queue is recorded as a
:class:`Sync` with its kind (:data:`SYNC_KINDS`) and the line that asked for it
(:attr:`Transfers.syncs`): the copies and scalar reads above; ops whose output size or success
depends on device values — ``nonzero`` (and ``torch.where(mask)``), ``unique``, boolean-mask
indexing and assignment, ``masked_select``, ``bincount``, ``repeat_interleave`` without an
output size, ``torch.equal``; linear algebra that checks its ``info`` on the host (``eigh``,
``eigvalsh``, ``svd``, ``pinv``, ``lstsq``, ``eig``, ``cholesky``, ``inv``, ``solve``; not
their ``*_ex`` forms with ``check_errors=False``, nor ``qr``); and host → device copies from
pageable memory (``.to(device)`` of a CPU tensor, a CPU index tensor indexing a device tensor,
``torch.tensor(..., device=)``): only a copy from pinned memory with ``non_blocking=True`` is
queued without waiting (:func:`tangentlens.capture.transfer.upload`; ``pin_memory()`` works in
the block and marks what it pins). Such queued copies are counted in :attr:`Transfers.uploads`.
A test bounds the syncs of a piece of work (e.g. a capture batch) by slicing the list.

``torch.inference_mode`` blocks run as ``torch.no_grad`` (a tensor subclass cannot be an
inference tensor; the values are the same). The emulation intercepts factory functions through
a dispatch mode, which is thread-local: run
the code under test on the thread that entered the block (e.g. ``capture.threads = 1``, so
:func:`tangentlens.runtime.alongside` runs its task in line). Slow — every op goes through
Python — so use micro shapes.

>>> import torch
>>> with emulated_accelerator() as accelerator:
...     x = torch.ones(3, 2, dtype=torch.float64).to(accelerator.device)
...     total = float((x @ x.T).sum())
...     mixed = None
...     try:
...         x + torch.ones(3, 2, dtype=torch.float64)
...     except RuntimeError as error:
...         mixed = str(error)
>>> total, x.device.type, mixed.startswith("Expected all tensors to be on the same device")
(18.0, 'meta', True)
>>> accelerator.transfers.scalars, accelerator.transfers.matrices()
(1, [])
>>> [sync.kind for sync in accelerator.transfers.syncs]  # the upload (pageable), the float
['pageable_upload', 'scalar']
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tangentlens import seeding

__all__ = ["SYNC_KINDS", "EmulatedDevice", "Sync", "Transfer", "Transfers", "emulated_accelerator"]

#: The device emulated tensors report.
DEVICE = torch.device("meta")

#: Ops that index with CPU index tensors on an accelerator (PyTorch moves them there).
_INDEXING = {
    torch.ops.aten.index.Tensor,
    torch.ops.aten.index_put.default,
    torch.ops.aten.index_put_.default,
    torch.ops.aten._index_put_impl_.default,
}
_SCALAR_READ = torch.ops.aten._local_scalar_dense.default

#: The kinds of :class:`Sync`: a device → host copy (``to_host``: ``.cpu()``, a copy into a
#: host tensor; ``tolist``), a scalar read, an op whose output size or result the host must
#: read (``nonzero``, ``unique``, ``boolean_mask``, ``masked_select``, ``bincount``,
#: ``repeat_interleave``, ``equal``), linear algebra checking its ``info`` on the host
#: (``linalg_info``), a host → device copy from pageable memory (``pageable_upload``).
SYNC_KINDS: tuple[str, ...] = (
    "to_host",
    "tolist",
    "scalar",
    "nonzero",
    "unique",
    "boolean_mask",
    "masked_select",
    "bincount",
    "repeat_interleave",
    "equal",
    "linalg_info",
    "pageable_upload",
)
_aten = torch.ops.aten
#: Ops that make the host wait whatever their arguments, by kind.
_SYNCING_OPS: dict[Any, str] = {
    _aten.nonzero.default: "nonzero",
    _aten.argwhere.default: "nonzero",
    _aten._unique.default: "unique",
    _aten._unique2.default: "unique",
    _aten.unique_dim.default: "unique",
    _aten.unique_consecutive.default: "unique",
    _aten.unique_dim_consecutive.default: "unique",
    _aten.masked_select.default: "masked_select",
    _aten.bincount.default: "bincount",
    _aten.equal.default: "equal",
    _aten.is_nonzero.default: "scalar",
    _aten._linalg_eigh.default: "linalg_info",
    _aten._linalg_svd.default: "linalg_info",
    _aten.linalg_pinv.atol_rtol_tensor: "linalg_info",
    _aten.linalg_pinv.atol_rtol_float: "linalg_info",
    _aten.linalg_lstsq.default: "linalg_info",
    _aten.linalg_eig.default: "linalg_info",
    _aten._linalg_eigvals.default: "linalg_info",
    _aten._linalg_check_errors.default: "linalg_info",
}
#: ``*_ex`` linear algebra: a sync only with ``check_errors=True`` (their last argument).
_CHECKED_EX = {
    _aten.linalg_cholesky_ex.default,
    _aten.linalg_inv_ex.default,
    _aten._linalg_solve_ex.default,
    _aten.linalg_lu_factor_ex.default,
    _aten.linalg_ldl_factor_ex.default,
}
_REPEAT_INTERLEAVE = {
    _aten.repeat_interleave.Tensor,
    _aten.repeat_interleave.self_Tensor,
}


@dataclass(frozen=True)
class Transfer:
    """One device → host copy: its ``shape`` and the line of code that asked for it."""

    shape: tuple[int, ...]
    where: str


@dataclass(frozen=True)
class Sync:
    """One point where a CUDA device makes the host wait: its ``kind`` (one of
    :data:`SYNC_KINDS`) and the line of code that asked for it."""

    kind: str
    where: str


@dataclass
class Transfers:
    """What crossed between the emulated device and the host: ``copies`` (tensors to the
    host), ``scalars`` (values read one at a time), ``syncs`` (every wait a CUDA device would
    make, in order: those copies and reads among them) and ``uploads`` (host → device copies
    queued without a wait: pinned, ``non_blocking``)."""

    copies: list[Transfer] = field(default_factory=list)
    scalars: int = 0
    syncs: list[Sync] = field(default_factory=list)
    uploads: int = 0

    def matrices(self) -> list[Transfer]:
        """The copies with two or more dimensions of size > 1: more than parts of a result."""
        return [t for t in self.copies if sum(1 for s in t.shape if s > 1) >= 2]


def _caller() -> str:
    """The innermost frame outside torch and this module: who asked for the copy (read from
    the frames themselves, not their source lines)."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if "/torch/" not in name and not name.endswith("tangentlens/testing.py"):
            return f"{name}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return "?"


class _OnDevice(torch.Tensor):
    """A tensor that reports :data:`DEVICE` and holds its values in ``value`` (a CPU tensor)."""

    value: torch.Tensor
    _owner: EmulatedDevice

    @staticmethod
    def __new__(cls, value: torch.Tensor, owner: EmulatedDevice) -> _OnDevice:
        out = torch.Tensor._make_wrapper_subclass(
            cls,
            value.shape,
            strides=value.stride(),
            storage_offset=value.storage_offset(),
            dtype=value.dtype,
            layout=value.layout,
            device=DEVICE,
            requires_grad=value.requires_grad,
        )
        out.value = value
        out._owner = owner
        return out

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        return f"OnDevice({self.value!r})"

    def tolist(self) -> Any:
        self._owner.record(tuple(self.shape), "tolist")
        return self.value.tolist()

    def numpy(self, *, force: bool = False) -> Any:
        raise TypeError(
            "can't convert an emulated accelerator tensor to numpy (on a GPU: \"can't convert "
            'cuda:0 device type tensor to numpy"): copy it to the host with .cpu() first'
        )

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = _tensors((args, kwargs))
        owner = next(t._owner for t in tensors if isinstance(t, _OnDevice))
        return owner.run(func, args, kwargs, tensors)


class EmulatedDevice(TorchDispatchMode):
    """The emulated accelerator (see the module docstring): ``device`` to move tensors to,
    ``transfers`` what came back."""

    def __init__(self) -> None:
        super().__init__()
        self.device = DEVICE
        self.transfers = Transfers()
        self._generators: list[torch.Generator] = []
        self._pinned: dict[int, weakref.ref[torch.Tensor]] = {}

    def record(self, shape: tuple[int, ...], kind: str = "to_host") -> None:
        """A device → host copy of ``shape`` (a sync of ``kind``)."""
        where = _caller()
        self.transfers.copies.append(Transfer(shape, where))
        self.transfers.syncs.append(Sync(kind, where))

    def sync(self, kind: str) -> None:
        """A wait of ``kind`` (:data:`SYNC_KINDS`) asked for by the caller."""
        self.transfers.syncs.append(Sync(kind, _caller()))

    def pin(self, tensor: torch.Tensor) -> torch.Tensor:
        """A copy of the host ``tensor`` that stands for page-locked memory."""
        pinned = tensor.clone()
        self._pinned = {k: r for k, r in self._pinned.items() if r() is not None}
        self._pinned[id(pinned)] = weakref.ref(pinned)
        return pinned

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        ref = self._pinned.get(id(tensor))
        return ref is not None and ref() is tensor

    def _upload(self, source: torch.Tensor, non_blocking: bool) -> None:
        """A host → device copy from ``source``: queued when pinned and non-blocking, else a
        wait."""
        if non_blocking and self.is_pinned(source):
            self.transfers.uploads += 1
        else:
            self.sync("pageable_upload")

    def generator(self) -> torch.Generator:
        """A generator that stands for the device's own (a CPU generator the emulation knows)."""
        generator = torch.Generator()
        self._generators.append(generator)
        return generator

    def _is_device_generator(self, generator: torch.Generator) -> bool:
        """Whether ``generator`` is one of :meth:`generator`'s. The dispatcher hands ops a new
        Python object for the same generator, so they are told apart by their seeds: a CPU
        generator seeded exactly as a device one passes for it (which is why a device
        generator drawing on the host is not refused: the same key drawn on both would look
        like one)."""
        return generator.initial_seed() in {g.initial_seed() for g in self._generators}

    # ---------------------------------------------------------------- dispatch

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = _tensors((args, kwargs))
        on_device = any(isinstance(t, _OnDevice) for t in tensors)
        if on_device or _names_device(kwargs.get("device")):
            return self.run(func, args, kwargs, tensors)
        return func(*args, **kwargs)

    def run(self, func: Any, args: tuple, kwargs: dict, tensors: list[torch.Tensor]) -> Any:
        """``func`` on the CPU values of its device arguments (``tensors``: every tensor among
        them); results back on the device."""
        self._check(func, args, kwargs, tensors)
        self._count_syncs(func, args, kwargs)
        if _is_copy(func) and not isinstance(args[0], _OnDevice):  # into a host tensor
            self.record(tuple(args[1].shape))
            return args[0].copy_(args[1].value, *args[2:], **kwargs)
        to_host = _to_host(func, kwargs)
        if to_host:
            self.record(tuple(args[0].shape))
        originals = {id(t.value): t for t in tensors if isinstance(t, _OnDevice)}

        def unwrap(t: Any) -> Any:
            if isinstance(t, _OnDevice):
                return t.value
            if isinstance(t, torch.device) and t.type == DEVICE.type:
                return torch.device("cpu")
            return t

        out = func(*_map(unwrap, args), **_map(unwrap, kwargs))
        if to_host or func is _SCALAR_READ:
            return out

        def wrap(t: Any) -> Any:
            if not isinstance(t, torch.Tensor) or isinstance(t, _OnDevice):
                return t
            same = originals.get(id(t))  # an op in place gives back the same tensor
            return _OnDevice(t, self) if same is None else same

        return _map(wrap, out)

    def _count_syncs(self, func: Any, args: tuple, kwargs: dict) -> None:
        """Record the waits ``func`` makes on a CUDA device (host copies are recorded where
        they are made)."""
        if func is _SCALAR_READ:
            self.transfers.scalars += 1
            self.sync("scalar")
        elif func in _SYNCING_OPS:
            self.sync(_SYNCING_OPS[func])
        elif func in _CHECKED_EX and (kwargs.get("check_errors") or _last_flag(func, args)):
            self.sync("linalg_info")
        elif func in _REPEAT_INTERLEAVE and kwargs.get("output_size") is None:
            self.sync("repeat_interleave")
        elif func in _INDEXING and isinstance(args[0], _OnDevice):
            indices = args[1] if isinstance(args[1], list | tuple) else [args[1]]
            for index in indices:
                if not isinstance(index, torch.Tensor):
                    continue
                if not isinstance(index, _OnDevice):
                    self.sync("pageable_upload")  # PyTorch copies it there, and waits
                elif index.dtype == torch.bool:
                    self.sync("boolean_mask")
        elif func is torch.ops.aten._to_copy.default and not isinstance(args[0], _OnDevice):
            self._upload(args[0], bool(kwargs.get("non_blocking")))
        elif _is_copy(func) and isinstance(args[0], _OnDevice):
            source = args[1]
            if isinstance(source, torch.Tensor) and not isinstance(source, _OnDevice):
                non_blocking = kwargs.get("non_blocking", args[2] if len(args) > 2 else False)
                self._upload(source, bool(non_blocking))

    def _check(self, func: Any, args: tuple, kwargs: dict, tensors: list[torch.Tensor]) -> None:
        if any(not isinstance(t, _OnDevice) and t.device.type == DEVICE.type for t in tensors):
            raise RuntimeError(
                f"{func}: a tensor made on the device outside the emulation's sight (PyTorch "
                "turned a Python list into a device tensor, e.g. an index list): it has no "
                "values here; index with a tensor instead"
            )
        # a device tensor may be indexed with host indices (PyTorch moves them), not the reverse
        indexing_device = func in _INDEXING and isinstance(args[0], _OnDevice)
        if any(isinstance(t, _OnDevice) for t in tensors) and not indexing_device:
            host = [t for t in tensors if not isinstance(t, _OnDevice) and t.ndim > 0]
            if host and not _is_copy(func):
                raise RuntimeError(
                    f"Expected all tensors to be on the same device, but found at least two "
                    f"devices, meta (emulated accelerator) and cpu! ({func}, a CPU tensor of "
                    f"shape {tuple(host[0].shape)})"
                )
        generator = kwargs.get("generator")
        if generator is not None and not self._is_device_generator(generator):
            raise RuntimeError(
                f"{func}: Expected a 'meta' device type for generator but found 'cpu' (a random "
                "draw on the accelerator needs the device's own generator)"
            )


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in an op's arguments (nested tuples, lists and dicts), in order: a walk of
    the few containers aten ops take, several times cheaper per op than a general pytree's."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, tuple | list):
        return [t for item in value for t in _tensors(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    return []


def _map(fn: Any, value: Any) -> Any:
    """``fn`` applied to every leaf of nested tuples, lists and dicts (their types kept)."""
    if isinstance(value, tuple | list):
        return type(value)([_map(fn, item) for item in value])
    if isinstance(value, dict):
        return {key: _map(fn, item) for key, item in value.items()}
    return fn(value)


def _last_flag(func: Any, args: tuple) -> bool:
    """``check_errors`` given by position (the schema's last argument)."""
    names = [a.name for a in func._schema.arguments]
    at = names.index("check_errors")
    return len(args) > at and bool(args[at])


def _names_device(device: Any) -> bool:
    return device is not None and torch.device(device).type == DEVICE.type


def _to_host(func: Any, kwargs: dict) -> bool:
    """Whether ``func`` copies a device tensor to the host (``.cpu()``, ``.to("cpu")``)."""
    device = kwargs.get("device")
    return (
        func is torch.ops.aten._to_copy.default
        and device is not None
        and (torch.device(device).type == "cpu")
    )


def _is_copy(func: Any) -> bool:
    """``copy_`` crosses devices on an accelerator too (host → device or the reverse)."""
    return func is torch.ops.aten.copy_.default


@contextlib.contextmanager
def emulated_accelerator() -> Iterator[EmulatedDevice]:
    """Within the block, ``tensor.to(device.device)`` (and any factory given that device) makes
    emulated accelerator tensors, and :mod:`tangentlens.seeding` hands out the device's own
    generators for it; yields the :class:`EmulatedDevice` (its ``transfers`` say what came back
    to the host)."""
    device = EmulatedDevice()
    with (
        seeding.device_generators(DEVICE.type, device.generator),
        _constructors_through(device),
        device,
    ):
        yield device


@contextlib.contextmanager
def _constructors_through(device: EmulatedDevice) -> Iterator[None]:
    """``torch.tensor``, ``torch.as_tensor`` and ``Tensor.new_tensor`` given the emulated
    device build the tensor on the CPU and move it (their C++ would otherwise make a value-less
    ``meta`` tensor); ``Tensor.pin_memory`` and ``Tensor.is_pinned`` stand for page-locked
    memory (there is no CUDA driver to ask)."""
    originals = {name: getattr(torch, name) for name in ("tensor", "as_tensor")}
    new_tensor = torch.Tensor.new_tensor

    def through(name: str) -> Any:
        def construct(data: Any, *args: Any, device: Any = None, **kwargs: Any) -> Any:
            if not _names_device(device):
                return originals[name](data, *args, device=device, **kwargs)
            if isinstance(data, _OnDevice):
                return originals[name](data, *args, **kwargs)
            return originals[name](data, *args, **kwargs).to(DEVICE)

        return construct

    def new(self: torch.Tensor, data: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        if not isinstance(self, _OnDevice) or "device" in kwargs:
            return new_tensor(self, data, *args, **kwargs)
        return new_tensor(self.value, data, *args, **kwargs).to(DEVICE)

    def pin(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return device.pin(self)

    def is_pinned(self: torch.Tensor, *args: Any, **kwargs: Any) -> bool:
        return device.is_pinned(self)

    inference_mode = torch.inference_mode
    pin_memory, was_pinned = torch.Tensor.pin_memory, torch.Tensor.is_pinned
    for name in originals:
        setattr(torch, name, through(name))
    torch.Tensor.new_tensor = new  # type: ignore[method-assign]
    torch.Tensor.pin_memory = pin  # type: ignore[method-assign]
    torch.Tensor.is_pinned = is_pinned  # type: ignore[method-assign]
    torch.inference_mode = torch.no_grad  # type: ignore[misc, assignment]
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(torch, name, original)
        torch.Tensor.new_tensor = new_tensor  # type: ignore[method-assign]
        torch.Tensor.pin_memory = pin_memory  # type: ignore[method-assign]
        torch.Tensor.is_pinned = was_pinned  # type: ignore[method-assign]
        torch.inference_mode = inference_mode  # type: ignore[misc]
