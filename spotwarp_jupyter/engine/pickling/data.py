"""Reducers and rebuilders for NumPy arrays, string arrays, state_dict objects and data loaders.

Each `_reduce_*` returns a pickle reduce tuple, or NotImplemented for the default route; each
rebuilder is named in the streams written (see pickling.py for the names they are saved under).
"""

from __future__ import annotations

import pickle
from typing import Any

from .context import saved, say

PROTOCOL = 5


def _reduce_ndarray(arr: Any):
    if arr.dtype.hasobject:
        return _reduce_str_array(arr)
    memo = saved()
    root = _owner(arr) if memo is not None else None
    # a view of an array this stream saves, or holding more than half of it: saved as its place in that array,
    # saved once (writes go through); a smaller view alone is saved as its own bytes
    if root is not None and (id(root) in memo[1] or arr.nbytes * 2 > root.nbytes):
        memo[1].add(id(root))
        start = arr.__array_interface__["data"][0] - root.__array_interface__["data"][0]
        return (_rebuild_view, (root, start, arr.shape, arr.strides, arr.dtype, bool(arr.flags.writeable)))
    if memo is not None and arr.base is None:
        memo[1].add(id(arr))
    # NumPy itself sends contiguous arrays out of band; a strided view would go in band as a
    # bytes copy (then copied again into the stream): one contiguous copy out of band instead.
    if arr.flags.c_contiguous or arr.flags.f_contiguous:
        return NotImplemented
    import numpy

    return numpy.ascontiguousarray(arr).__reduce_ex__(PROTOCOL)


def _reduce_memmap(arr: Any):
    """A `numpy.memmap` opened on a file: its file (relative to the working folder when it lies under it), place
    and mode, and its bytes as they are now, out of band; reopened on restore when the file is there."""
    import mmap
    import os

    if not isinstance(arr.base, mmap.mmap) or not getattr(arr, "filename", None) or arr.dtype.hasobject:
        return _reduce_ndarray(arr)  # a view of a map (of its map, when saved with it), or anonymous memory
    memo = saved()
    if memo is not None:
        memo[1].add(id(arr))
    path, here = os.path.abspath(arr.filename), os.getcwd()
    relative = path.startswith(here + os.sep)
    order = "F" if arr.flags.f_contiguous and not arr.flags.c_contiguous else "C"
    data = pickle.PickleBuffer(arr)  # its bytes as they are now (out of band), whether or not the file comes back
    return (_rebuild_memmap, (os.path.relpath(path, here) if relative else path, relative, arr.dtype, arr.shape,
                              order, int(arr.offset), arr.mode, data))


def _rebuild_memmap(path: str, relative: bool, dtype: Any, shape: tuple, order: str, offset: int, mode: str,
                    buf: Any) -> Any:
    import os

    import numpy

    where = os.path.join(os.getcwd(), path) if relative else path
    data = numpy.frombuffer(buf, dtype=dtype).reshape(shape, order=order)
    try:
        if os.path.isfile(where) and os.path.getsize(where) >= offset + data.nbytes:
            mapped = numpy.memmap(where, dtype=dtype, mode="r+" if mode == "w+" else mode, offset=offset,
                                  shape=shape, order=order)
            if mode == "c":  # copy-on-write: what was written in memory only is in the snapshot
                mapped[...] = data
            return mapped
    except (OSError, ValueError):
        pass
    say(f"a numpy.memmap of {path} was restored as an in-memory copy (a plain array): {where} is not here, so "
        "writes no longer reach a file")
    if mode == "r":
        data.flags.writeable = False
    return data


def _owner(arr: Any) -> Any:
    """The plain array (or file map) owning the memory `arr` views (None when `arr` owns it, or its owner is not
    such an array)."""
    import mmap

    import numpy

    base = arr.base
    while isinstance(base, numpy.ndarray) and isinstance(base.base, numpy.ndarray):
        base = base.base
    mapped = isinstance(base, numpy.memmap) and isinstance(base.base, mmap.mmap)  # a view of a file's map
    if not (mapped or (type(base) is numpy.ndarray and base.base is None)) or base.dtype.hasobject:
        return None
    if not (base.flags.c_contiguous or base.flags.f_contiguous):
        return None
    return base


