"""Rebuilding classes saved by value (dill streams) without running their bases' hooks twice."""

from __future__ import annotations

import sys
import types
from typing import Any, Callable


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
