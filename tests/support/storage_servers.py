"""Object-storage emulators for tests and benchmarks: gcp-storage-emulator and moto, on 127.0.0.1 only.

Session fixtures start each server on a free port (once, and only when a test asks for it) and
create a bucket. `storage` parametrizes a test over local / gcs / s3; its `env` is what a kernel
in a subprocess needs to reach the same storage (and nothing but the emulator: fake credentials,
metadata lookups off). `Link` sits between a client and a server and can be cut, which to the
client is exactly a storage server that stops (connections reset, new ones refused) and comes back.
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

import pytest

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

BUCKET = "spotwarp-test"
HOST = "127.0.0.1"
KINDS = ("local", "gcs", "s3")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _wait_listening(port: int, proc: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"storage emulator exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection((HOST, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"storage emulator did not listen on {HOST}:{port} within {timeout:.0f}s: {log.read_text()[-2000:]}")


@dataclass
class StorageTarget:
    """One place to keep snapshots, and how a process reaches it."""

    kind: str
    url: str
    options: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    def kernel_env(self, **extra: str) -> dict[str, str]:
        """Environment for a kernel (or CLI) that should use this storage."""
        return {**self.env, "SPOTWARP_STORAGE": self.url,
                "SPOTWARP_STORAGE_OPTIONS": json.dumps(self.options), **extra}

    def filesystem(self):
        """An fsspec filesystem on the same storage, for looking behind the engine's back."""
        import fsspec

        return fsspec.core.url_to_fs(self.url, **{**self.options, "skip_instance_cache": True,
                                                  "use_listings_cache": False})[0] \
            if self.kind != "local" else fsspec.filesystem("file")

    # -- the objects, as anyone holding the bucket's credentials (and not the project's key) reaches them --------
    def path(self, *parts: str) -> str:
        """`parts` under this storage, for `filesystem()`."""
        return posixpath.join(self.url, *parts)

    def names(self, folder: str) -> list[str]:
        """The names of the objects in `folder` (relative to this storage)."""
        fs = self.filesystem()
        return sorted(posixpath.basename(p.rstrip("/")) for p in fs.ls(self.path(folder), detail=False))

    def read(self, name: str) -> bytes:
        return self.filesystem().cat_file(self.path(name))

    def write(self, name: str, data: bytes | str) -> None:
        """Create or overwrite one object, as a plain PUT (or a file write) does."""
        if self.kind == "local":
            os.makedirs(posixpath.dirname(self.path(name)), exist_ok=True)
        self.filesystem().pipe_file(self.path(name), data.encode() if isinstance(data, str) else data)

    def delete(self, name: str) -> None:
        self.filesystem().rm_file(self.path(name))

    def files(self) -> list[str]:
        """Every object under this storage, as paths relative to it."""
        fs = self.filesystem()
        root = fs._strip_protocol(self.url).rstrip("/") + "/"
        return sorted(p[len(root):] for p in fs.find(self.url))

    def beside(self, name: str) -> StorageTarget:
        """Storage of the same kind next to this one (a sibling folder, or prefix in the same bucket)."""
        return replace(self, url=f"{self.url.rstrip('/')}-{name}")

    def copy_to(self, other: StorageTarget) -> None:
        """Every object of this storage into `other` (emptied first), as a bucket-side copy or `cp -r` makes it."""
        if self.kind == "local":
            shutil.rmtree(other.url, ignore_errors=True)
            shutil.copytree(self.url, other.url)
            return
        other.clear()
        fs = self.filesystem()
        for name in self.files():
            fs.copy(self.path(name), other.path(name))

    def clear(self) -> None:
        """Remove every object under this storage."""
        if self.kind == "local":
            shutil.rmtree(self.url, ignore_errors=True)
        elif self.files():
            self.filesystem().rm(self.url, recursive=True)


