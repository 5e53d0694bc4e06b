"""Capture: the kernel-save pipeline's first stages, from a namespace to serialized variable groups.

The stages, in this order (each one's result is what the next works on):

  1. select      `select_variables`: the values worth saving, the modules, what is skipped and why
  2. take over   `ReusePlan.split` (incremental/reuse.py): the plan's groups no code touched since, named
                 again as they are (KernelImage.takeover); their variables leave the values
  3. announce    the `on_values` callback of `KernelImage.iter_groups` sees the values left, before the
                 grouping walk: a writer starts storing their large buffers (save._Writer.announce)
  4. group       `group_order`: variables sharing objects together, the bulky groups first
  5. serialize   `serialize_group`, one group at a time, as the groups are asked for
  6. persist     save.persist_image stores each group as it comes out of stage 5

Stage 1 runs in `capture_namespace` (which serializes the engine's own state, `extras`, with it); stages
2 to 5 run when the groups are first asked for (`KernelImage.iter_groups`), so writing the first groups
overlaps serializing the next, and the engine may drop a stale reuse plan before stage 2
(`KernelImage.drop_reuse`). Nothing here writes to storage.
"""

from __future__ import annotations

import io
import socket
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from .. import pickling
from ..incremental import ReusePlan, Takeover
from ..records import GroupRecord
from ..units import format_size
from .grouping import reaching, shared_groups

EXTRAS_NAME = "@extras"
# files opened by name are reopened on restore (pickling/handles.py); in-memory ones pickle as they are
_SAVED_IO = (io.TextIOWrapper, io.BufferedReader, io.BufferedWriter, io.BufferedRandom, io.FileIO, io.StringIO,
             io.BytesIO)
_NEVER_PICKLABLE = {
    types.GeneratorType: "generators cannot be saved (re-create it after restore)",
    types.CoroutineType: "coroutines cannot be saved",
    types.AsyncGeneratorType: "async generators cannot be saved",
    socket.socket: "open sockets cannot be saved",
}


@dataclass
class CaptureOptions:
    """Which variables to save (the policy's --include / --exclude / --max-var-size)."""

    include: frozenset[str] | None = None
    exclude: frozenset[str] = frozenset()
    max_var_size: int | None = None


@dataclass
class GroupImage:
    """Variables that share objects, serialized together."""

    names: list[str]
    pickled: pickling.Pickled
    types: dict[str, str]

    @property
    def nbytes(self) -> int:
        return len(self.pickled.data) + sum(b.nbytes for b in self.pickled.buffers)


# sees the values about to be grouped and serialized (stage 3), before the grouping walk
OnValues = Callable[[Mapping[str, Any]], None]


@dataclass
class _Ahead:
    """What stages 2 to 5 work on: the selected values and the options they were selected with."""

    values: dict[str, Any]
    options: CaptureOptions


@dataclass
class KernelImage:
    """A consistent, serialized image of one kernel's variables, ready to be persisted.

    `groups` holds the groups serialized so far; the others are serialized as `iter_groups` asks for them.
    `skipped` (not saved) and `changed` (saved, but not as they were) are complete only once every group
    is serialized. `takeover` is stage 2's result: None until it ran, or when there was no plan.
    """

    groups: list[GroupImage] = field(default_factory=list)
    imports: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    changed: dict[str, str] = field(default_factory=dict)
    reuse: ReusePlan | None = None
    takeover: Takeover | None = field(default=None, init=False)
    _ahead: _Ahead | None = field(default=None, init=False, repr=False)
    _pending: Iterator[GroupImage] | None = field(default=None, init=False, repr=False)

    @property
    def reused(self) -> tuple[GroupRecord, ...]:
        """Previous group records taken over as they are (stage 2)."""
        return self.takeover.groups if self.takeover is not None else ()

    def drop_reuse(self) -> str:
        """Serialize every variable: the plan's base is stale. Only before stage 2; returns the base's id."""
        if self.reuse is None or self.takeover is not None:
            raise RuntimeError("no reuse plan to drop: it is taken over already, or there is none")
        base, self.reuse = self.reuse.base_id, None
        return base

    def iter_groups(self, on_values: OnValues | None = None) -> Iterator[GroupImage]:
        """Every group, serializing pending ones on demand (and keeping them in `groups`).

        The first call runs stages 2 to 5 (see the module's docstring), handing `on_values` the values
        about to be grouped; later calls find them run and ignore it.
        """
        yield from list(self.groups)
        if self._ahead is not None:
            ahead, self._ahead = self._ahead, None
            self._pending = self._stages(ahead, on_values)
        while self._pending is not None:
            group = next(self._pending, None)
            if group is None:
                self._pending = None
                break
            self.groups.append(group)
            yield group

    def _stages(self, ahead: _Ahead, on_values: OnValues | None) -> Iterator[GroupImage]:
        """Stages 2 to 5, in order; a generator: each group is serialized when it is asked for."""
        rest = self._take_over(ahead.values)
        if on_values is not None:
            on_values(rest)
        for names in group_order(rest):
            yield from serialize_group(names, rest, self.skipped, ahead.options.max_var_size, self.changed)

    def _take_over(self, values: dict[str, Any]) -> dict[str, Any]:
        """Stage 2: keep `takeover` and its `changed` notes; the values left to serialize."""
        if self.reuse is None:
            return values
        self.takeover = self.reuse.split(values)
        self.changed.update(self.takeover.changed)
        taken = self.takeover.names
        return {n: v for n, v in values.items() if n not in taken}

    def materialize(self) -> "KernelImage":
        """Serialize everything now (needed before state on a GPU can be released, or a fork)."""
        for _ in self.iter_groups():
            pass
        return self

    @property
    def nbytes(self) -> int:
        return sum(g.nbytes for g in self.groups)


