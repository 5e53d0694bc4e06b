"""Reducers and rebuilders for NumPy arrays, string arrays, state_dict objects and data loaders.

Each `_reduce_*` returns a pickle reduce tuple, or NotImplemented for the default route; each
rebuilder is named in the streams written (see pickling.py for the names they are saved under).
"""

from __future__ import annotations

import pickle
from typing import Any

PROTOCOL = 5


def _reduce_ndarray(arr: Any):
    if arr.dtype.hasobject:
        return _reduce_str_array(arr)
    # NumPy itself sends contiguous arrays out of band; a strided view would go in band as a
    # bytes copy (then copied again into the stream): one contiguous copy out of band instead.
    if arr.flags.c_contiguous or arr.flags.f_contiguous:
        return NotImplemented
    import numpy

    return numpy.ascontiguousarray(arr).__reduce_ex__(PROTOCOL)


_STR_SEPARATOR = "\x00"


def _reduce_str_array(arr: Any):
    """An object array of plain strings (a pandas string column) as one UTF-8 buffer, out of band.

    Pickling millions of str objects one by one costs ~0.7 us each (mostly the memo); joining them
    costs ~0.05 us, and an unchanged column is then recognised by its buffer's fingerprint.
    """
    if arr.dtype.kind != "O" or arr.size < 1024 or arr.dtype.fields is not None:
        return NotImplemented
    flat = arr.ravel(order="K")
    if set(map(type, flat)) != {str}:  # map/set run in C: ~25 ns an element
        return NotImplemented
    joined = _STR_SEPARATOR.join(flat)
    if joined.count(_STR_SEPARATOR) != flat.size - 1:  # a string holds the separator itself
        return NotImplemented
    blob = joined.encode("utf-8", "surrogatepass")
    order = "F" if arr.flags.f_contiguous and not arr.flags.c_contiguous else "C"
    return (_rebuild_str_array, (pickle.PickleBuffer(blob), arr.shape, order))


def _rebuild_str_array(buf: Any, shape: tuple, order: str) -> Any:
    import numpy

    items = str(memoryview(buf), "utf-8", "surrogatepass").split(_STR_SEPARATOR)  # decoded in place: no copy
    out = numpy.empty(len(items), dtype=object)
    out[:] = items
    return out.reshape(shape, order=order)


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


def _reduce_dataloader(loader: Any):
    # a live iterator (worker processes, generators) cannot be saved: a stateful loader keeps
    # its position as the state its next iterator starts from; a plain one starts a new pass
    state = dict(loader.__dict__)
    live = state.get("_iterator")
    state["_iterator"] = None
    if "_initial_iter_for_state_dict" in state:
        state["_initial_iter_for_state_dict"] = False  # it refers to the iterator left behind
    if live is not None and "next_iter_state" in state and not getattr(live, "_finished", False):
        try:
            state["next_iter_state"] = live.state_dict()
        except Exception:  # noqa: BLE001 - saved without its position rather than not at all
            pass
    return (_new_instance, (type(loader),), state)


def _new_instance(cls: type) -> Any:
    return cls.__new__(cls)
