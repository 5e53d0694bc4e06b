"""What a resumable loop needs to know about the iterable it wraps: how to skip ahead, its generators.

Skipping never fetches data when the position can be set directly (lists, ranges, a single-process
torch DataLoader over a map-style dataset: only the sampler is advanced); otherwise items are drawn
and dropped. torchdata's StatefulDataLoader carries its own position in `state_dict()`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

_SETSTATE_ITERATORS = tuple(type(iter(x)) for x in ([], (), range(0), "", b"", bytearray()))
_GENERATOR_PATHS = ("generator", "sampler.generator", "batch_sampler.generator", "batch_sampler.sampler.generator")


def is_stateful(iterable: Any) -> bool:
    """True for loaders that save and restore their own position (torchdata StatefulDataLoader and alike)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(iterable, (torch.nn.Module, torch.optim.Optimizer)):
        return False  # iterable containers of weights, not positions (nn.Sequential, ModuleList)
    return callable(getattr(iterable, "state_dict", None)) and callable(getattr(iterable, "load_state_dict", None))


def fast_forward(iterator: Iterator[Any], count: int) -> int:
    """Advance `iterator` past `count` items, as cheaply as it allows; returns how many it had."""
    if count <= 0:
        return 0
    if isinstance(iterator, _SETSTATE_ITERATORS):
        before = iterator.__length_hint__()
        iterator.__setstate__(count)
        return min(count, before)
    if _is_map_style_single_process(iterator):
        skipped = 0
        while skipped < count:
            try:
                iterator._next_index()
            except StopIteration:
                break
            iterator._num_yielded += 1
            skipped += 1
        return skipped
    skipped = 0
    for _ in range(count):
        try:
            next(iterator)
        except StopIteration:
            break
        skipped += 1
    return skipped


def _is_map_style_single_process(iterator: Any) -> bool:
    dataloader = sys.modules.get("torch.utils.data.dataloader")
    if dataloader is None or not isinstance(iterator, dataloader._SingleProcessDataLoaderIter):
        return False
    return iterator._dataset_kind == dataloader._DatasetKind.Map and iterator._sampler_iter is not None


def generators(iterable: Any) -> dict[str, Any]:
    """The torch.Generator objects a DataLoader draws its order and seeds from, by attribute path."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    found: dict[str, Any] = {}
    for path in _GENERATOR_PATHS:
        target = iterable
        for part in path.split("."):
            target = getattr(target, part, None)
            if target is None:
                break
        if isinstance(target, torch.Generator) and all(target is not g for g in found.values()):
            found[path] = target
    return found


def generator_states(iterable: Any) -> dict[str, Any]:
    """The states of `generators(iterable)`."""
    return {path: g.get_state() for path, g in generators(iterable).items()}


def set_generator_states(iterable: Any, states: dict[str, Any]) -> None:
    """Put the states back into the generators found at the same paths."""
    for path, generator in generators(iterable).items():
        if path in states:
            generator.set_state(states[path].to("cpu"))