def type_name(value: Any) -> str:
    t = type(value)
    return t.__qualname__ if t.__module__ in ("builtins", "__main__") else f"{t.__module__}.{t.__qualname__}"


def _error_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else 'cannot be serialized'}"


def cheap_size(value: Any) -> int | None:
    """Bytes an array or tensor holds, read from its attributes without serializing it; None for other values.

    A sparse tensor holds its indices and values (its `nbytes` raises). Raises what the value's attributes raise.
    """
    layout = getattr(value, "layout", None)
    if layout is not None and "sparse" in str(layout) and hasattr(value, "values"):
        return _sparse_size(value)
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if hasattr(value, "element_size") and hasattr(value, "numel"):
        try:
            return int(value.element_size() * value.numel())
        except Exception:  # noqa: BLE001
            return None
    return None


def _sparse_size(t: Any) -> int:
    """Bytes of a sparse tensor's parts: COO indices and values, or compressed (CSR, CSC, BSR, BSC) indices and values."""
    if str(t.layout) == "torch.sparse_coo":
        parts = [t._indices(), t._values()]
    else:
        rows = t.crow_indices() if str(t.layout) in ("torch.sparse_csr", "torch.sparse_bsr") else t.ccol_indices()
        cols = t.col_indices() if str(t.layout) in ("torch.sparse_csr", "torch.sparse_bsr") else t.row_indices()
        parts = [rows, cols, t.values()]
    return sum(int(p.element_size() * p.numel()) for p in parts)


def select_variables(
    namespace: Mapping[str, Any], hidden: Mapping[str, Any] | None, options: CaptureOptions
) -> tuple[dict[str, Any], dict[str, str], dict[str, str]]:
    """Split a namespace into (values to save, modules by name, skipped names with reasons).

    Whatever a value raises while it is looked at (a property, `nbytes`, `__class__`) skips only it, with the reason.
    """
    values: dict[str, Any] = {}
    imports: dict[str, str] = {}
    skipped: dict[str, str] = {}
    hidden = hidden or {}
    for name, value in list(namespace.items()):
        if name.startswith("_") or (name in hidden and hidden[name] is value):
            continue
        if options.include is not None and name not in options.include:
            continue
        if name in options.exclude:
            skipped[name] = "excluded by policy"
            continue
        try:
            module, reason = _look_at(value, options)
        except Exception as exc:  # noqa: BLE001 - one variable never fails the snapshot
            module, reason = None, f"{type_name(value)}: could not be looked at ({_error_line(exc)})"
        if module is not None:
            imports[name] = module
        elif reason:
            skipped[name] = reason
        else:
            values[name] = value
    return values, imports, skipped


def _look_at(value: Any, options: CaptureOptions) -> tuple[str | None, str | None]:
    """(the module's import path if `value` is a module, why it is not saved); (None, None): save it."""
    if isinstance(value, types.ModuleType):
        return import_path(value), None
    reason = _NEVER_PICKLABLE.get(type(value))
    if reason is None and isinstance(value, io.IOBase) and not isinstance(value, _SAVED_IO):
        reason = "open files cannot be saved (re-open it after restore)"
    if reason:
        return None, f"{type_name(value)}: {reason}"
    size = cheap_size(value)
    if options.max_var_size is not None and size is not None and size > options.max_var_size:
        return None, f"{format_size(size)} is over --max-var-size {format_size(options.max_var_size)}"
    return None, None


def import_path(module: types.ModuleType) -> str:
    """The name a module is imported by: its `__name__`, unless that does not lead back to it (an extension's
    submodule, `from tokenizers import trainers`, is named `trainers`): then where the import system, or a
    loaded package's attribute, holds it (`tokenizers.trainers`, restored as an attribute of its package)."""
    name = module.__name__
    if sys.modules.get(name) is module:
        return name
    for key, loaded in list(sys.modules.items()):
        if loaded is module:
            return key
    short = name.rpartition(".")[2]
    # the notebook's own namespace holds it too (`from tokenizers import trainers`): never where it is imported from
    holders = [key for key, loaded in list(sys.modules.items())
               if isinstance(loaded, types.ModuleType) and loaded.__dict__.get(short) is module
               and key != "__main__" and getattr(loaded, "__name__", None) != "__main__"]
    return f"{min(holders, key=len)}.{short}" if holders else name


