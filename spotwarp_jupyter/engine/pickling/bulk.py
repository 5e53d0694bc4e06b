"""The large buffers a group's stream will hand out of band, found before it is pickled.

A snapshot can start writing these while it is still working out which variables go together
(`grouping.shared_groups` walks every object) and pickling them: the buffers are the same memory
whichever group saves them. Each is the very view the stream's pickler will hand over (same address,
same size), so the writer can tell it again when it arrives. Only what is cheap to find is named: arrays,
CPU tensors, the parameters, buffers and gradients of torch modules, optimizer state, and such values
held directly in a dict, list or tuple. Nothing here is required to be complete; what is named but never
handed over (a variable that then fails to pickle) is simply not used.
"""

from __future__ import annotations

import pickle
import sys
from typing import Any, Iterable, Iterator, Mapping

from ..pages import address
from .data import _owner
from .tensors import holds_most_of, reduced_here, storage_buffer

MAX_ITEMS = 4096  # a dict, list or tuple is looked into up to this many items (a state dict; not a dataset)


def bulk_buffers(values: Mapping[str, Any], min_size: int) -> list[memoryview]:
    """The out-of-band buffers of at least `min_size` bytes that pickling `values` will hand over (each once)."""
    torch = sys.modules.get("torch")
    numpy = sys.modules.get("numpy")
    found: dict[tuple[int, int], memoryview] = {}
    for value in values.values():
        try:  # whatever a value raises when looked at (a property, `parameters()`) leaves it to the pickler
            views = [_buffer_of(leaf, torch, numpy, min_size) for leaf in _leaves(value, torch)]
        except Exception:  # noqa: BLE001
            continue
        for view in views:
            start = address(view) if view is not None else None
            if start is not None:
                found.setdefault((start, view.nbytes), view)
    return list(found.values())


def _leaves(value: Any, torch: Any) -> Iterator[Any]:
    """The arrays and tensors `value` is or holds where they are cheap to reach."""
    if isinstance(value, (dict, list, tuple)):
        if len(value) > MAX_ITEMS:  # a collection of many small objects: not worth a look
            return
        items: Iterable[Any] = value.values() if isinstance(value, dict) else value
        for item in items:
            if not isinstance(item, (dict, list, tuple)):
                yield from _leaves(item, torch)
        return
    if torch is not None:
        if isinstance(value, torch.nn.Module):
            for t in (*value.parameters(), *value.buffers()):
                yield t
                if t.grad is not None:
                    yield t.grad
            return
        if isinstance(value, torch.optim.Optimizer):
            for state in value.state.values():
                yield from (v for v in state.values() if isinstance(v, torch.Tensor))
            return
    yield value


def _buffer_of(value: Any, torch: Any, numpy: Any, min_size: int) -> memoryview | None:
    if torch is not None and isinstance(value, torch.Tensor):
        if value.device.type != "cpu" or not reduced_here(torch, value) or value.is_conj() or value.is_neg():
            return None
        storage = value.untyped_storage()
        if storage.nbytes() < min_size or not holds_most_of(value, storage):
            return None
        return storage_buffer(torch, storage).raw()
    if numpy is not None and type(value) is numpy.ndarray and not value.dtype.hasobject:
        root = _owner(value)
        if root is not None:  # a view: saved as its place in the array owning the memory, if it holds most of it
            if value.nbytes * 2 <= root.nbytes or type(root) is not numpy.ndarray:
                return None
            value = root
        elif not (value.flags.c_contiguous or value.flags.f_contiguous):
            return None
        return pickle.PickleBuffer(value).raw() if value.nbytes >= min_size else None
    return None
