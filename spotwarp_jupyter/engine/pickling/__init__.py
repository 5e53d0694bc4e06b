"""Serialization of one group of variables: pickle protocol 5 with large buffers out of band.

The fast C pickler does the work; code defined in the notebook (functions, lambdas, classes)
is handed to dill by value; names the notebook defines at top level are saved by reference to
`__main__` and listed in `requires`, so restore defines them first and identities survive.
NumPy arrays and torch tensors (parameters, gradients, optimizer state, on any device) leave
their bytes out of band, as buffers that go straight to storage without an in-memory copy.
Objects with `state_dict()` / `load_state_dict()` (torchdata's StatefulDataLoader, a GradScaler,
user classes) are saved with their state dict and get it back through `load_state_dict` on load;
torch modules and schedulers pickle their whole state; optimizers are rebuilt from their state dict.

This module holds the picklers; the routes live in data (arrays, state_dict objects, loaders),
tensors (torch tensors), torch_modules (compiled and parametrized modules, compiled functions),
iterators (a loader's live iterator, tqdm bars, TensorBoard writers, threads refused with a reason),
handles (files, locks), classes (classes saved by value) and context (`__main__`, devices).
Streams name every rebuilder as `spotwarp_jupyter.engine.pickling.<name>`, whichever module defines it.
"""

from __future__ import annotations

import io
import pickle
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import dill

from . import classes, context, data, handles, iterators, tensors, torch_modules
from .classes import _create_type, _importable, _new_class, _put_back, _quietly  # noqa: F401
from .context import _main_module, device_notes, main_namespace, restore_device, stream_memo  # noqa: F401
from .data import (  # noqa: F401
    PROTOCOL,
    _default_setstate,
    _new_instance,
    _rebuild_memmap,
    _rebuild_optimizer,
    _rebuild_str_array,
    _rebuild_view,
    _reduce_dataloader,
    _reduce_memmap,
    _reduce_ndarray,
    _reduce_optimizer,
    _reduce_str_array,
    _reduce_with_state_dict,
    _resumed_iterator,
    _set_loader_state,
    _set_state_and_load,
)
from .handles import _recreate_lock, _recreate_rlock, _reduce_file, _reduce_lock, _reopen_file  # noqa: F401
from .iterators import (  # noqa: F401
    _new_progress_bar,
    _new_summary_writer,
    _reduce_loader_iterator,
    _reduce_progress_bar,
    _reduce_summary_writer,
    _reduce_thread,
    _set_loader_iterator_state,
)
from .tensors import _kind_of, _rebuild_storage, _rebuild_strided, _rebuild_tensor, _reduce_tensor  # noqa: F401
from .torch_modules import (  # noqa: F401
    _compile_again,
    _reduce_compiled,
    _reduce_compiled_function,
    _reduce_parametrized,
    _set_parametrized_state,
    is_compiled_function,
)

_CODE_TYPES = (types.FunctionType, type)


@dataclass
class Pickled:
    """One serialized group: the in-band stream, its out-of-band buffers, what it needs from `__main__`."""

    codec: str
    data: bytes
    buffers: list[memoryview]
    requires: set[str] = field(default_factory=set)
    autograd: dict[int, str] = field(default_factory=dict)  # id of a tensor saved without its graph: its grad_fn


def _is_top_level_main(obj: Any) -> bool:
    """True for a function or class bound in `__main__` under its own name."""
    if getattr(obj, "__module__", None) != "__main__":
        return False
    qualname = getattr(obj, "__qualname__", "")
    return "." not in qualname and "<" not in qualname and getattr(_main_module(), qualname, None) is obj


