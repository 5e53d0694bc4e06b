"""Serialization of one group of variables: pickle protocol 5 with large buffers out of band.

The fast C pickler does the work; code defined in the notebook (functions, lambdas, classes)
is handed to dill by value; names the notebook defines at top level are saved by reference to
`__main__` and listed in `requires`, so restore defines them first and identities survive.
NumPy arrays and torch tensors (parameters, gradients, optimizer state, on any device) leave
their bytes out of band, as buffers that go straight to storage without an in-memory copy.
Objects with `state_dict()` / `load_state_dict()` (torchdata's StatefulDataLoader, a GradScaler,
user classes) are saved with their state dict and get it back through `load_state_dict` on load;
torch modules, optimizers and schedulers already pickle their whole state and are left as they are.
"""

from __future__ import annotations

import io
import pickle
import sys
import threading
import types
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import dill

PROTOCOL = 5
_CODE_TYPES = (types.FunctionType, type)
_restore_notes = threading.local()


@dataclass
class Pickled:
    """One serialized group: the in-band stream, its out-of-band buffers, what it needs from `__main__`."""

    codec: str
    data: bytes
    buffers: list[memoryview]
    requires: set[str] = field(default_factory=set)
    autograd: dict[int, str] = field(default_factory=dict)  # id of a tensor saved without its graph: its grad_fn


class _NamespaceModule(types.ModuleType):
    """Stands in for `__main__` when the engine works on a plain dict namespace."""


def _main_module() -> types.ModuleType:
    override = getattr(_restore_notes, "main", None)
    return override if override is not None else sys.modules["__main__"]


class main_namespace:
    """Within this block, `__main__` lookups (save and load) use `namespace` instead of sys.modules."""

    def __init__(self, namespace: dict[str, Any] | None):
        self.namespace = namespace

    def __enter__(self) -> "main_namespace":
        main = sys.modules.get("__main__")
        if self.namespace is not None and (main is None or main.__dict__ is not self.namespace):
            module = _NamespaceModule("__main__")
            module.__dict__.update(self.namespace)
            module.__dict__["__name__"] = "__main__"
            self._module = module
            _restore_notes.main = module
        else:
            self._module = None
            _restore_notes.main = None
        return self

    def bind(self, name: str, value: Any) -> None:
        """Make `name` visible to `__main__` lookups during this block."""
        if self._module is not None:
            setattr(self._module, name, value)

    def __exit__(self, *exc: Any) -> None:
        _restore_notes.main = None


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


class _QuietBase:
    """Put first among a rebuilt class's bases so its bases' `__init_subclass__` is not run; removed after."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        pass


class _QuietSlottedBase:
    """`_QuietBase` for bases whose instances have no `__dict__` (the stand-in must not add one)."""

    __slots__ = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        pass


def _quietly(metaclass: type, name: str, bases: tuple, namespace: dict[str, Any]) -> type | None:
    """The class built with a stand-in first base that swallows `__init_subclass__`, then without it."""
    for quiet in (_QuietSlottedBase, _QuietBase):
        try:
            cls = metaclass(name, (quiet, *bases), namespace)
            cls.__bases__ = bases  # refused unless the layouts match: the slotted one first, adding nothing
        except Exception:  # noqa: BLE001 - a layout or metaclass that refuses this stand-in
            continue
        return cls
    return None


def _create_type(metaclass: type, *args: Any) -> type:
    """Rebuild a class saved by value from its already-processed namespace.

    Calling the metaclass would run the bases' `__init_subclass__` a second time on a namespace that
    already holds its effects (scikit-learn's set_output wraps `transform` again; a registry records
    the class twice). When a hook in the chain is defined in the notebook, none is run again: what
    they did is in the snapshot. When all are a library's, they run (the library's module state is
    new in this process: its registry does not know the class yet), then the class's own saved
    attributes are put back over whatever the hooks changed on it.
    """
    if len(args) != 3 or not isinstance(metaclass, type) or not issubclass(metaclass, type):
        return metaclass(*args)
    name, bases, namespace = args
    if not any("__init_subclass__" in vars(c) for b in bases for c in b.__mro__ if c is not object):
        return metaclass(name, bases, namespace)
    cls = _quietly(metaclass, name, bases, namespace)
    if cls is None:
        cls = metaclass(name, bases, namespace)
        _put_back(cls, namespace)
        return cls
    # the hooks chain through super(): run them only when none of them is the notebook's own
    owners = [c for c in cls.__mro__[1:] if c is not object and "__init_subclass__" in vars(c)]
    if owners and all(getattr(c, "__module__", None) != "__main__" and _importable(c) for c in owners):
        super(cls, cls).__init_subclass__()
        _put_back(cls, namespace)
    return cls


def _new_class(name: str, bases: tuple = (), kwds: dict[str, Any] | None = None,
               exec_body: Callable[[dict[str, Any]], Any] | None = None) -> type:
    """`types.new_class`, building the class through `_create_type`."""
    resolved = types.resolve_bases(bases)
    metaclass, namespace, kwds = types.prepare_class(name, resolved, kwds)
    if kwds:  # class keywords: only for the hooks, which is what must not run again; dill never saves any
        return types.new_class(name, bases, {"metaclass": metaclass, **kwds}, exec_body)
    if exec_body is not None:
        exec_body(namespace)
    if resolved is not bases:
        namespace["__orig_bases__"] = bases
    return _create_type(metaclass, name, resolved, namespace)


def _put_back(cls: type, namespace: dict[str, Any]) -> None:
    """Set the class's own saved attributes again, undoing what an `__init_subclass__` replaced."""
    for key, value in namespace.items():
        if key in ("__dict__", "__weakref__", "__qualname__") or vars(cls).get(key, _put_back) is value:
            continue
        try:
            setattr(cls, key, value)
        except (AttributeError, TypeError):
            pass