def _by_value(group: Mapping[str, Any]) -> tuple[Any, ...]:
    """Notebook-defined functions and classes bound under their own name: the definitions themselves."""
    return tuple(
        value for name, value in group.items()
        if isinstance(value, (types.FunctionType, type))
        and getattr(value, "__module__", None) == "__main__"
        and getattr(value, "__qualname__", None) == name
    )


def serialize_group(names: list[str], values: Mapping[str, Any], skipped: dict[str, str],
                    max_size: int | None = None, changed: dict[str, str] | None = None) -> list[GroupImage]:
    """Serialize names together; if that fails, each alone, skipping (with a reason) what cannot be saved.

    Variables saved but not as they were (tensors without their autograd graph) go into `changed`.
    """
    group = {n: values[n] for n in names}
    try:
        pickled = pickling.dumps(group, by_value=_by_value(group))
        image = GroupImage(names, pickled, {n: type_name(values[n]) for n in names})
    except Exception as exc:  # noqa: BLE001 - whatever one variable raises skips only it
        if len(names) == 1:
            skipped[names[0]] = _error_line(exc)
            return []
        return _without_failing(names, values, skipped, max_size, changed)
    pickled.requires -= set(names)
    if max_size is not None and image.nbytes > max_size:
        for n in names:
            skipped[n] = f"{format_size(image.nbytes)} is over --max-var-size {format_size(max_size)}"
        return []
    if pickled.autograd and changed is not None:
        changed.update(_without_graph(group, pickled.autograd))
    return [image]


def _without_failing(names: list[str], values: Mapping[str, Any], skipped: dict[str, str],
                     max_size: int | None, changed: dict[str, str] | None) -> list[GroupImage]:
    """A group that failed to pickle: skip the variables that cannot be pickled, keep the others together
    (those that still share objects once it is left out: pickled apart they would come back as copies).
    Each alone when none stands out."""
    group = {n: values[n] for n in names}
    try:
        culprits = pickling.failing(group, by_value=_by_value(group))
    except Exception:  # noqa: BLE001 - no better answer than each alone
        culprits = {}
    rest = [n for n in names if n not in culprits]
    if not culprits or not rest:
        out: list[GroupImage] = []
        for name in names:
            out.extend(serialize_group([name], values, skipped, max_size, changed))
        return out
    skipped.update(culprits)
    out = []
    # grouped again: what joined them may have been the variable left out (a session holding the namespace)
    for names_left in shared_groups({n: values[n] for n in rest}):
        out.extend(serialize_group(names_left, values, skipped, max_size, changed))
    return out


def _without_graph(group: Mapping[str, Any], autograd: Mapping[int, str]) -> dict[str, str]:
    """Why each variable of `group` holding a tensor saved without its autograd graph changed."""
    try:
        holders = reaching(group, set(autograd)) if len(group) > 1 else {n: set(autograd) for n in group}
    except Exception:  # noqa: BLE001 - a value that cannot be walked: said of the whole group
        holders = {}
    if not holders:  # out of the walk's reach: say it of the whole group rather than of no one
        holders = {n: set(autograd) for n in group}
    reasons: dict[str, str] = {}
    for name, ids in holders.items():
        kinds = ", ".join(sorted({autograd[i] for i in ids}))
        what = "a tensor" if len(ids) == 1 else f"{len(ids)} tensors"
        reasons[name] = (f"{what} saved without its autograd graph (grad_fn={kinds}): restored as a leaf, "
                         "no longer connected to what it was computed from")
    return reasons


def group_order(values: Mapping[str, Any]) -> list[list[str]]:
    """Stage 4: the names of `values` in groups sharing objects, bulky groups first: their buffers start
    writing while the small-object groups are pickled."""
    return sorted(shared_groups(values), key=lambda names: not any(_bulky(values[n]) for n in names))


def capture_namespace(
    namespace: Mapping[str, Any],
    hidden: Mapping[str, Any] | None = None,
    options: CaptureOptions | None = None,
    extras: Mapping[str, Any] | None = None,
    lazy: bool = False,
    reuse: ReusePlan | None = None,
) -> KernelImage:
    """Serialize every saveable variable of `namespace` (plus `extras`, engine state such as RNGs).

    Stage 1 runs now. With `lazy`, stages 2 to 5 run as the image is persisted (KernelImage.iter_groups);
    without, now. With `reuse`, groups no code touched since the plan's snapshot keep that snapshot's record.
    """
    options = options or CaptureOptions()
    values, imports, skipped = select_variables(namespace, hidden, options)
    image = KernelImage(imports=imports, skipped=skipped, reuse=reuse)
    if extras:
        pickled = pickling.dumps({EXTRAS_NAME: dict(extras)})
        image.groups.append(GroupImage([EXTRAS_NAME], pickled, {EXTRAS_NAME: "spotwarp state"}))
    image._ahead = _Ahead(values, options)
    return image if lazy else image.materialize()


def _bulky(value: Any) -> bool:
    """Values whose bytes are mostly out-of-band buffers (arrays, tensors, models, optimizers)."""
    try:
        if cheap_size(value) is not None:
            return True
        return any(hasattr(value, attr) for attr in ("state_dict", "parameters")) and not isinstance(value, type)
    except Exception:  # noqa: BLE001 - only an ordering hint
        return False