def _rebuild_view(root: Any, start: int, shape: tuple, strides: tuple, dtype: Any, writeable: bool) -> Any:
    import numpy

    view = numpy.ndarray(shape, dtype, buffer=root, offset=start, strides=strides)
    if not writeable:
        view.flags.writeable = False
    return view


_STR_SEPARATOR = "\x00"


def _reduce_str_array(arr: Any):
    """An object array of plain strings (a pandas string column) as one UTF-8 buffer, out of band.

    Pickling millions of str objects one by one costs ~0.7 us each (mostly the memo); joining them
    costs ~0.05 us, and an unchanged column is then recognised by its buffer's fingerprint. The column
    is joined STR_ITEMS strings at a time, so the GIL changes hands between slices: one join of 4M
    strings held it for 0.4 s, and a snapshot's writer threads, each waiting for it to queue its next
    write, left the disk idle meanwhile.
    """
    if arr.dtype.kind != "O" or arr.size < 1024 or arr.dtype.fields is not None:
        return NotImplemented
    flat = arr.ravel(order="K")
    pieces = []
    for start in range(0, flat.size, STR_ITEMS):
        part = flat[start:start + STR_ITEMS]
        if set(map(type, part)) != {str}:  # map/set run in C: ~25 ns an element
            return NotImplemented
        joined = _STR_SEPARATOR.join(part)
        if joined.count(_STR_SEPARATOR) != part.size - 1:  # a string holds the separator itself
            return NotImplemented
        pieces.append(joined.encode("utf-8", "surrogatepass"))
    blob = _NUL.join(pieces)  # bytes.join copies without the GIL from 1 MiB up
    order = "F" if arr.flags.f_contiguous and not arr.flags.c_contiguous else "C"
    return (_rebuild_str_array, (pickle.PickleBuffer(blob), arr.shape, order))


def _rebuild_str_array(buf: Any, shape: tuple, order: str) -> Any:
    """The array `_reduce_str_array` joined, decoded in slices of about STR_SLICE bytes (no copy of the buffer).

    One slice at a time, so the GIL changes hands between slices: decoding and splitting a column of
    millions of strings in one call would stop a restore's reading threads for its whole length.
    """
    import numpy

    view = memoryview(buf).cast("B")
    items: list[list[str]] = []
    start = 0
    while start <= len(view):
        end = _separator_after(view, start + STR_SLICE)
        items.append(str(view[start:end], "utf-8", "surrogatepass").split(_STR_SEPARATOR))
        start = end + 1
    out = numpy.empty(sum(map(len, items)), dtype=object)
    at = 0
    for part in items:
        out[at:at + len(part)] = part
        at += len(part)
    return out.reshape(shape, order=order)


STR_ITEMS = 16384  # strings joined at a time by `_reduce_str_array`: about a millisecond each
STR_SLICE = 256 * 1024  # ~10k strings of a typical column: the GIL is held well under a millisecond per slice
_NUL = _STR_SEPARATOR.encode()


def _separator_after(view: memoryview, at: int) -> int:
    """The index of the first separator byte at or after `at` (UTF-8 has a zero byte only for U+0000,
    the separator), or the end of `view`."""
    while at < len(view):
        found = bytes(view[at:at + 4096]).find(_NUL)
        if found >= 0:
            return at + found
        at += 4096
    return len(view)


# -- objects saved through state_dict() / load_state_dict() --------------------------------------

def _reduce_with_state_dict(obj: Any):
    try:
        reduced = obj.__reduce_ex__(PROTOCOL)
        state_dict = obj.state_dict()
    except Exception:  # noqa: BLE001 - fall back to plain pickling
        return NotImplemented
    if not isinstance(reduced, tuple) or len(reduced) < 2:
        return NotImplemented
    func, args, state, listitems, dictitems, setter = (tuple(reduced) + (None,) * 6)[:6]
    return (func, args, (state, state_dict, setter), listitems, dictitems, _set_state_and_load)


