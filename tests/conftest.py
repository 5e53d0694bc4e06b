from __future__ import annotations

import multiprocessing.util
import os
import platform
import subprocess
import tempfile
from pathlib import Path

import pytest

# No test may reach a real cloud metadata address (169.254.169.254): preemption watchers are limited
# to signals, and every cloud watcher is off, unless a test turns one on against a local server.
# Set before any server or kernel starts, so every subprocess inherits it.
os.environ.setdefault("SPOTWARP_WATCHERS", "signals")
# the keys a project gets by default (engine/keys.py) go to a folder of this session, never the runner's ~/.spotwarp;
# a "host" started with its own HOME (lab_server.host_env) keeps them in that HOME
os.environ.setdefault("SPOTWARP_CONFIG_DIR", tempfile.mkdtemp(prefix="spotwarp-config-"))
for _name in ("SPOTWARP_AWS_METADATA_URL", "SPOTWARP_GCP_METADATA_URL", "SPOTWARP_AZURE_METADATA_URL"):
    os.environ.setdefault(_name, "off")

from spotwarp_jupyter.engine import SnapshotEngine  # noqa: E402

from engines import make_engine  # noqa: E402
from kernels import Kernel  # noqa: E402
from server_config import spotwarp_server_config  # noqa: E402

pytest_plugins = ["storage_servers"]  # gcs/s3 emulators and the `storage` fixture

# fixtures that start a process of their own (an emulator, a kernel, a hub) before the test body runs
# (pytest-jupyter's server runs in this process but starts commands as it initialises)
PROCESS_FIXTURES = {"gcs_server", "s3_server", "serial_s3_server", "start_kernel", "kernel", "jp_fetch", "jp_ws_fetch",
                    "jp_serverapp"}
platform.platform()  # asks `uname -p` once per process: here, before any test, not inside one


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that asks for a fixture starting a process is marked `process`, as if it said so."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        emulated = any(value in ("gcs", "s3") for value in params.values() if isinstance(value, str))
        if (emulated or PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ()))) \
                and not item.get_closest_marker("process"):
            item.add_marker(pytest.mark.process)


class StartsAProcess(RuntimeError):
    """A test not marked `process` (nor `slow`) started one: the quick tier would not be what it says."""


def _refuse(*args: object, **kwargs: object) -> None:
    raise StartsAProcess("this test starts a process (a kernel, server, worker or command): mark it "
                         "@pytest.mark.process, or pytestmark = pytest.mark.process for its file")


@pytest.fixture(autouse=True)
def _quick_tests_start_no_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """Tests not marked `process` or `slow` run in this process only: the quick tier,
    `pytest -m "not slow and not process"`, starts no kernel, server or command, and a test that does fails here."""
    if request.node.get_closest_marker("process") or request.node.get_closest_marker("slow"):
        yield
        return
    monkeypatch.setattr(subprocess.Popen, "_execute_child", _refuse)
    monkeypatch.setattr(multiprocessing.util, "spawnv_passfds", _refuse)
    monkeypatch.setattr(os, "fork", _refuse)
    monkeypatch.setattr(os, "posix_spawn", _refuse)
    yield


@pytest.fixture(autouse=True)
def _own_signing_key():
    """SPOTWARP_KEY as it was before the test: an engine of this process that settled a project's key
    (engine/keys.py use_key) exports it for its children, which must not sign the next test's stores."""
    before = os.environ.get("SPOTWARP_KEY")
    yield
    if before is None:
        os.environ.pop("SPOTWARP_KEY", None)
    else:
        os.environ["SPOTWARP_KEY"] = before


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """A fresh local store, outside every kernel's folder (durable storage shared by two hosts)."""
    return str(tmp_path / "store")


@pytest.fixture
def engine(store_url: str) -> SnapshotEngine:
    """Project `proj` in the test's fresh store, with this host's key (none unless the test sets SPOTWARP_KEY)."""
    return make_engine(store_url)


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    """The store of the in-process (jp_fetch) server's project `api`."""
    return tmp_path / "store"


@pytest.fixture
def jp_server_config(store_dir: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """pytest-jupyter's server config: SpotWarp on, project `api` in `store_dir`, no automatic backups.

    Only jp_* fixtures ask for it; a module or class that needs more defines its own (asking for this one to
    extend it), which pytest prefers to this one.
    """
    return spotwarp_server_config(store_dir, monkeypatch)


@pytest.fixture
def kernel_env(store_url: str, tmp_path: Path) -> dict[str, str]:
    """Environment for a test kernel: its own HOME, the shared store, a project."""
    (tmp_path / "home").mkdir(exist_ok=True)
    return {
        "SPOTWARP_STORAGE": store_url,
        "SPOTWARP_PROJECT": "proj",
        "HOME": str(tmp_path / "home"),
        "PYTHONHASHSEED": "0",
    }


@pytest.fixture
def start_kernel(tmp_path: Path, kernel_env: dict[str, str]):
    """Start kernels in their own folders ("hosts"); all are shut down at the end."""
    started: list[Kernel] = []

    def start(host: str, **env: str) -> Kernel:
        kernel = Kernel(tmp_path / host, {**kernel_env, **env})
        started.append(kernel)
        return kernel

    yield start
    for k in started:
        try:
            k.close()
        except Exception:  # noqa: BLE001
            pass
