"""torch tensors: their storages' bytes out of band (staged to host memory), each once per stream, and each
tensor's place in its storage (offset, shape, strides); rebuilt on the same device where it exists.

`_rebuild_tensor` rebuilds the tensors of streams written before storages were saved (a contiguous copy each).
"""

from __future__ import annotations

import pickle
import sys
import threading
import types
import warnings
import weakref
from typing import Any

from .context import restore_device, saved
from .handles import FILE_TYPES, LOCK_TYPES
from .iterators import is_loader_iterator, is_progress_bar, is_summary_writer
from .torch_modules import is_compiled_module, is_parametrized_module


def holds_most_of(t: Any, storage: Any) -> bool:
    """Whether `t` views more than half of `storage`: then the whole storage is saved, else a compact copy of `t`."""
    return t.numel() * t.element_size() * 2 > storage.nbytes()


def reduced_here(torch: Any, t: Any) -> bool:
    """Whether `_reduce_tensor` saves `t` (plain strided tensors and parameters; torch's own route for the rest)."""
    return (t.layout == torch.strided and not t.is_quantized and not t.is_nested
            and type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type != "meta")


def storage_buffer(torch: Any, storage: Any) -> pickle.PickleBuffer:
    """A storage's bytes as the buffer a stream hands out of band (staged to host memory from a device)."""
    raw = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
    if raw.device.type != "cpu":
        raw = raw.to("cpu")  # staging: device memory cannot be written out directly
    return pickle.PickleBuffer(raw.numpy()) if raw.numel() else pickle.PickleBuffer(b"")


class _Storage:
    """A tensor storage being saved: its bytes out of band, written once per stream however many tensors view it.

    Pickle memoizes this object, so every tensor on the storage refers to the one copy in the stream.
    """

    def __init__(self, torch: Any, t: Any, compact: Any = None):
        self.compact = compact  # the compact copy saved in place of a small view, if that is what this is
        self.buffer = storage_buffer(torch, t.untyped_storage())

    def __reduce__(self):
        return (_rebuild_storage, (self.buffer,))


def _storage_of(torch: Any, t: Any) -> _Storage:
    """The storage to save `t` on: the one this stream already saves when `t` views it; else `t`'s own, whole,
    when `t` holds more than half of it; else a compact copy of `t` (a small slice does not carry a large storage)."""
    memo = saved()
    storage = t.untyped_storage()
    if memo is None or storage.nbytes() == 0:
        return _Storage(torch, t)
    storages = memo[0]
    key = (str(t.device), storage.data_ptr(), storage.nbytes())
    found = storages.get(key)
    if found is None:
        if not holds_most_of(t, storage):
            copy = t.clone(memory_format=torch.contiguous_format)
            return _Storage(torch, copy, compact=copy)
        found = storages[key] = _Storage(torch, t)
    return found


def _reduce_tensor(torch: Any, t: Any):
    if not reduced_here(torch, t):
        return NotImplemented
    data = t.detach()
    if data.is_conj() or data.is_neg():  # a lazy conjugate or negation: saved as the values it reads as
        data = data.resolve_conj().resolve_neg()
    dtype = str(t.dtype).removeprefix("torch.")
    is_param = isinstance(t, torch.nn.Parameter)
    grad = t.grad if t.is_leaf else None  # gradients being accumulated are part of the training state
    attrs = dict(t.__dict__) or None  # flags a training loop set on a tensor or a Parameter
    # the storage, once, and where this tensor sits in it: views, offsets, strides and memory formats survive
    storage = _storage_of(torch, data)
    if storage.compact is not None:
        data = storage.compact
    return (_rebuild_strided, (storage, dtype, tuple(t.shape), str(t.device), bool(t.requires_grad),
                               is_param, grad, data.storage_offset(), tuple(data.stride()), attrs))


def _rebuild_storage(buf: Any) -> "_LoadedStorage":
    return _LoadedStorage(buf)


class _LoadedStorage:
    """A restored storage: on the CPU over the buffer read from storage, moved once to each device that needs it."""

    def __init__(self, buf: Any):
        import torch

        view = memoryview(buf)
        if view.nbytes == 0:
            raw = torch.empty(0, dtype=torch.uint8)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # read-only buffers only come from tests
                raw = torch.frombuffer(view, dtype=torch.uint8)
        self.on = {"cpu": raw.untyped_storage()}
        self._raw = raw

    def at(self, device: str) -> Any:
        found = self.on.get(device)
        if found is None:
            found = self.on[device] = self._raw.to(device).untyped_storage()
        return found