def _dill_by_value(obj: Any, parent: "_Reducer | None" = None) -> bytes:
    """`obj` by value; other top-level notebook definitions it refers to (a base class) by name.

    What the nested stream needs from `__main__`, and the tensors it saved without their graph,
    are added to `parent`'s.
    """
    pickler_buf = io.BytesIO()
    pickler = _DillPickler(pickler_buf, None, {id(obj)})
    with stream_memo():
        pickler.dump(obj)
    if parent is not None:
        parent.requires.update(pickler.requires)
        parent.autograd.update(pickler.autograd)
    return pickler_buf.getvalue()


def _load_dill(data: bytes) -> Any:
    return _Unpickler(io.BytesIO(data)).load()


class _Unpickler(dill.Unpickler):
    """dill's unpickler, rebuilding classes through `_create_type` below instead of dill's."""

    def find_class(self, module: str, name: str) -> Any:
        if name == "_create_type" and module in ("dill._dill", "dill.dill"):
            return _create_type
        if (module, name) == ("types", "new_class"):  # dill's route for classes with __orig_bases__ (Generic[T])
            return _new_class
        return super().find_class(module, name)


def _main_attr(name: str) -> Any:
    """A name the notebook defines, looked up in `__main__` at load time."""
    return getattr(_main_module(), name)


class _Reducer:
    """The reducer_override shared by the C and the dill picklers.

    The C pickler calls it for every object that is not a plain str, number, list, tuple, dict or set (each
    instance of a notebook class, say): each type's route is looked up once per pickler, in a plain dict
    (`_routes`), so an object of a type with no route of its own costs one dict lookup here."""

    _by_value: set[int]
    _routes: dict[type, str | None]
    requires: set[str]
    autograd: dict[int, str]

    def reducer_override(self, obj: Any):  # noqa: D401 - pickle hook
        cls = type(obj)
        try:
            kind = self._routes[cls]
        except KeyError:
            kind = self._routes[cls] = _kind_of(cls)
        except TypeError:  # a metaclass that leaves its classes unhashable
            kind = _kind_of(cls)
        if kind is None:
            return NotImplemented
        if kind == "tensor":
            if obj.grad_fn is not None:  # the graph is not saved (nor by torch's own pickling)
                self.autograd[id(obj)] = type(obj.grad_fn).__name__
            return _reduce_tensor(sys.modules["torch"], obj)
        if kind == "ndarray":
            return _reduce_ndarray(obj)
        if kind == "memmap":
            return _reduce_memmap(obj)
        if kind == "file":
            return _reduce_file(obj)
        if kind == "lock":
            return _reduce_lock(obj)
        if kind == "dataloader":
            return _reduce_dataloader(obj)
        if kind == "optimizer":
            return _reduce_optimizer(obj)
        if kind == "state_dict":
            return _reduce_with_state_dict(obj)
        if kind == "compiled":
            return _reduce_compiled(obj)
        if kind == "parametrized":
            return _reduce_parametrized(obj)
        if kind == "loader_iterator":
            return _reduce_loader_iterator(obj)
        if kind == "progress":
            return _reduce_progress_bar(obj)
        if kind == "summary_writer":
            return _reduce_summary_writer(obj)
        if kind == "thread":
            return _reduce_thread(obj)
        if isinstance(obj, _CODE_TYPES):
            if isinstance(obj, types.FunctionType) and is_compiled_function(obj):
                reduced = _reduce_compiled_function(obj)
                if reduced is not NotImplemented:
                    return reduced
            if id(obj) in self._by_value:
                return NotImplemented if isinstance(self, dill.Pickler) else (_load_dill, (_dill_by_value(obj, self),))
            if getattr(obj, "__module__", None) == "__main__":
                if _is_top_level_main(obj):
                    self.requires.add(obj.__qualname__)
                    return (_main_attr, (obj.__qualname__,))
                if isinstance(self, dill.Pickler):
                    return NotImplemented
                return (_load_dill, (_dill_by_value(obj, self),))
            if not _importable(obj):  # e.g. a class defined inside a function: by value, not the whole group
                return NotImplemented if isinstance(self, dill.Pickler) else (_load_dill, (_dill_by_value(obj, self),))
            return NotImplemented
        return NotImplemented


