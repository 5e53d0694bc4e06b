"""The local provider: each candidate is a real `spotwarp start` process on this machine.

Each candidate gets a fresh workspace and home under the provider's root, a free port and its own process
group. Start delays and failures are scriptable, for tests and demos (options, or environment variables):

- `delays`  (SPOTWARP_LOCAL_DELAYS): seconds each candidate waits before `spotwarp start`, e.g. "0,1.5,3"
  (one per candidate, in launch order, the last repeated: the "provisioning" time of a machine);
- `fail`    (SPOTWARP_LOCAL_FAIL): candidates (0-based, in launch order) that exit with an error after their delay;
- `root`    (SPOTWARP_LOCAL_ROOT): where candidates' folders go (default: a new temporary folder);
- `token`   (SPOTWARP_LOCAL_TOKEN): the Jupyter token of every candidate (default: a random one, printed to
  once by `spotwarp launch`); given to candidates in their environment (`JUPYTER_TOKEN`), never on a command line `ps` shows;
- `grace`   seconds between SIGTERM and SIGKILL on teardown (default 10).

Teardown sends SIGTERM to the candidate's process group, then SIGKILL, and ends its kernels (they run in
sessions of their own) by their connection files under the candidate's runtime folder.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from ...engine.errors import ConfigError
from ..provider import FAILED, GONE, PENDING, RUNNING, CandidateHandle, CandidateStatus, LaunchSpec, Offer

OPTIONS = ("delays", "fail", "root", "token", "grace", "jupyter_args")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _floats(text: Any, what: str) -> list[float]:
    if text in (None, ""):
        return []
    items = text if isinstance(text, (list, tuple)) else str(text).split(",")
    try:
        out = [float(x) for x in items if str(x).strip() != ""]
    except ValueError:
        raise ConfigError(f"local provider: {what} must be numbers separated by commas, got {text!r}") from None
    if any(x < 0 for x in out):
        raise ConfigError(f"local provider: {what} must not be negative, got {text!r}")
    return out


class LocalProvider:
    """Candidates as `spotwarp start` processes on this machine (tests, demos, the benchmark)."""

    name = "local"

    def __init__(self, options: dict[str, Any] | None = None):
        options = dict(options or {})
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise ConfigError(f"local provider: unknown option {unknown[0]!r}: use {', '.join(OPTIONS)}")
        env = os.environ
        self.delays = _floats(options.get("delays", env.get("SPOTWARP_LOCAL_DELAYS")), "delays")
        self.fail = {int(x) for x in _floats(options.get("fail", env.get("SPOTWARP_LOCAL_FAIL")), "fail")}
        root = options.get("root") or env.get("SPOTWARP_LOCAL_ROOT")
        self._root = Path(root) if root else None  # a temporary folder is made at the first launch only
        given = options.get("token") or env.get("SPOTWARP_LOCAL_TOKEN")
        self.token = str(given or secrets.token_hex(16))
        # what the user needs to open a candidate: `spotwarp launch` prints it once before its first race
        self.notice = None if given else (f"local provider: the candidates' Jupyter token is {self.token} (set it "
                                          "with --provider-option token=T or SPOTWARP_LOCAL_TOKEN)")
        grace = _floats(options.get("grace", "10"), "grace")
        if len(grace) != 1:
            raise ConfigError(f"local provider: grace must be one number of seconds, got {options.get('grace')!r}")
        self.grace = grace[0]
        self.jupyter_args = shlex.split(str(options.get("jupyter_args", "")))
        self.launched = 0
        self._lock = threading.Lock()
        self._handles: list[CandidateHandle] = []

    @property
    def root(self) -> Path:
        """Where candidates' folders go: made at the first launch, so that a refused command creates nothing."""
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="spotwarp-local-"))
        return self._root

    def offers(self, spec: LaunchSpec, count: int) -> Sequence[Offer]:
        """`count` slots on this machine (no price)."""
        return [Offer(self.name, "local", None, f"slot-{i}", spec.gpus, None) for i in range(count)]

    def launch(self, spec: LaunchSpec, offer: Offer, candidate_id: str, generation: int) -> CandidateHandle:
        with self._lock:
            index = self.launched
            self.launched += 1
        delay = self.delays[min(index, len(self.delays) - 1)] if self.delays else 0.0
        folder = self.root / candidate_id
        home = folder / "home"
        home.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        mine = dataclasses.replace(spec, workspace_path=str(folder / "ws"), port=port)
        start = shlex.split(mine.start_command(candidate_id, generation))[2:]  # after `spotwarp start`
        argv = [sys.executable, "-m", "spotwarp_jupyter.cli", "start", *start, "--", "--no-browser",
                "--ServerApp.ip=127.0.0.1", "--allow-root",
                "--LabApp.extension_manager=readonly", *self.jupyter_args]
        if index in self.fail:
            script = f"sleep {delay}; echo 'scripted failure of candidate {index}' >&2; exit 3"
        else:
            script = f"sleep {delay}; exec {shlex.join(argv)}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "JPY_"))}
        env.pop("SPOTWARP_CANDIDATE_ID", None)
        env.pop("SPOTWARP_GENERATION", None)
        env.update(spec.env)
        env.update(HOME=str(home), JUPYTER_CONFIG_DIR=str(home / ".jupyter"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
                   IPYTHONDIR=str(home / ".ipython"), PYTHONUNBUFFERED="1", JUPYTER_TOKEN=self.token)
        log = open(folder / "candidate.log", "wb")  # noqa: SIM115 - handed to the candidate, closed below
        try:
            proc = subprocess.Popen(["/bin/sh", "-c", script], stdout=log, stderr=subprocess.STDOUT, env=env,
                                    cwd=str(folder), start_new_session=True)
        finally:
            log.close()
        handle = CandidateHandle(candidate_id, offer, {
            "proc": proc, "pid": proc.pid, "port": port, "url": f"http://127.0.0.1:{port}/", "folder": str(folder),
            "log": str(folder / "candidate.log"), "delay": delay, "scripted_failure": index in self.fail,
            "launched": time.time(), "down": False})
        with self._lock:
            self._handles.append(handle)
        return handle

    def poll(self, handle: CandidateHandle) -> CandidateStatus:
        data = handle.data
        if data.get("down"):
            return CandidateStatus(GONE, "torn down")
        code = data["proc"].poll()
        if code is None:
            waiting = time.time() < data["launched"] + data["delay"]
            return CandidateStatus(PENDING if waiting else RUNNING)
        tail = ""
        try:
            tail = Path(data["log"]).read_text(errors="replace").strip().splitlines()[-1:][0]
        except (OSError, IndexError):
            pass
        if code < 0:
            return CandidateStatus(GONE, f"killed by {signal.Signals(-code).name}")
        tail = tail if len(tail) <= 200 else tail[:200] + "..."
        return CandidateStatus(FAILED, f"exited with {code}" + (f": {tail}" if tail else ""))

    def down(self, handle: CandidateHandle) -> None:
        data = handle.data
        data["down"] = True
        proc = data["proc"]
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=self.grace)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=30)
        for pid in self._kernels(handle):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        # a loser's copy of the workspace goes with it (its log and runtime folder stay, for diagnosis)
        shutil.rmtree(os.path.join(data["folder"], "ws"), ignore_errors=True)

    def discard(self, handle: CandidateHandle) -> None:
        """Remove a torn-down candidate's folder (a full copy of the workspace; the store keeps the project)."""
        if handle.data.get("down"):
            shutil.rmtree(handle.data["folder"], ignore_errors=True)

    def _kernels(self, handle: CandidateHandle) -> list[int]:
        """Kernel processes of a candidate: their command line names a connection file in its runtime folder."""
        runtime = os.path.join(handle.data["folder"], "home", "runtime") + os.sep
        out = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read().decode(errors="replace")
            except OSError:
                continue
            if runtime in cmdline and "kernel" in cmdline:
                out.append(int(entry))
        return out

    def leaks(self) -> list[str]:
        out = []
        for handle in list(self._handles):
            if not handle.data.get("down"):
                continue
            if handle.data["proc"].poll() is None or self._kernels(handle):
                out.append(f"{handle.candidate_id} (pid {handle.data['pid']}) is still running after teardown")
        return out
