"""`spotwarp start` as a user runs it: a real JupyterLab process, its REST API, kernels over websockets."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import websocket  # websocket-client, a jupyter_server dependency

TOKEN = "spotwarp-test-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_env(home: Path, **extra: str) -> dict[str, str]:
    """A fresh "host": its own HOME and Jupyter folders, nothing configured but what is passed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPOTWARP_", "JUPYTER", "JPY_"))}
    # never a real cloud metadata address from a test; a test may turn a watcher on through `extra`
    env.update(SPOTWARP_AWS_METADATA_URL="off", SPOTWARP_GCP_METADATA_URL="off", SPOTWARP_AZURE_METADATA_URL="off")
    env.update(HOME=str(home), JUPYTER_CONFIG_DIR=str(home / ".jupyter"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               IPYTHONDIR=str(home / ".ipython"), PYTHONUNBUFFERED="1", **extra)
    return env


def carried_key(*homes: Path, project: str) -> dict[str, str]:
    """`SPOTWARP_KEY` as a user carries the project's key to a new host: read from the key file a first host's
    `spotwarp start` created in its home (`spotwarp key` shows it); nothing when none of `homes` has one."""
    for home in homes:
        for path in sorted((home / ".spotwarp" / "keys").glob(f"{project}@*.key")):
            return {"SPOTWARP_KEY": path.read_text().strip()}
    return {}


def kill_kernel(pid: int | None) -> None:
    """SIGKILL to a server's kernel, which may outlive a killed server: no test leaves one running. `pid` None
    (no kernel was started) or a kernel already gone is nothing to do."""
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:  # an HTML error page
        return raw.decode(errors="replace")


class LabServer:
    """`spotwarp start ... -- jupyter args` in its own process group, like a terminal session."""

    def __init__(self, workspace: Path, store: str, project: str, env: dict[str, str], log: Path, plain: bool = False,
                 start_args: tuple[str, ...] = (), jupyter_args: tuple[str, ...] = (), allow_root: bool = True):
        """`plain` runs `jupyter lab` itself without SpotWarp (the reference a benchmark compares with);
        `start_args` go to `spotwarp start` (e.g. `--candidate-id`), `jupyter_args` to JupyterLab; `allow_root=False`
        leaves `--allow-root` out of Jupyter's flags (what `spotwarp start` itself passes as root is then tested)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.workspace = workspace
        self.env = env
        self.log_path = log
        self.ready_path = "api/status" if plain else "spotwarp/api/status"
        jupyter_args = ("--no-browser", *(("--allow-root",) if allow_root else ()), f"--ServerApp.token={TOKEN}",
                        "--ServerApp.ip=127.0.0.1", "--LabApp.extension_manager=readonly", *jupyter_args)
        if plain:
            workspace.mkdir(parents=True, exist_ok=True)
            argv = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={workspace}", f"--port={self.port}",
                    *jupyter_args]
        else:
            argv = [sys.executable, "-m", "spotwarp_jupyter.cli", "start", "--project-id", project, "--storage", store,
                    "--workspace-path", str(workspace), "--port", str(self.port), *start_args, "--", *jupyter_args]
        self.started = time.perf_counter()
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def request(self, method: str, path: str, body: Any = None, token: str | None = TOKEN,
                timeout: float = 120) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else (b"" if method in ("POST", "PUT") else None)
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"token {token}"
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, _decode(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, _decode(exc.read())

    def wait_ready(self, timeout: float = 180) -> float:
        """Seconds from start until the status endpoint answers (the session is served)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"spotwarp start exited with {self.proc.returncode}:\n{self.log()}")
            try:
                code, _ = self.request("GET", self.ready_path, timeout=5)
                if code == 200:
                    return time.perf_counter() - self.started
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.05)  # poll interval of a deadline-bounded wait, not a stand-in for synchronisation
        raise AssertionError(f"server not ready after {timeout} s:\n{self.log()}")

    def open_notebook(self, path: str) -> "KernelSocket":
        """Start the notebook's kernel as JupyterLab does (POST /api/sessions) and connect to it."""
        code, session = self.request("POST", "api/sessions", {
            "path": path, "name": Path(path).name, "type": "notebook", "kernel": {"name": "python3"}})
        assert code == 201, session
        return KernelSocket(self, session["kernel"]["id"])

    def stop(self) -> None:
        """SIGTERM to the whole process group (SIGKILL if it lingers): the host shuts down."""
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            self.kill()

    def kill(self) -> None:
        """SIGKILL to the whole process group: the host vanishes."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)

    def discard(self) -> None:
        """End of a test: shut the kernels down (they outlive a killed server), then kill the server."""
        code, sessions = self.request("GET", "api/sessions") if self.proc.poll() is None else (0, [])
        for s in sessions or []:
            self.request("DELETE", f"api/kernels/{s['kernel']['id']}")
        self.kill()


class Execution:
    """One execute_request over a kernel websocket (JSON protocol) and what came back for it."""

    def __init__(self, code: str, msg_id: str | None = None, cell_id: str | None = None):
        """`cell_id`: run as JupyterLab runs a notebook cell (its id in the request's metadata, in the history)."""
        self.msg_id = msg_id or uuid.uuid4().hex
        self.request = json.dumps({
            "header": {"msg_id": self.msg_id, "msg_type": "execute_request", "username": "test",
                       "session": uuid.uuid4().hex, "version": "5.3", "date": ""},
            "parent_header": {}, "metadata": {"cellId": cell_id} if cell_id else {}, "channel": "shell",
            "buffers": [],
            "content": {"code": code, "silent": False, "store_history": cell_id is not None, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True},
        })
        self.out: list[str] = []
        self.status: str | None = None
        self.idle = False

    @property
    def done(self) -> bool:
        return self.status is not None and self.idle

    def feed(self, raw: str | bytes) -> None:
        """Take one websocket message; those answering other requests are ignored."""
        msg = json.loads(raw)
        if msg.get("parent_header", {}).get("msg_id") != self.msg_id:
            return
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            self.out.append(content["text"])
        elif kind in ("execute_result", "display_data"):
            self.out.append(content["data"].get("text/plain", "") + "\n")
        elif kind == "error":
            self.out.append(f"{content['ename']}: {content['evalue']}")
        elif kind == "execute_reply":
            self.status = content["status"]
        elif kind == "status" and content["execution_state"] == "idle":
            self.idle = True

    def output(self) -> str:
        """What the code printed; AssertionError with it when the code raised."""
        if self.status != "ok":
            raise AssertionError("".join(self.out))
        return "".join(self.out)


class KernelSocket:
    """A kernel's websocket, as the notebook frontend uses it."""

    def __init__(self, server: LabServer, kernel_id: str):
        self.kernel_id = kernel_id
        self.ws = websocket.create_connection(
            f"ws://127.0.0.1:{server.port}/api/kernels/{kernel_id}/channels?token={TOKEN}", timeout=120)

    def run(self, code: str, timeout: float = 120, cell_id: str | None = None) -> str:
        """Execute `code` (as notebook cell `cell_id`); return its output; raise AssertionError if it failed."""
        execution = Execution(code, cell_id=cell_id)
        self.ws.send(execution.request)
        deadline = time.monotonic() + timeout
        while not execution.done:
            self.ws.settimeout(max(deadline - time.monotonic(), 0.1))
            execution.feed(self.ws.recv())
        return execution.output()

    def send(self, code: str, cell_id: str | None = None) -> None:
        """Start executing `code` without waiting for it (the host may be killed while it runs)."""
        self.ws.send(Execution(code, cell_id=cell_id).request)

    def value(self, expr: str) -> Any:
        text = self.run(f"import json as _j; print('@@' + _j.dumps({expr}))")
        return json.loads([ln for ln in text.splitlines() if ln.startswith("@@")][-1][2:])

    def close(self) -> None:
        self.ws.close()


def tree(root: Path) -> dict[str, bytes]:
    """relative path -> bytes of every regular file under root."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink()}
