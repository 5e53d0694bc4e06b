"""Which variables must be saved together: those that reach a common object.

Two names for one object, or a model and the optimizer that holds its parameters, must be
pickled in one stream, or they come back as separate copies. A bounded walk over
`gc.get_referents` joins variables that share any mutable object.

`gc.get_referents` sees only what a type's traverse function reports, and NumPy arrays report
nothing: the objects in an object-dtype array (matplotlib's `axes` grid, a pandas object column
or Index, a Categorical's categories) and the array a view looks into are read from the array itself.
A torch tensor's storage is read from the tensor: tensors viewing one storage are saved together.
"""

from __future__ import annotations

import gc
import sys
import types
import weakref
from typing import Any, Callable, Iterable, Mapping

_ATOMIC = frozenset({int, float, complex, str, bytes, bool, type(None), range, slice, type(Ellipsis)})
_STOP = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
         types.CodeType, types.FrameType)
_METHODS = frozenset({types.MethodType, types.BuiltinMethodType})


def _bound_to(obj: Any) -> Any:
    """The object a bound method (`r.random`, `model.forward`) is bound to; None for anything else.

    Code is not walked (it is saved by name), but what a method is bound to is shared with it."""
    if type(obj) in _METHODS:
        bound = obj.__self__
        if bound is not None and not isinstance(bound, (types.ModuleType, type)):
            return bound
    return None


def _union_find(n: int):
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(a: int, b: int) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    return find, union


def _object_array_items(arr: Any) -> list[Any]:
    """The non-atomic objects an object-dtype (or structured, with object fields) NumPy array holds."""
    dtype = arr.dtype
    if not dtype.hasobject:
        return []
    if dtype.fields is not None:
        items: list[Any] = []
        for name, spec in dtype.fields.items():
            if spec[0].hasobject:
                items.extend(_object_array_items(arr[name]))
        return items
    flat = arr.ravel(order="K")
    if set(map(type, flat)) <= _ATOMIC:  # a string column: map/set run in C, ~25 ns an element
        return []
    return [obj for obj in flat if type(obj) not in _ATOMIC]


def _array_parts(arr: Any) -> list[Any]:
    """An array's hidden references: the objects it holds, and the object owning the memory a view looks into."""
    items = _object_array_items(arr)
    base = arr.base
    if base is None:
        return items
    while getattr(base, "base", None) is not None and type(base).__module__ == "numpy":
        base = base.base
    return [*items, base]


def _referent(ref: Any) -> list[Any]:
    """What a weak reference points to (a hook's handle reaches its module's hook dict this way)."""
    target = ref()
    return [] if target is None else [target]


def _tensor_storage(t: Any) -> list[Any]:
    """A tensor's storage (one Python object per storage): tensors viewing one storage are saved together."""
    if t.layout != sys.modules["torch"].strided or t.is_nested or t.device.type == "meta":
        return []
    return [t.untyped_storage()]


def _hidden_referents_finder() -> Callable[[type], Callable[[Any], list[Any]] | None]:
    """Per type: how to read the references its traverse function does not report (None: nothing hidden)."""
    numpy = sys.modules.get("numpy")
    ndarray = getattr(numpy, "ndarray", None)
    tensor = getattr(sys.modules.get("torch"), "Tensor", None)
    cache: dict[type, Callable[[Any], list[Any]] | None] = {}

    def finder(cls: type) -> Callable[[Any], list[Any]] | None:
        try:
            return cache[cls]
        except KeyError:
            pass
        found = None
        if ndarray is not None and issubclass(cls, ndarray):
            found = _array_parts
        elif tensor is not None and issubclass(cls, tensor):
            found = _tensor_storage
        elif issubclass(cls, weakref.ReferenceType):
            found = _referent
        cache[cls] = found
        return found

    return finder


def referents(objects: Iterable[Any], hidden: Callable[[type], Any] | None = None) -> list[Any]:
    """Everything `objects` refer to, including what sits inside object arrays."""
    objects = list(objects)
    hidden = hidden or _hidden_referents_finder()
    found = gc.get_referents(*objects)
    for obj in objects:
        found.extend(_read_hidden(hidden, obj))
    return found


def _read_hidden(hidden: Callable[[type], Any], obj: Any) -> list[Any]:
    """What `obj` holds that its traverse function does not report; nothing when reading it raises."""
    read = hidden(type(obj))
    if read is None:
        return []
    try:
        return read(obj)
    except Exception:  # noqa: BLE001 - an odd array subclass: its references are not followed
        return []


def shared_groups(values: Mapping[str, Any], budget: int = 3_000_000) -> list[list[str]]:
    """Partition variable names into groups that share objects (order follows `values`)."""
    names = list(values)
    find, union = _union_find(len(names))
    hidden = _hidden_referents_finder()
    owner: dict[int, int] = {}
    visited = 0
    for index, name in enumerate(names):
        root = values[name]
        if type(root) in _ATOMIC:
            continue
        other = owner.get(id(root))
        if other is not None:
            union(index, other)
            continue
        owner[id(root)] = index
        # the root itself may be code (a lambda); below it, code is shared by name, not walked
        frontier = _start(root)
        if frontier and frontier[0] is not root:  # a bound method: it shares what it is bound to
            other = owner.get(id(frontier[0]))
            if other is not None:
                union(index, other)
                continue
            owner[id(frontier[0])] = index
        while frontier and visited < budget:
            # one get_referents call per level of the walk, not one per object
            found = gc.get_referents(*frontier)
            # the few types of a level are checked, not each object (set(map(...)) runs in C)
            opaque_types = {t for t in set(map(type, frontier)) if hidden(t) is not None}
            if opaque_types:
                for container in frontier:
                    if type(container) in opaque_types:
                        found.extend(_read_hidden(hidden, container))
            next_level = []
            for obj in found:
                if type(obj) in _ATOMIC:
                    continue
                if isinstance(obj, _STOP):
                    if type(obj) not in _METHODS:  # a class (each instance's), a function, a module: not walked
                        continue
                    obj = _bound_to(obj)
                    if obj is None:
                        continue
                other = owner.get(id(obj))
                if other is not None:
                    if other != index:
                        union(index, other)
                    continue
                owner[id(obj)] = index
                next_level.append(obj)
            visited += len(frontier)
            frontier = next_level
    groups: dict[int, list[str]] = {}
    for index, name in enumerate(names):
        groups.setdefault(find(index), []).append(name)
    return list(groups.values())


def _start(root: Any) -> list[Any]:
    """Where the walk from a variable starts: the value, or for code what a bound method is bound to."""
    if not isinstance(root, _STOP):
        return [root]
    bound = _bound_to(root)
    return [] if bound is None else [bound]


def reaching(values: Mapping[str, Any], targets: set[int], budget: int = 1_000_000) -> dict[str, set[int]]:
    """For each name, the objects among `targets` (by id) that its value is or reaches (names reaching none left out)."""
    hidden = _hidden_referents_finder()
    out: dict[str, set[int]] = {}
    for name, root in values.items():
        found = {id(root)} & targets
        seen = {id(root)}
        frontier = [] if isinstance(root, _STOP) else [root]
        visited = 0
        while frontier and visited < budget and found != targets:
            next_level = []
            for obj in referents(frontier, hidden):
                if type(obj) in _ATOMIC or isinstance(obj, _STOP) or id(obj) in seen:
                    continue
                seen.add(id(obj))
                if id(obj) in targets:
                    found.add(id(obj))
                next_level.append(obj)
            visited += len(frontier)
            frontier = next_level
        if found:
            out[name] = found
    return out
