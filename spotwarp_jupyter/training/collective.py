"""Collective snapshots of a `resumable` loop run by every rank of a torch.distributed process group.

At each step all ranks agree, with one all-reduce of a small flag, whether a snapshot is wanted (the cadence
timer, a preemption notice the kernel relays through a file, `safepoints.request()`): a rank alone never
snapshots, so all save the state of the same step. Each rank then writes its part through PyTorch's distributed
checkpoint (DCP), whose state-dict helpers shard and reshard DDP and FSDP2 models and their optimizers. The DCP
files become content-addressed objects of the project's store, each rank's position and random streams one
object more, and rank 0 commits one signed manifest naming them all, only once every rank reported its objects
stored: a rank that dies before leaves no manifest, and the previous snapshot is the one resumed.

A new run of the same loop (same name) continues from the newest collective snapshot: every rank loads it
(DCP reshards to the number of ranks of this run), reading no file before it is checked against its content hash
(on a local store the ranks split the checking and agree on it before any read: dcp_files), and
the pass it was taken in goes on after its last completed step; earlier passes of the loop yield nothing.
No thread of SpotWarp's touches the process group and nothing runs at exit: nothing here waits on
`destroy_process_group`, or needs it called.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Callable

from .. import safepoints
from ..engine import Manifest, Settings, SnapshotEngine, SpotWarpError
from ..engine.manifests import new_snapshot_id, package_versions
from ..engine.storage import Layout
from . import loaders
from .rng import capture_rng, restore_rng

log = logging.getLogger("spotwarp")
KIND = "collective"
NOTICE_FILE_ENV = "SPOTWARP_NOTICE_FILE"  # a file whose existence is a preemption notice (the kernel creates it)
EVERY_ENV = "SPOTWARP_EVERY"
FIRST_S = 10.0  # the first snapshot of a run: within this many seconds of its first step
REDO_S = 60.0  # at most this much training redone after a loss ...
OVERHEAD = 0.02  # ... unless snapshots would then cost more than this share of the training time
STAGING_GRACE_S = 3600.0

# builds the engine a rank writes with; a kernel installs one carrying its project, storage and key, which the
# ranks it forks inherit (otherwise: the environment, SPOTWARP_PROJECT, SPOTWARP_STORAGE, SPOTWARP_KEY)
engine_factory: Callable[[], SnapshotEngine] | None = None

# runs in rank 0 after its first commit of a run (a kernel installs one: its cell launching the ranks is then
# recorded as running inside a loop, so that a new host runs it again)
after_first_commit: Callable[[Manifest], None] | None = None

_engine: tuple[int, SnapshotEngine] | None = None
_committed_once = False
_passes: dict[str, int] = {}  # name -> passes started in this process
_resume: dict[str, Manifest | None] = {}  # name -> the snapshot this process continues from (None: none)
_notice_taken: int | None = None  # the notice file's stamp when this process last snapshotted for it
_due: float | None = None
_interval: float | None = None


def process_group() -> Any | None:
    """`torch.distributed` when this process is a rank of an initialised process group, else None."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def engine() -> SnapshotEngine:
    """This process's engine (a forked rank builds its own: an engine is never shared across a fork)."""
    global _engine
    if _engine is None or _engine[0] != os.getpid():
        made = engine_factory() if engine_factory is not None else SnapshotEngine(Settings.resolve())
        _engine = (os.getpid(), made)
    return _engine[1]


def check_state(state: Any) -> dict[str, Any]:
    """`state` as a dict of objects with state_dict()/load_state_dict(); ValueError naming the first that is not."""
    if not isinstance(state, Mapping):
        raise ValueError(f"resumable state must map names to objects with state_dict(), got {type(state).__name__}")
    for key, obj in state.items():
        if not isinstance(key, str) or not key or key.startswith("_spotwarp"):
            raise ValueError(f"resumable state: bad name {key!r} (a non-empty string not starting with _spotwarp)")
        if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
            raise ValueError(f"resumable state {key!r}: a {type(obj).__name__} has no state_dict()/load_state_dict()")
    return dict(state)


def newest(listing: list[Manifest], name: str) -> Manifest | None:
    """The newest collective snapshot of loop `name` in `listing` (newest first)."""
    return next((m for m in listing if m.kind == KIND and m.collective.get("name") == name), None)


