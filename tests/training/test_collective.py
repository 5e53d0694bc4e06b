"""Collective snapshots of training over torch.distributed ranks (gloo, CPU), with real launches as users make them.

Every run is `tests/support/dcp_training.py`: a launcher process forking its ranks with
`torch.multiprocessing.start_processes(..., start_method="fork")`, each rank training over
`spotwarp.resumable(loader, name="train", state=...)` (or a kernel's cell launching them, with start_processes
or accelerate's notebook_launcher); runs share only the store. A run killed (SIGKILL of the
launcher and its ranks) continues in a new launch, and what it ends with must be an uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from spotwarp_jupyter.engine import Manifest
from spotwarp_jupyter.protocol import NoticeRequest

from engines import make_engine
from kernels import notice_request
from storage_servers import free_port
from waiting import wait_for

pytestmark = pytest.mark.slow  # each launch starts torch in 3-5 processes and a gloo group

PROGRAM = Path(__file__).resolve().parents[1] / "support" / "dcp_training.py"
KEY = "collective-test-key"
EPOCHS, STEPS = 2, 32  # 512 samples, 2 ranks, batches of 8
PROJECT = "dist"



def _env(store: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "SPOTWARP_STORAGE": str(store), "SPOTWARP_PROJECT": PROJECT, "SPOTWARP_KEY": KEY,
           "SPOTWARP_EVERY": "1h", "PYTHONPATH": os.pathsep.join(sys.path), **extra}
    return env


def _config(tmp: Path, out: Path, **cfg: Any) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = tmp / f"cfg-{free_port()}.json"
    path.write_text(json.dumps({"out": str(out), "nprocs": 2, "port": free_port(), "mode": "ddp", "epochs": EPOCHS, **cfg}))
    return path


def launch(tmp: Path, store: Path, out: Path, env: dict[str, str] | None = None, **cfg: Any) -> subprocess.CompletedProcess:
    """One whole run, to its end."""
    return subprocess.run([sys.executable, str(PROGRAM), str(_config(tmp, out, **cfg))], env=env or _env(store),
                          capture_output=True, text=True, timeout=300)


def start(tmp: Path, store: Path, out: Path, **cfg: Any) -> subprocess.Popen:
    """A run in a process group of its own (killed as a host dies: launcher and ranks at once)."""
    return subprocess.Popen([sys.executable, str(PROGRAM), str(_config(tmp, out, **cfg))], env=_env(store),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def collective(store: Path) -> list[Manifest]:
    engine = make_engine(store, PROJECT, key=KEY, resolved=False)
    return [m for m in engine.manifests() if m.kind == "collective"]


def results(out: Path, ranks: int = 2) -> list[dict]:
    return [json.loads((out / f"result-{r}.json").read_text()) for r in range(ranks)]


def losses(out: Path, rank: int) -> dict[tuple[int, int], float]:
    """(epoch, first sample) -> loss; a step redone after a resume replaces the line of its first run."""
    lines = (out / f"losses-{rank}.jsonl").read_text().splitlines()
    return {(e, i): loss for e, i, loss in map(json.loads, lines)}


def steps_logged(out: Path, rank: int) -> int:
    path = out / f"losses-{rank}.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def assert_same_run(out: Path, baseline: Path) -> None:
    assert results(out) == results(baseline)  # weights, then torch, random and numpy draws of each rank
    for rank in range(2):
        assert losses(out, rank) == losses(baseline, rank)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted run (no snapshot taken)."""
    tmp = tmp_path_factory.mktemp("baseline")
    done = launch(tmp, tmp / "store", tmp / "out")
    assert done.returncode == 0, done.stdout + done.stderr
    assert not collective(tmp / "store")
    return tmp / "out"


def test_killed_run_continues_bit_identical(tmp_path: Path, baseline: Path) -> None:
    store, out = tmp_path / "store", tmp_path / "out"
    run = start(tmp_path, store, out, request_at=[[0, 5]], gate_at=[1, 3])
    try:
        wait_for(lambda: (out / "reached").exists(), "rank 0 at epoch 1 step 3", timeout=120)
        [snapshot] = collective(store)
        assert (snapshot.collective["pass"], snapshot.collective["step"], snapshot.collective["world_size"]) == (0, 6, 2)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    before = steps_logged(out, 0)
    assert before == STEPS + 3
    # newer snapshots of other kinds, then gc: a loop's newest collective snapshot and its objects stay
    engine = make_engine(store, PROJECT, key=KEY, resolved=False)
    engine.snapshot_kernel({"x": 1})
    engine.gc(keep=1, grace_s=0)
    assert [m.id for m in collective(store)] == [snapshot.id] and engine.verify().ok
    done = launch(tmp_path, store, out)
    assert done.returncode == 0, done.stdout + done.stderr
    assert steps_logged(out, 0) - before == EPOCHS * STEPS - 6  # it continued after step 6, not from the start
    assert_same_run(out, baseline)


