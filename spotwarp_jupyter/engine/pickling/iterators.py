"""Live iterators, progress and logs: a DataLoader's iterator, a tqdm bar, a TensorBoard writer, a running thread.

A single-process DataLoader iterator over a map-style dataset is saved with the indices it has still to
yield (its batch sampler's rest, drawn once into a list that the live iterator then reads too), so the restored
one yields the very batches the old one would have. One with worker processes, or over an iterable dataset, holds
what it has in flight in other processes: it is refused with the reason. A tqdm bar comes back with its count,
total, description and settings, drawing on the restored kernel's output. A TensorBoard `SummaryWriter` comes back
writing to the same run folder (relative to the working folder when it lay under it), in a new event file beside
those restored with the workspace: TensorBoard reads the run as one. What it had not flushed at the snapshot is
not in the workspace's files. A thread cannot come back: refused with
the reason, which skips only the variable that holds it.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

from .data import _new_instance

# --- DataLoader iterators --------------------------------------------------------------------------


def is_loader_iterator(cls: type) -> bool:
    dataloader = sys.modules.get("torch.utils.data.dataloader")
    return dataloader is not None and issubclass(cls, dataloader._BaseDataLoaderIter)


def _reduce_loader_iterator(it: Any):
    dataloader = sys.modules["torch.utils.data.dataloader"]
    name = type(it).__name__
    if not isinstance(it, dataloader._SingleProcessDataLoaderIter) or type(it).__module__ != dataloader.__name__:
        raise TypeError(f"{name}: a DataLoader iterator with worker processes cannot be saved (its batches in flight "
                        "live in other processes): iterate the loader again after restore, or use resumable()")
    if it._dataset_kind != dataloader._DatasetKind.Map:
        raise TypeError(f"{name}: an iterator over an IterableDataset cannot be saved (its position is the "
                        "dataset's own): iterate the loader again after restore, or use resumable()")
    state = dict(it.__dict__)
    sampler_iter = state.get("_sampler_iter")
    if inspect.isgenerator(sampler_iter):
        if inspect.getgeneratorstate(sampler_iter) == inspect.GEN_CREATED:
            state["_sampler_iter"] = None  # not started: its order is drawn on its first batch, after restore too
        else:
            # the rest of this pass, drawn now; the live iterator reads the same list from here on
            rest = iter(list(sampler_iter))
            it._sampler_iter = state["_sampler_iter"] = rest
    return (_new_instance, (type(it),), state, None, None, _set_loader_iterator_state)


def _set_loader_iterator_state(it: Any, state: dict[str, Any]) -> None:
    it.__dict__.update(state)
    if it._sampler_iter is None:
        it._sampler_iter = iter(it._index_sampler)


# --- tqdm ------------------------------------------------------------------------------------------

def is_progress_bar(cls: type) -> bool:
    std = sys.modules.get("tqdm.std")
    return std is not None and issubclass(cls, std.tqdm)


# what a bar is made of: its constructor's keywords it keeps under the same name
_BAR_SETTINGS = ("desc", "total", "leave", "ncols", "nrows", "mininterval", "maxinterval", "ascii", "disable",
                 "unit", "unit_scale", "unit_divisor", "dynamic_ncols", "smoothing", "bar_format", "colour", "delay")


def _reduce_progress_bar(bar: Any):
    if getattr(bar, "iterable", None) is not None:
        raise TypeError(f"{type(bar).__name__}: a bar wrapping an iterable cannot be saved (the loop it drives "
                        "is not): wrap the iterable again after restore")
    settings = {k: getattr(bar, k) for k in _BAR_SETTINGS if hasattr(bar, k)}
    if not getattr(bar, "dynamic_miniters", True):
        settings["miniters"] = bar.miniters
    postfix = getattr(bar, "postfix", None)
    return (_new_progress_bar, (type(bar), settings, int(getattr(bar, "n", 0)), postfix))


def _new_progress_bar(cls: type, settings: dict[str, Any], count: int, postfix: str | None) -> Any:
    bar = cls(initial=count, **settings)
    if postfix:
        bar.set_postfix_str(postfix, refresh=False)
    return bar


# --- TensorBoard -----------------------------------------------------------------------------------

def is_summary_writer(cls: type) -> bool:
    writer = sys.modules.get("torch.utils.tensorboard.writer")
    return writer is not None and issubclass(cls, writer.SummaryWriter)


def _reduce_summary_writer(writer: Any):
    import os

    log_dir, here = str(writer.log_dir), os.getcwd()
    under = os.path.isabs(log_dir) and log_dir.startswith(here + os.sep)  # an absolute name in the workspace
    settings = {"max_queue": writer.max_queue, "flush_secs": writer.flush_secs,
                "filename_suffix": writer.filename_suffix}
    return (_new_summary_writer, (type(writer), os.path.relpath(log_dir, here) if under else log_dir, under,
                                  settings))


def _new_summary_writer(cls: type, log_dir: str, under: bool, settings: dict[str, Any]) -> Any:
    import os

    return cls(log_dir=os.path.join(os.getcwd(), log_dir) if under else log_dir, **settings)


# --- threads ---------------------------------------------------------------------------------------

def _reduce_thread(thread: Any):
    state = "running" if thread.is_alive() else "finished" if thread.ident is not None else "not started"
    raise TypeError(f"{type(thread).__name__} ({state}): a thread cannot be saved (its stack is not); "
                    "start it again after restore")