class CollectivePass:
    """One pass of a `for` loop over a Resumable with `state`, in one rank."""

    def __init__(self, iterable: Iterable[Any], name: str, state: Mapping[str, Any]):
        self.dist = process_group()
        if self.dist is None:
            raise RuntimeError("a collective pass needs an initialised torch.distributed process group")
        import torch

        self.torch = torch
        self.iterable, self.name, self.state = iterable, name, dict(state)
        self.rank, self.world = self.dist.get_rank(), self.dist.get_world_size()
        backend = str(self.dist.get_backend())
        self.device = torch.device("cuda", torch.cuda.current_device()) if "nccl" in backend else torch.device("cpu")
        self.index = _passes.get(name, 0)
        _passes[name] = self.index + 1
        self.stateful = loaders.is_stateful(iterable)
        self.position = 0
        self.in_step = False
        self.finished = False
        _start_clock()
        if self.rank == 0 and not _resume:  # the manifest's package versions: learnt once, off the training steps
            threading.Thread(target=package_versions, name="spotwarp-env", daemon=True).start()
        if name not in _resume:
            drawn = capture_rng()
            _resume[name] = self._find_snapshot()
            restore_rng(drawn)  # a storage client may draw from `random` (retry jitter): the training must not see it
        saved = _resume[name]
        if saved is not None and self.index < int(saved.collective["pass"]):
            self._it: Iterator[Any] = iter(())  # done before the snapshot was taken
        elif saved is not None:
            _resume[name] = None
            self._load(saved)
        else:
            self._start()

    # -- the loop ------------------------------------------------------------------------------------
    def __iter__(self) -> CollectivePass:
        return self

    def __next__(self) -> Any:
        if self.finished:
            raise StopIteration
        self.in_step = False
        self._agree()
        try:
            item = next(self._it)
        except StopIteration:
            self.finished = True
            raise
        self.position += 1
        self.in_step = True
        return item

    @property
    def completed(self) -> int:
        return self.position - (1 if self.in_step else 0)

    def _start(self) -> None:
        self.start_rng = capture_rng()
        self.start_generators = loaders.generator_states(self.iterable)
        self._it = iter(self.iterable)

    def _agree(self) -> None:
        """Every rank asks the others at each step; all snapshot at the same step when any wants one."""
        global _notice_taken, _due
        wanted = 1 if safepoints.take_pending() else 0
        if _due is not None and time.monotonic() >= _due:
            wanted = 1
        notice = _notice_stamp()
        if notice is not None and notice != _notice_taken:
            wanted = 2
        flag = self.torch.tensor([wanted], dtype=self.torch.int32, device=self.device)
        self.dist.all_reduce(flag, op=self.dist.ReduceOp.MAX)
        agreed = int(flag.item())
        if agreed == 2:
            _notice_taken = notice
        if agreed and self.completed > 0:
            self.snapshot("notice" if agreed == 2 else "cadence")

    # -- saving --------------------------------------------------------------------------------------
    def _extras(self) -> dict[str, Any]:
        sampler = _sampler(self.iterable)
        extras: dict[str, Any] = {
            "pass": self.index, "position": self.completed, "rng": self.start_rng,
            "generators": self.start_generators, "rng_now": capture_rng(),
            "generators_now": loaders.generator_states(self.iterable),
            "epoch": getattr(sampler, "epoch", None),
        }
        if self.stateful:
            extras["loader"] = self.iterable.state_dict()  # type: ignore[attr-defined]
        return extras

    def snapshot(self, reason: str) -> str | None:
        """Save every rank's state at this step; rank 0 commits once all have stored theirs. The id, or None."""
        from torch.distributed import checkpoint as dcp

        from .dcp_files import hashing_writer

        started = time.perf_counter()
        extras = self._extras()  # before any I/O: a storage client may draw from `random` (retry jitter)
        eng = engine()
        lock, held, snap = None, None, [None]
        if self.rank == 0:  # the write lock first (gc leaves the new objects alone); its failure stops every rank
            try:
                lock = eng.writing()
                held = lock.__enter__()
                snap[0] = new_snapshot_id()
            except (OSError, SpotWarpError) as exc:
                lock, snap[0] = None, {"error": f"rank 0: {exc}"}
        self.dist.broadcast_object_list(snap, src=0)
        if isinstance(snap[0], dict):
            restore_rng(extras["rng_now"])
            warnings.warn(f"SpotWarp: collective snapshot of {self.name!r} not taken: {snap[0]['error']}",
                          RuntimeWarning, stacklevel=3)
            return None
        snapshot_id = str(snap[0])
        stage = _staging(eng, snapshot_id)
        outcome: list[Any] = [None]
        try:
            try:  # collective: a failure in one rank's write is raised in every rank
                writer, hashed = hashing_writer(stage, sync_files=eng.store.local)
                dcp.save(_state_dicts(self.state), storage_writer=writer)
                mine = _store_files(eng, stage, self.rank, hashed)
                position = eng.store.put_object(pickle.dumps(extras, protocol=5))
                report: Any = {"files": mine, "extras": list(position)}
            except (Exception, dcp.api.CheckpointException) as exc:  # noqa: BLE001 - the training goes on
                report = {"error": f"rank {self.rank}: {_one_line(exc)}"}
            reports: list[Any] = [None] * self.world
            self.dist.all_gather_object(reports, report)
            if self.rank == 0:
                outcome[0] = self._commit(eng, held, snapshot_id, reports, reason, started)
            self.dist.broadcast_object_list(outcome, src=0)
        finally:
            if lock is not None:
                lock.__exit__(None, None, None)
            _clear_staging(stage, self.rank)
            restore_rng(extras["rng_now"])  # the training draws as if no snapshot had been taken
        result = outcome[0]
        if isinstance(result, dict) and "error" in result:
            warnings.warn(f"SpotWarp: collective snapshot of {self.name!r} not committed: {result['error']}",
                          RuntimeWarning, stacklevel=3)
            return None
        _schedule(time.perf_counter() - started)
        self._first_commit(eng, snapshot_id)
        return snapshot_id

    def _first_commit(self, eng: SnapshotEngine, snapshot_id: str) -> None:
        global _committed_once
        if self.rank != 0 or _committed_once or after_first_commit is None:
            return
        _committed_once = True
        try:
            after_first_commit(eng.get(snapshot_id))
        except Exception as exc:  # noqa: BLE001 - the training goes on; the collective snapshot is committed
            log.warning("SpotWarp: after collective snapshot %s: %s", snapshot_id, exc)

    def _commit(self, eng: SnapshotEngine, lock: Any, snapshot_id: str, reports: list[Any], reason: str,
                started: float) -> dict[str, Any]:
        errors = [r["error"] for r in reports if "error" in r]
        if errors:
            return {"error": "; ".join(errors)}
        files = {rel: ref for r in reports for rel, ref in r["files"].items()}
        ranks = [r["extras"] for r in reports]
        objects = {oid: size for oid, size in [*files.values(), *ranks]}
        record = {"name": self.name, "world_size": self.world, "pass": self.index, "step": self.completed,
                  "files": files, "ranks": ranks, "backend": str(self.dist.get_backend()), "reason": reason}
        manifest = eng.new_manifest(KIND, f"{self.name}: pass {self.index} step {self.completed} "
                                          f"({self.world} ranks, {reason})", collective=record, objects=objects)
        manifest.id = snapshot_id
        manifest.stats = {"bytes_total": manifest.size, "ranks": self.world,
                          "duration_s": round(time.perf_counter() - started, 4)}
        try:
            eng.check_lock(lock, manifest)
            eng.commit_manifest(manifest)
        except (OSError, SpotWarpError) as exc:
            return {"error": str(exc)}
        return {"id": snapshot_id}

    # -- resuming ------------------------------------------------------------------------------------
    def _find_snapshot(self) -> Manifest | None:
        """The newest committed collective snapshot of this loop, chosen by rank 0 and checked by every rank."""
        eng = engine()
        found: list[Any] = [None]
        if self.rank == 0:
            try:
                manifest = newest(eng.manifests(), self.name)
                found[0] = manifest.id if manifest is not None else None
            except SpotWarpError as exc:
                found[0] = {"error": str(exc)}
        self.dist.broadcast_object_list(found, src=0)
        if isinstance(found[0], dict):
            raise SpotWarpError(f"resumable {self.name!r}: the store's snapshots cannot be read: {found[0]['error']}")
        return None if found[0] is None else eng.get(str(found[0]))

    def _load(self, manifest: Manifest) -> None:
        from torch.distributed import checkpoint as dcp

        from .dcp_files import CheckedReader

        record = manifest.collective
        eng = engine()
        reader = CheckedReader(eng.store, record["files"], self.rank, self.world)  # starts checking this rank's share
        state_dicts = _state_dicts(self.state)
        try:
            dcp.load(state_dicts, storage_reader=reader)
        except dcp.api.CheckpointException as exc:  # raised in every rank when one rank's read failed
            raise SpotWarpError(f"resumable {self.name!r}: snapshot {manifest.id} cannot be loaded: "
                                f"{_one_line(exc)}") from None
        _set_state_dicts(self.state, state_dicts)
        saved_world = int(record["world_size"])
        oid, size = record["ranks"][self.rank % saved_world]
        extras = pickle.loads(eng.store.read_object(oid, int(size)))
        wanted = int(extras["position"])
        if saved_world != self.world:  # the same share of the pass, in this run's partition of the data
            wanted = wanted * saved_world // self.world
        self.start_rng, self.start_generators = extras["rng"], extras.get("generators") or {}
        restore_rng(self.start_rng)
        loaders.set_generator_states(self.iterable, self.start_generators)
        sampler = _sampler(self.iterable)
        if extras.get("epoch") is not None and callable(getattr(sampler, "set_epoch", None)):
            sampler.set_epoch(extras["epoch"])
        if self.stateful and "loader" in extras:
            self.iterable.load_state_dict(extras["loader"])  # type: ignore[attr-defined]
            self._it = iter(self.iterable)
            self.position = wanted
        else:
            self._it = iter(self.iterable)
            self.position = loaders.fast_forward(self._it, wanted)
        restore_rng(extras.get("rng_now") or self.start_rng)
        loaders.set_generator_states(self.iterable, extras.get("generators_now") or {})
        if saved_world != self.world:
            log.warning("SpotWarp: resumable %r continues snapshot %s of %d ranks with %d: state resharded, "
                        "data position scaled", self.name, manifest.id, saved_world, self.world)