def _set_state_and_load(obj: Any, packed: tuple[Any, Any, Any]) -> None:
    state, state_dict, setter = packed
    if setter is not None:
        setter(obj, state)
    elif state is not None:
        _default_setstate(obj, state)
    obj.load_state_dict(state_dict)


def _default_setstate(obj: Any, state: Any) -> None:
    setstate = getattr(obj, "__setstate__", None)
    if setstate is not None:
        setstate(state)
        return
    slots = None
    if isinstance(state, tuple) and len(state) == 2:
        state, slots = state
    if state:
        obj.__dict__.update(state)
    for name, value in (slots or {}).items():
        setattr(obj, name, value)


def _reduce_optimizer(opt: Any):
    """A torch optimizer as its class, its param groups (the very parameters) and its `state_dict()`: rebuilt by
    its constructor against the restored parameters, then `load_state_dict()` (an LBFGS keeps what its
    constructor sets up). NotImplemented (pickled whole) when the constructor cannot take the defaults back."""
    import inspect

    cls = type(opt)
    try:
        signature = inspect.signature(cls.__init__)
        params = signature.parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        defaults = {k: v for k, v in opt.defaults.items() if takes_any or k in params}
        signature.bind(opt, [], **defaults)
        state_dict = opt.state_dict()
    except Exception:  # noqa: BLE001 - an optimizer of another shape: pickled whole, as before
        return NotImplemented
    groups = [dict(group) for group in opt.param_groups]
    return (_rebuild_optimizer, (cls, groups, defaults, state_dict))


def _rebuild_optimizer(cls: type, groups: list[dict[str, Any]], defaults: dict[str, Any], state_dict: Any) -> Any:
    opt = cls(groups, **defaults)
    opt.load_state_dict(state_dict)
    for group, saved_group in zip(opt.param_groups, groups):  # load_state_dict moves `params` last: as they were
        order = list(saved_group) + [k for k in group if k not in saved_group]
        if list(group) != order:
            items = {k: group[k] for k in order if k in group}
            group.clear()
            group.update(items)
    return opt


def _reduce_dataloader(loader: Any):
    # a live iterator (worker processes, generators) cannot be saved: a stateful loader keeps
    # its position as the state its next iterator starts from; a plain one starts a new pass
    state = dict(loader.__dict__)
    live = state.get("_iterator")
    state["_iterator"] = None
    pending = state.get("_get_iterator")  # a restored loader not iterated since: still to resume
    resume_seed = None
    if getattr(pending, "func", None) is _resumed_iterator:
        resume_seed = pending.args[1]
        del state["_get_iterator"]
    if "_initial_iter_for_state_dict" in state:
        state["_initial_iter_for_state_dict"] = False  # it refers to the iterator left behind
    if live is not None and "next_iter_state" in state and not getattr(live, "_finished", False):
        try:
            state["next_iter_state"] = live.state_dict()
        except Exception:  # noqa: BLE001 - saved without its position rather than not at all
            pass
    if live is not None and state.get("persistent_workers") and isinstance(getattr(live, "_base_seed", None), int):
        # persistent workers: the next epochs reuse this iterator, which drew its seed from the loader's
        # generator once; the one started after a restore must not draw it again (the shuffles would shift)
        resume_seed = live._base_seed
    return (_new_instance, (type(loader),), (state, resume_seed), None, None, _set_loader_state)


def _set_loader_state(loader: Any, packed: tuple[dict[str, Any], int | None]) -> None:
    import functools

    state, resume_seed = packed
    loader.__dict__.update(state)
    if resume_seed is not None:
        loader.__dict__["_get_iterator"] = functools.partial(_resumed_iterator, loader, resume_seed)


def _resumed_iterator(loader: Any, seed: int) -> Any:
    """The first iterator of a restored loader whose persistent workers' iterator was left behind: its workers'
    seed is drawn from a generator of its own, not from the loader's (the left-behind iterator had drawn it)."""
    import torch

    del loader.__dict__["_get_iterator"]
    generator = loader.__dict__.get("generator")
    loader.__dict__["generator"] = torch.Generator().manual_seed(seed)
    try:
        return loader._get_iterator()
    finally:
        loader.__dict__["generator"] = generator


def _new_instance(cls: type) -> Any:
    return cls.__new__(cls)
