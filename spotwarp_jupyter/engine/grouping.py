"""Which variables must be saved together: those that reach a common object.

Two names for one object, or a model and the optimizer that holds its parameters, must be
pickled in one stream, or they come back as separate copies. A bounded walk over
`gc.get_referents` joins variables that share any mutable object.
"""

from __future__ import annotations

import gc
import types
from typing import Any, Mapping

_ATOMIC = frozenset({int, float, complex, str, bytes, bool, type(None), range, slice, type(Ellipsis)})
_STOP = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
         types.CodeType, types.FrameType)


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


def shared_groups(values: Mapping[str, Any], budget: int = 3_000_000) -> list[list[str]]:
    """Partition variable names into groups that share objects (order follows `values`)."""
    names = list(values)
    find, union = _union_find(len(names))
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
        frontier = [] if isinstance(root, _STOP) else [root]
        while frontier and visited < budget:
            # one get_referents call per level of the walk, not one per object
            next_level = []
            for obj in gc.get_referents(*frontier):
                if type(obj) in _ATOMIC or isinstance(obj, _STOP):
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