def _one_line(exc: BaseException) -> str:
    """The first failure a DCP CheckpointException carries (each rank's exception), else the exception."""
    failures = getattr(exc, "failures", None)
    if failures:
        rank, (inner, _trace) = min(failures.items())
        return f"rank {rank}: {_one_line(inner)}"
    return f"{type(exc).__name__}: {exc}" if not isinstance(exc, SpotWarpError) else str(exc)


def _notice_stamp() -> int | None:
    """The notice file's modification time (each notice rewrites it), None without one: one stat a step."""
    path = os.environ.get(NOTICE_FILE_ENV)
    if not path:
        return None
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


# -- cadence -------------------------------------------------------------------------------------------

def _every() -> float | None:
    text = os.environ.get(EVERY_ENV, "").strip()
    if not text or text == "auto":
        return None
    from ..engine.settings import resolve_setting

    value = resolve_setting("every", env={EVERY_ENV: text})
    return float(value) if isinstance(value, (int, float)) else None


def _start_clock() -> None:
    global _due, _interval
    if _due is None:
        _interval = _every()
        _due = time.monotonic() + (_interval if _interval is not None else FIRST_S)


def _schedule(cost_s: float) -> None:
    """The next snapshot: the fixed period, or half the redo bound unless that costs more than 2% of training."""
    global _due
    interval = _interval if _interval is not None else max(REDO_S / 2, cost_s / OVERHEAD)
    _due = time.monotonic() + interval