def _main_attr(name: str) -> Any:
    """A name the notebook defines, looked up in `__main__` at load time."""
    return getattr(_main_module(), name)


class _Reducer:
    """The reducer_override shared by the C and the dill picklers."""

    _by_value: set[int]
    requires: set[str]
    autograd: dict[int, str]

    def reducer_override(self, obj: Any):  # noqa: D401 - pickle hook
        kind = _kind_of(type(obj))
        if kind is None:
            return NotImplemented
        if kind == "tensor":
            if obj.grad_fn is not None:  # the graph is not saved (nor by torch's own pickling)
                self.autograd[id(obj)] = type(obj.grad_fn).__name__
            return _reduce_tensor(sys.modules["torch"], obj)
        if kind == "ndarray":
            return _reduce_ndarray(obj)
        if kind == "dataloader":
            return _reduce_dataloader(obj)
        if kind == "state_dict":
            return _reduce_with_state_dict(obj)
        if isinstance(obj, _CODE_TYPES):
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


def _importable(obj: Any) -> bool:
    """True when pickle can save `obj` by reference (its module and qualified name lead back to it)."""
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    if module is None:
        return False
    target: Any = module
    for part in getattr(obj, "__qualname__", "").split("."):
        if part.startswith("<"):
            return False
        target = getattr(target, part, None)
        if target is None:
            return False
    return target is obj


class _CPickler(_Reducer, pickle.Pickler):
    def __init__(self, file, buffers: list, by_value: set[int]):
        super().__init__(file, protocol=PROTOCOL, buffer_callback=buffers.append)
        self._by_value = by_value
        self.requires = set()
        self.autograd = {}


class _DillPickler(_Reducer, dill.Pickler):
    def __init__(self, file, buffers: list | None, by_value: set[int]):
        # without a buffer list (a stream nested in another), buffers go in band
        callback = buffers.append if buffers is not None else None
        dill.Pickler.__init__(self, file, protocol=PROTOCOL, buffer_callback=callback, recurse=False, byref=False)
        self._main = _main_module()
        self._by_value = by_value
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
            pickler.dump(obj)
        except Exception as exc:  # noqa: BLE001 - any failure moves on to the next codec
            first_error = first_error or exc
            last_error = exc
            continue
        views = [b.raw() for b in buffers]
        return Pickled(codec, out.getvalue(), views, set(pickler.requires), dict(pickler.autograd))
    raise last_error if isinstance(first_error, pickle.PicklingError) else first_error  # type: ignore[misc]


def loads(codec: str, data: bytes, buffers: list[Any]) -> Any:
    """Inverse of `dumps`; buffers are writable bytearrays read from storage."""
    if codec == "pickle":
        return pickle.loads(data, buffers=buffers)
    if codec == "dill":
        return _Unpickler(io.BytesIO(data), buffers=buffers).load()
    raise ValueError(f"unknown codec {codec!r}")


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


# -- NumPy arrays -------------------------------------------------------------------------------

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

    items = bytes(memoryview(buf)).decode("utf-8", "surrogatepass").split(_STR_SEPARATOR)
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


# -- torch tensors ----------------------------------------------------------------------------

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


def restore_device(device: str) -> str:
    """The device a tensor saved on `device` goes to here: the same one if present, else CPU."""
    if device == "cpu" or device.startswith("cpu"):
        return "cpu"
    mapping = getattr(_restore_notes, "device_map", None)
    if mapping and device in mapping:
        return mapping[device]
    import torch

    kind, _, index = device.partition(":")
    available = False
    if kind == "cuda":
        available = torch.cuda.is_available() and int(index or 0) < torch.cuda.device_count()
    elif kind == "mps":
        available = bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()
    if available:
        return device
    notes = getattr(_restore_notes, "moved", None)
    if notes is not None:
        notes.add(device)
    return "cpu"


class device_notes:
    """Collects the devices that were missing during one restore (they went to CPU)."""

    def __init__(self, device_map: dict[str, str] | None = None):
        self.moved: set[str] = set()
        self.device_map = device_map

    def __enter__(self) -> "device_notes":
        _restore_notes.moved = self.moved
        _restore_notes.device_map = self.device_map
        return self

    def __exit__(self, *exc: Any) -> None:
        _restore_notes.moved = None
        _restore_notes.device_map = None
