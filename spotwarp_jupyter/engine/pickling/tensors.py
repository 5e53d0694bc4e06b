"""torch tensors: their bytes out of band (staged to host memory), rebuilt on the same device where it exists."""

from __future__ import annotations

import pickle
import sys
import types
import warnings
import weakref
from typing import Any

from .context import restore_device


def _reduce_tensor(torch: Any, t: Any):
    if t.layout != torch.strided or t.is_quantized or t.is_nested or type(t) not in (torch.Tensor, torch.nn.Parameter):
        return NotImplemented
    if t.device.type == "meta":
        return NotImplemented
    data = t.detach()
    if data.device.type != "cpu":
        data = data.to("cpu")  # staging: device memory cannot be written out directly
    if not data.is_contiguous():
        data = data.contiguous()
    flat = data.reshape(-1).view(torch.uint8) if data.numel() else None
    raw = pickle.PickleBuffer(flat.numpy()) if flat is not None else pickle.PickleBuffer(b"")
    dtype = str(t.dtype).removeprefix("torch.")
    is_param = isinstance(t, torch.nn.Parameter)
    grad = t.grad if t.is_leaf else None  # gradients being accumulated are part of the training state
    return (_rebuild_tensor, (raw, dtype, tuple(t.shape), str(t.device), bool(t.requires_grad), is_param, grad))


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
    """How objects of `cls` are reduced: "code", "tensor", "ndarray", "dataloader", "state_dict" or None (plain)."""
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
    torch = sys.modules.get("torch")
    if torch is not None and issubclass(cls, torch.Tensor):
        return "tensor"
    numpy = sys.modules.get("numpy")
    if numpy is not None and cls is numpy.ndarray:
        return "ndarray"
    data = sys.modules.get("torch.utils.data")
    if data is not None and issubclass(cls, data.DataLoader):
        return "dataloader"
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