# -- state dicts ---------------------------------------------------------------------------------------

def _owner(optimizer: Any, modules: list[Any]) -> Any | None:
    params = {id(p) for group in optimizer.param_groups for p in group["params"]}
    return next((m for m in modules if any(id(p) in params for p in m.parameters())), None)


def _state_dicts(state: Mapping[str, Any]) -> dict[str, Any]:
    """Each object's state dict; models and their optimizers through DCP's helpers (DDP, FSDP2: sharded)."""
    import torch
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    modules = [obj for obj in state.values() if isinstance(obj, torch.nn.Module)]
    out: dict[str, Any] = {}
    for key, obj in state.items():
        if isinstance(obj, torch.nn.Module):
            out[key] = get_model_state_dict(obj)
        elif isinstance(obj, torch.optim.Optimizer) and _owner(obj, modules) is not None:
            out[key] = get_optimizer_state_dict(_owner(obj, modules), obj)
        else:
            out[key] = obj.state_dict()
    return out


def _set_state_dicts(state: Mapping[str, Any], loaded: Mapping[str, Any]) -> None:
    import torch
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    modules = [obj for obj in state.values() if isinstance(obj, torch.nn.Module)]
    for key, obj in state.items():
        if isinstance(obj, torch.nn.Module):
            set_model_state_dict(obj, loaded[key])
        elif isinstance(obj, torch.optim.Optimizer) and _owner(obj, modules) is not None:
            set_optimizer_state_dict(_owner(obj, modules), obj, loaded[key])
        else:
            obj.load_state_dict(loaded[key])