def test_snapshot_and_resume_through_an_object_store(tmp_path: Path, object_storage, baseline: Path) -> None:
    env = _env(tmp_path, **object_storage.kernel_env())
    out = tmp_path / "out"
    done = launch(tmp_path, tmp_path, out, env=env, request_at=[[0, 5]], stop_after_request=True)
    assert done.returncode == 0, done.stdout + done.stderr
    done = launch(tmp_path, tmp_path, out, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert steps_logged(out, 0) == 6 + EPOCHS * STEPS - 6  # the second launch continued after step 6
    assert_same_run(out, baseline)


def test_rank_killed_mid_snapshot_leaves_the_previous_one(tmp_path: Path, baseline: Path) -> None:
    store, out = tmp_path / "store", tmp_path / "out"
    # rank 1 dies inside the second snapshot (its 2nd state_dict() of the user's state)
    done = launch(tmp_path, store, out, request_at=[[0, 5], [0, 20]], die_at=[1, 2])
    assert done.returncode != 0
    [snapshot] = collective(store)
    assert snapshot.collective["step"] == 6
    engine = make_engine(store, PROJECT, key=KEY, resolved=False)
    assert engine.verify().ok
    before = steps_logged(out, 0)
    done = launch(tmp_path, store, out)
    assert done.returncode == 0, done.stdout + done.stderr
    assert steps_logged(out, 0) - before == EPOCHS * STEPS - 6
    assert_same_run(out, baseline)


@pytest.mark.parametrize("rank,where", [(1, "write"), (1, "store"), (0, "commit")])
def test_rank_killed_in_a_snapshots_write_store_or_commit(tmp_path: Path, baseline: Path, rank: int, where: str) -> None:
    """Killed while DCP writes its file, while its objects are stored, or (rank 0) once all reported: no commit."""
    store, out = tmp_path / "store", tmp_path / "out"
    done = launch(tmp_path, store, out, request_at=[[0, 5], [0, 20]], die_at=[rank, 2, where])
    assert done.returncode != 0
    assert [m.collective["step"] for m in collective(store)] == [6]
    engine = make_engine(store, PROJECT, key=KEY, resolved=False)
    assert engine.verify().ok
    before = steps_logged(out, 0)
    assert before == 21  # killed in the snapshot after step 21
    done = launch(tmp_path, store, out)
    assert done.returncode == 0, done.stdout + done.stderr
    assert steps_logged(out, 0) - before == EPOCHS * STEPS - 6
    assert_same_run(out, baseline)


def test_rank_killed_storing_into_an_object_store_leaves_the_previous_one(tmp_path: Path, object_storage,
                                                                         baseline: Path) -> None:
    """Rank 1 dies as it starts uploading its shard (DCP's files all written, rank 0's stored): no commit."""
    env, out = _env(tmp_path, **object_storage.kernel_env()), tmp_path / "out"
    done = launch(tmp_path, tmp_path, out, env=env, request_at=[[0, 5], [0, 20]], die_at=[1, 2, "store"])
    assert done.returncode != 0 and steps_logged(out, 0) == 21
    engine = make_engine(object_storage, PROJECT, key=KEY, resolved=False)
    assert [m.collective["step"] for m in engine.manifests() if m.kind == "collective"] == [6]
    assert engine.verify().ok
    done = launch(tmp_path, tmp_path, out, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert steps_logged(out, 0) - 21 == EPOCHS * STEPS - 6
    assert_same_run(out, baseline)


def test_damaged_or_unsigned_shard_refused(tmp_path: Path, baseline: Path) -> None:
    store = tmp_path / "store"
    out = tmp_path / "out"
    done = launch(tmp_path, store, out, request_at=[[0, 5]], stop_after_request=True)
    assert done.returncode == 0, done.stdout + done.stderr
    [signed] = collective(store)
    assert (signed.collective["pass"], signed.collective["step"], signed.signed) == (0, 6, True)

    # a newer manifest written without the key, further on: skipped, the signed one is resumed
    forged = Manifest.from_bytes(signed.to_bytes(KEY.encode()), key=KEY.encode())
    forged.id, forged.created = "forged22", signed.created + 1
    forged.collective = {**forged.collective, "step": 20}
    (store / PROJECT / "snapshots" / forged.name).write_bytes(forged.to_bytes(None))
    done = launch(tmp_path, store, out)
    assert done.returncode == 0, done.stdout + done.stderr
    assert steps_logged(out, 0) == EPOCHS * STEPS
    assert_same_run(out, baseline)

    # a shard whose bytes were replaced: the ranks refuse to load it, naming the object
    oid = signed.collective["files"]["__1_0.distcp"][0]
    shard = store / PROJECT / "objects" / oid[:2] / oid
    data = bytearray(shard.read_bytes())
    data[-200] ^= 0xFF
    shard.write_bytes(bytes(data))
    out = tmp_path / "out-damaged"
    done = launch(tmp_path, store, out)
    assert done.returncode != 0
    assert f"object {oid} is damaged" in done.stdout + done.stderr
    assert not (out / "result-0.json").exists()


@pytest.fixture(scope="module")
def fsdp_saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A 2-rank FSDP2 run's store, snapshotted after step 4, and the full state it saved."""
    tmp = tmp_path_factory.mktemp("fsdp")
    done = launch(tmp, tmp / "store", tmp / "saved", mode="fsdp", request_at=[[0, 3]], stop_after_request=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return tmp / "store", torch.load(tmp / "saved" / "full-2.pt")


@pytest.mark.parametrize("ranks", [1, 4])
def test_fsdp2_snapshot_reshards(tmp_path: Path, fsdp_saved: tuple[Path, dict], ranks: int) -> None:
    store, saved = fsdp_saved
    done = launch(tmp_path, store, tmp_path / "restored", mode="fsdp", nprocs=ranks, dump_restored=True)
    assert done.returncode == 0, done.stdout + done.stderr
    restored = torch.load(tmp_path / "restored" / f"full-{ranks}.pt")
    assert set(restored["model"]) == set(saved["model"])
    for name, tensor in saved["model"].items():
        assert torch.equal(restored["model"][name], tensor), name
    assert restored["optim"]["param_groups"] == saved["optim"]["param_groups"]
    for fqn, values in saved["optim"]["state"].items():
        for key, value in values.items():
            assert torch.equal(torch.as_tensor(restored["optim"]["state"][fqn][key]), torch.as_tensor(value)), (fqn, key)


def test_a_notice_to_the_kernel_reaches_every_rank(start_kernel, store_url: str, tmp_path: Path) -> None:
    """The kernel's cell launches the ranks; a notice sent to the busy kernel makes all of them snapshot at one step."""
    out = tmp_path / "out"
    out.mkdir()
    cfg = {"out": str(out), "nprocs": 2, "port": free_port(), "mode": "ddp", "epochs": 1, "gate_at": [0, 10]}
    k = start_kernel("host", SPOTWARP_EVERY="1h")
    k.run(f"%load_ext spotwarp\nimport sys\nsys.path.insert(0, {str(PROGRAM.parent)!r})\nimport dcp_training")
    cell = f"import torch.multiprocessing as mp\nmp.start_processes(dcp_training.worker, args=({cfg!r},), nprocs=2, start_method='fork')"
    launched = threading.Thread(target=k.run, args=(cell,))
    launched.start()
    try:
        wait_for(lambda: (out / "reached").exists(), "rank 0 held at step 10", timeout=120)
        notice = NoticeRequest.new(fatal=False)
        assert notice_request(k, notice.to_message())["ok"]
    finally:
        (out / "gate").touch()
        launched.join(timeout=300)
    assert (out / "result-0.json").exists() and (out / "result-1.json").exists()
    engine = make_engine(store_url, resolved=False)
    [snapshot] = [m for m in engine.manifests() if m.kind == "collective"]
    assert (snapshot.collective["reason"], snapshot.collective["step"], snapshot.collective["world_size"]) == ("notice", 11, 2)


def test_accelerate_notebook_launcher_ranks_resume_in_a_new_kernel(start_kernel, store_url: str, tmp_path: Path,
                                                                     baseline: Path) -> None:
    """A kernel's cell launches 2 CPU ranks with accelerate's notebook_launcher; they snapshot after step 6 and
    stop. A new kernel on the same store runs the cell again: its ranks continue and end as an uninterrupted run."""
    out = tmp_path / "out"
    out.mkdir()
    cfg = {"out": str(out), "nprocs": 2, "mode": "ddp", "epochs": EPOCHS, "request_at": [[0, 5]],
           "stop_after_request": True}
    setup = f"%load_ext spotwarp\nimport sys\nsys.path.insert(0, {str(PROGRAM.parent)!r})\nimport dcp_training"
    cell = ("from accelerate import notebook_launcher\n"
            "notebook_launcher(dcp_training.launched, args=({cfg!r},), num_processes=2, use_port={port!r})")
    first = start_kernel("a", SPOTWARP_EVERY="1h")
    first.run(setup)
    assert "Launching training on 2 CPUs" in first.run(cell.format(cfg=cfg, port=str(free_port())))
    engine = make_engine(store_url, resolved=False)
    [snapshot] = [m for m in engine.manifests() if m.kind == "collective"]
    assert (snapshot.collective["step"], snapshot.collective["world_size"]) == (6, 2)
    assert steps_logged(out, 0) == 6 and not (out / "result-0.json").exists()

    second = start_kernel("b", SPOTWARP_EVERY="1h")
    second.run(setup)
    second.run(cell.format(cfg={**cfg, "stop_after_request": False}, port=str(free_port())))
    assert steps_logged(out, 0) == 6 + EPOCHS * STEPS - 6  # the second launch continued after step 6
    assert_same_run(out, baseline)