@dataclass
class StorageServer:
    """A running emulator process and its bucket."""

    kind: str  # "gcs" or "s3"
    port: int
    proc: subprocess.Popen
    log: Path
    bucket: str = BUCKET

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    def target(self, prefix: str | None = None, port: int | None = None) -> StorageTarget:
        """A fresh prefix in the bucket; `port` routes the client through another port (a Link)."""
        prefix = prefix or uuid.uuid4().hex[:12]
        endpoint = f"http://{HOST}:{port or self.port}"
        if self.kind == "gcs":
            options = {"token": "anon", "endpoint_url": endpoint}
            env = {"STORAGE_EMULATOR_HOST": endpoint, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
                   "NO_GCE_CHECK": "True", "GCE_METADATA_HOST": f"{HOST}:9", "GCE_METADATA_IP": f"{HOST}:9"}
            url = f"gs://{self.bucket}/{prefix}"
        else:
            options = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": endpoint}}
            env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                   "AWS_ENDPOINT_URL": endpoint, "AWS_EC2_METADATA_DISABLED": "true",
                   "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_CONFIG_FILE": os.devnull}
            url = f"s3://{self.bucket}/{prefix}"
        return StorageTarget(self.kind, url, options, env)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# gcp-storage-emulator with the changes that make it behave as GCS does (see that file)
_GCS = Path(__file__).with_name("gcs_emulator.py")

# moto's server with one request at a time: its conditional PUT (If-None-Match) is a check then a write, which
# two of its threads can interleave; real S3 decides it atomically, and one thread does too
_SERIAL_MOTO = ("import sys; from werkzeug.serving import run_simple; "
                "from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app; "
                "run_simple(sys.argv[1], int(sys.argv[2]), DomainDispatcherApplication(create_backend_app), "
                "threaded=False)")