def _sampler(iterable: Any) -> Any:
    for path in ("sampler", "batch_sampler.sampler"):
        target = iterable
        for part in path.split("."):
            target = getattr(target, part, None)
        if target is not None and hasattr(target, "set_epoch"):
            return target
    return None


# -- files: DCP's folder <-> content-addressed objects ---------------------------------------------------

def _staging(eng: SnapshotEngine, snapshot_id: str) -> str:
    """Where DCP writes: beside the objects on a local store (its files are then moved in, not copied), else a temp folder."""
    if eng.store.local:
        base = eng.store.record_path(Layout.STAGING)
        _clear_stale(base)
    else:
        base = os.path.join(tempfile.gettempdir(), f"spotwarp-staging-{eng.settings.project}")
    path = os.path.join(base, snapshot_id)
    os.makedirs(path, exist_ok=True)
    return path


def _clear_stale(base: str) -> None:
    """Staging folders of snapshots that never finished (a rank killed), once old."""
    try:
        entries = list(os.scandir(base))
    except FileNotFoundError:
        return
    for entry in entries:
        try:
            if time.time() - entry.stat().st_mtime > STAGING_GRACE_S:
                shutil.rmtree(entry.path, ignore_errors=True)
        except FileNotFoundError:
            continue


def _store_files(eng: SnapshotEngine, stage: str, rank: int, hashed: Mapping[str, tuple[str, int]]) -> dict[str, list[Any]]:
    """This rank's DCP files (and the metadata, on rank 0) as objects: relative name -> [object id, size]. Their ids
    were hashed as DCP wrote them (`hashed`)."""
    from .dcp_files import written_id

    store = eng.store
    out: dict[str, list[Any]] = {}
    for entry in sorted(os.scandir(stage), key=lambda e: e.name):
        if not (entry.name.startswith(f"__{rank}_") or (rank == 0 and entry.name == ".metadata")):
            continue
        oid, size = written_id(entry.path, hashed)
        if store.local:  # moved, not copied: the same bytes under their name (an object already there: identical,
            target = store.object_path(oid)  # and the staged copy is left to _clear_staging)
            if not os.path.exists(target):
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.replace(entry.path, target)
                _fsync_dir(os.path.dirname(target))
        else:
            with open(entry.path, "rb") as f:
                store.put_object(f.read(), oid)
        out[entry.name] = [oid, size]
    return out


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _clear_staging(stage: str, rank: int) -> None:
    """Each rank removes its own files, rank 0 the rest (the others are done: they reported), in a thread: freeing
    a large file's blocks takes a while and nothing waits on it (a folder left behind is cleared once stale)."""
    threading.Thread(target=_remove_staged, args=(stage, rank), name="spotwarp-staging", daemon=True).start()


def _remove_staged(stage: str, rank: int) -> None:
    if rank == 0:
        shutil.rmtree(stage, ignore_errors=True)
        return
    try:  # rank 0 may have removed the whole folder already
        entries = list(os.scandir(stage))
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.name.startswith(f"__{rank}_"):
            try:
                os.unlink(entry.path)
            except FileNotFoundError:
                pass


__all__ = ["CollectivePass", "check_state", "engine", "newest", "process_group"]