class _CPickler(_Reducer, pickle.Pickler):
    def __init__(self, file, buffers: list, by_value: set[int]):
        super().__init__(file, protocol=PROTOCOL, buffer_callback=buffers.append)
        self._by_value = by_value
        self._routes = {}
        self.requires = set()
        self.autograd = {}


class _DillPickler(_Reducer, dill.Pickler):
    def __init__(self, file, buffers: list | None, by_value: set[int]):
        # without a buffer list (a stream nested in another), buffers go in band
        callback = buffers.append if buffers is not None else None
        dill.Pickler.__init__(self, file, protocol=PROTOCOL, buffer_callback=callback, recurse=False, byref=False)
        self._main = _main_module()
        self._by_value = by_value
        self._routes = {}
        self.requires = set()
        self.autograd = {}


def dumps(obj: Any, by_value: tuple[Any, ...] = ()) -> Pickled:
    """Serialize `obj`; `by_value` lists notebook-defined code objects to save by value (not by name).

    Tries the C pickler first, then dill; raises the dill error when both fail.
    """
    ids = {id(o) for o in by_value}
    first_error: Exception | None = None
    for codec, cls in (("pickle", _CPickler), ("dill", _DillPickler)):
        out = io.BytesIO()
        buffers: list[pickle.PickleBuffer] = []
        pickler = cls(out, buffers, ids)
        try:
            with stream_memo():
                pickler.dump(obj)
        except Exception as exc:  # noqa: BLE001 - any failure moves on to the next codec
            first_error = first_error or exc
            last_error = exc
            continue
        views = [b.raw() for b in buffers]
        return Pickled(codec, out.getvalue(), views, set(pickler.requires), dict(pickler.autograd))
    raise last_error if isinstance(first_error, pickle.PicklingError) else first_error  # type: ignore[misc]


class _Discard:
    """A file that keeps nothing: pickling only to see what raises."""

    def write(self, data: Any) -> int:
        return len(data)


def failing(values: dict[str, Any], by_value: tuple[Any, ...] = ()) -> dict[str, str]:
    """The names of `values` whose value stops the group from pickling (name -> the error), found by pickling
    the values one after another through one pickler (objects shared with earlier ones are memoized, as in the
    group's stream). The codec with fewer of them is chosen: pickling the others together then succeeds."""
    ids = {id(o) for o in by_value}
    best: dict[str, str] | None = None
    for cls in (_CPickler, _DillPickler):
        pickler = cls(_Discard(), [], ids)
        errors: dict[str, str] = {}
        for name, value in values.items():
            try:
                with stream_memo():
                    pickler.dump(value)
            except Exception as exc:  # noqa: BLE001 - this value is one that fails
                lines = str(exc).strip().splitlines()
                errors[name] = f"{type(exc).__name__}: {lines[0] if lines else 'cannot be serialized'}"
        if best is None or len(errors) < len(best):
            best = errors
    return best or {}


def loads(codec: str, data: bytes, buffers: list[Any]) -> Any:
    """Inverse of `dumps`; buffers are writable bytearrays read from storage."""
    if codec == "pickle":
        return pickle.loads(data, buffers=buffers)
    if codec == "dill":
        return _Unpickler(io.BytesIO(data), buffers=buffers).load()
    raise ValueError(f"unknown codec {codec!r}")


def _stable_names() -> None:
    """Streams name rebuilders as `spotwarp_jupyter.engine.pickling.<name>` (as they did before this module was
    split): saving them under this module keeps every stream, old and new, loadable whatever the internal layout."""
    for module in (classes, context, data, handles, iterators, tensors, torch_modules):
        for name, value in vars(module).items():
            if isinstance(value, (types.FunctionType, type)) and getattr(value, "__module__", None) == module.__name__:
                if globals().get(name) is value:
                    value.__module__ = __name__


_stable_names()