def start_server(kind: str, workdir: Path, serial: bool = False) -> StorageServer:
    """Start a gcs or s3 emulator on a free 127.0.0.1 port, wait until it serves, create the bucket.
    `serial`: an s3 server that answers one request at a time (atomic conditional writes)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = workdir / f"{kind}-emulator.log"
    if kind == "gcs":
        cmd = [sys.executable, str(_GCS), "start", "--host", HOST, "--port", str(port), "--in-memory"]
    elif kind == "s3":
        # no region: moto answers any, and a region makes bucket creation need a location constraint
        cmd = [sys.executable, "-c", "from moto.server import main; main()", "-H", HOST, "-p", str(port)]
        if serial:
            cmd = [sys.executable, "-c", _SERIAL_MOTO, HOST, str(port)]
    else:
        raise ValueError(f"unknown storage server kind {kind!r}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=workdir, stdout=out, stderr=subprocess.STDOUT, env=env)
    server = StorageServer(kind, port, proc, log)
    try:
        _wait_listening(port, proc, log)
        fs = server.target("setup").filesystem()
        fs.mkdir(server.bucket)
    except BaseException:
        server.stop()
        raise
    return server


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory) -> Iterator[StorageServer]:
    """gcp-storage-emulator on a free port, with bucket `spotwarp-test`."""
    server = start_server("gcs", tmp_path_factory.mktemp("gcs-emulator"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> Iterator[StorageServer]:
    """moto server on a free port, with bucket `spotwarp-test`."""
    server = start_server("s3", tmp_path_factory.mktemp("moto"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def serial_s3_server(tmp_path_factory) -> Iterator[StorageServer]:
    """moto server answering one request at a time, for tests of conditional writes (see _SERIAL_MOTO)."""
    server = start_server("s3", tmp_path_factory.mktemp("moto-serial"), serial=True)
    yield server
    server.stop()


def make_target(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> StorageTarget:
    if kind == "local":
        return StorageTarget("local", str(tmp_path / "store"))
    server: StorageServer = request.getfixturevalue(f"{kind}_server")
    return server.target()


@pytest.fixture(params=KINDS)
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> StorageTarget:
    """Fresh storage of each kind in turn: a local folder, GCS (emulator), S3 (moto)."""
    return make_target(request.param, request, tmp_path)


@pytest.fixture(params=("gcs", "s3"))
def object_storage(request: pytest.FixtureRequest, tmp_path: Path) -> StorageTarget:
    """Fresh storage on each object-store emulator in turn."""
    return make_target(request.param, request, tmp_path)


class Link:
    """A TCP forwarder in front of a storage server that a test can cut and restore.

    Cut: every open connection is reset and new ones are refused, as when the server process dies.
    With `cut_after(n)` the cut happens by itself once `n` more request bytes have gone upstream,
    so a test can stop the server in the middle of an upload without guessing at timing; with
    `cut_after_down(n)`, once `n` more response bytes have come back (in the middle of a download).
    Stall: connections are accepted and kept open, and nothing more is forwarded either way, as when a
    server hangs or a partition drops packets; `restore()` or `cut()` ends it.
    """

    def __init__(self, upstream_port: int):
        self.upstream = (HOST, upstream_port)
        self.port = free_port()
        self.bytes_up = 0
        self.bytes_down = 0
        self.sent = bytearray()  # every request byte forwarded, when `record` is set
        self.record = False
        self.cut_event = threading.Event()
        self._cut_at: int | None = None
        self._cut_down_at: int | None = None
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._flowing = threading.Event()  # cleared while stalled
        self.restore()

    # -- control ----------------------------------------------------------------------------
    def restore(self) -> None:
        """Listen again, or forward again after a stall (the server is back)."""
        with self._lock:
            if self._listener is not None:  # stalled, not cut: the connections are still open
                self._flowing.set()
                return
            self._cut_at = self._cut_down_at = None
            self.cut_event.clear()
            listener = socket.socket()
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((HOST, self.port))
            listener.listen(64)
            self._listener = listener
        self._flowing.set()
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stall(self) -> None:
        """Keep every connection open and forward nothing more (new connections too)."""
        self._flowing.clear()

    def cut(self) -> None:
        """Stop: reset every connection, refuse new ones."""
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = list(self._conns), set()
            self._cut_at = self._cut_down_at = None
        if listener is not None:
            try:
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            listener.close()
        for conn in conns:
            _reset(conn)
        self._flowing.set()  # stalled pumps go on, to find their sockets reset
        self.cut_event.set()  # only now: a test may restore() as soon as it sees this

    def cut_after(self, more_bytes: int) -> None:
        """Cut once `more_bytes` more request bytes have been forwarded."""
        with self._lock:
            self._cut_at = self.bytes_up + more_bytes

    def cut_after_down(self, more_bytes: int) -> None:
        """Cut once `more_bytes` more response bytes have been forwarded."""
        with self._lock:
            self._cut_down_at = self.bytes_down + more_bytes

    def close(self) -> None:
        self.cut()

    # -- forwarding ---------------------------------------------------------------------------
    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                if self._listener is not listener:
                    _reset(client)
                    _reset(server)
                    return
                self._conns.update((client, server))
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, upstream: bool) -> None:
        buf = bytearray(1 << 20)
        view = memoryview(buf)
        try:
            while True:
                n = source.recv_into(buf)
                if not n:
                    break
                self._flowing.wait()
                sink.sendall(view[:n])
                with self._lock:
                    if upstream:
                        self.bytes_up += n
                        if self.record:
                            self.sent += view[:n]
                        trip = self._cut_at is not None and self.bytes_up >= self._cut_at
                    else:
                        self.bytes_down += n
                        trip = self._cut_down_at is not None and self.bytes_down >= self._cut_down_at
                if trip:
                    self.cut()
                    return
        except OSError:
            pass
        finally:
            try:
                sink.shutdown(socket.SHUT_WR)
            except OSError:
                pass


def _reset(sock: socket.socket) -> None:
    """Close with RST (SO_LINGER 0), as a dying server's kernel does."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


@pytest.fixture
def link_to():
    """link_to(server) -> Link in front of it; all closed at the end of the test."""
    links: list[Link] = []

    def make(server: StorageServer) -> Link:
        link = Link(server.port)
        links.append(link)
        return link

    yield make
    for link in links:
        link.close()