def _rebuild_strided(storage: _LoadedStorage, dtype: str, shape: tuple, device: str, requires_grad: bool,
                     is_param: bool, grad: Any = None, offset: int = 0, stride: tuple | None = None,
                     attrs: dict | None = None):
    import torch

    target = restore_device(device)
    t = torch.empty(0, dtype=getattr(torch, dtype), device=target)
    t.set_(storage.at(target), offset, shape, stride)
    t = _as_saved(t, requires_grad, is_param, grad)
    if attrs:
        t.__dict__.update(attrs)
    return t


def _rebuild_tensor(buf: Any, dtype: str, shape: tuple, device: str, requires_grad: bool, is_param: bool,
                    grad: Any = None):
    import torch

    torch_dtype = getattr(torch, dtype)
    view = memoryview(buf)
    if view.nbytes == 0:
        t = torch.empty(shape, dtype=torch_dtype)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # read-only buffers only come from tests
            t = torch.frombuffer(view, dtype=torch.uint8).view(torch_dtype).reshape(shape)
    target = restore_device(device)
    if target != "cpu":
        t = t.to(target)
    return _as_saved(t, requires_grad, is_param, grad)


def _as_saved(t: Any, requires_grad: bool, is_param: bool, grad: Any) -> Any:
    """The rebuilt tensor as it was saved: a Parameter or a tensor that requires grad, with its gradient."""
    import torch

    if is_param:
        t = torch.nn.Parameter(t, requires_grad=requires_grad)
    elif requires_grad:
        t.requires_grad_(True)
    if grad is not None:
        t.grad = grad
    return t


# -- which route each type takes ---------------------------------------------------------------

_KINDS: "weakref.WeakKeyDictionary[type, str | None]" = weakref.WeakKeyDictionary()


def _kind_of(cls: type) -> str | None:
    """How objects of `cls` are reduced: "code", "file", "lock", "thread", "tensor", "compiled", "parametrized",
    "ndarray", "memmap", "dataloader", "loader_iterator", "progress", "summary_writer", "optimizer", "state_dict"
    or None (plain)."""
    try:
        return _KINDS[cls]
    except (KeyError, TypeError):
        pass
    kind = _classify(cls)
    try:
        _KINDS[cls] = kind
    except TypeError:  # not weak-referenceable: classify each time
        pass
    return kind


def _classify(cls: type) -> str | None:
    if issubclass(cls, (types.FunctionType, type)):
        return "code"
    if issubclass(cls, FILE_TYPES):
        return "file"
    if issubclass(cls, LOCK_TYPES):
        return "lock"
    if issubclass(cls, threading.Thread):
        return "thread"
    torch = sys.modules.get("torch")
    if torch is not None and issubclass(cls, torch.Tensor):
        return "tensor"
    if torch is not None and issubclass(cls, torch.nn.Module):
        if is_compiled_module(cls):
            return "compiled"
        if is_parametrized_module(cls):
            return "parametrized"
    numpy = sys.modules.get("numpy")
    if numpy is not None and cls is numpy.ndarray:
        return "ndarray"
    if numpy is not None and issubclass(cls, numpy.memmap):
        return "memmap"
    data = sys.modules.get("torch.utils.data")
    if data is not None and issubclass(cls, data.DataLoader):
        return "dataloader"
    if is_loader_iterator(cls):
        return "loader_iterator"
    if is_progress_bar(cls):
        return "progress"
    if is_summary_writer(cls):
        return "summary_writer"
    if torch is not None and issubclass(cls, torch.optim.Optimizer):
        return "optimizer"
    if callable(getattr(cls, "state_dict", None)) and callable(getattr(cls, "load_state_dict", None)):
        if torch is not None and issubclass(cls, _pickles_whole_state(torch)):
            return None
        return "state_dict"
    return None


def _pickles_whole_state(torch: Any) -> tuple[type, ...]:
    """torch types whose own pickling keeps their whole state and their links to shared tensors."""
    kinds: list[type] = [torch.nn.Module, torch.optim.Optimizer, torch.Generator]
    scheduler = getattr(torch.optim.lr_scheduler, "LRScheduler", None)
    kinds.extend(k for k in (scheduler, getattr(torch.optim.lr_scheduler, "ReduceLROnPlateau", None)) if k)
    return tuple(kinds)
