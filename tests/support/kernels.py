"""Real IPython kernels for tests: start one in a folder, run code, read results, kill it hard."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from jupyter_client.manager import KernelManager

from spotwarp_jupyter.protocol import NOTICE_REPLY, NOTICE_REQUEST

# run in a test kernel: binds `s` to the kernel's SpotWarp session (kernel/session.py)
SESSION = "s = __import__('spotwarp_jupyter.kernel.session', fromlist=['x']).current()\n"


class KernelError(AssertionError):
    """Code run in a test kernel raised."""


class Kernel:
    """One ipykernel process, as a notebook would run it."""

    def __init__(self, cwd: Path, env: dict[str, str] | None = None):
        self.cwd = Path(cwd)
        self.cwd.mkdir(parents=True, exist_ok=True)
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        self.km = KernelManager(kernel_name="python3")
        self.km.kernel_spec  # noqa: B018 - resolve now so a missing kernelspec fails early
        self.km.start_kernel(cwd=str(self.cwd), env=full_env,
                             extra_arguments=["--HistoryManager.enabled=False"])
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    @property
    def pid(self) -> int:
        return self.km.provisioner.process.pid  # type: ignore[union-attr]

    def run(self, code: str, timeout: float = 300) -> str:
        """Execute `code`; return its stdout; raise KernelError with the traceback if it failed."""
        out: list[str] = []
        reply = self.kc.execute_interactive(
            code, timeout=timeout, output_hook=lambda msg: self._collect(msg, out), allow_stdin=False
        )
        if reply["content"]["status"] != "ok":
            content = reply["content"]
            raise KernelError(f"{content.get('ename')}: {content.get('evalue')}\n" + "".join(out))
        return "".join(out)

    def run_cell(self, cell_id: str | None, code: str) -> None:
        """Run `code` as JupyterLab runs a cell: an execute_request whose metadata names the cell (none: no id)."""
        msg = self.kc.session.msg("execute_request", {"code": code, "silent": False, "store_history": True,
                                                      "user_expressions": {}, "allow_stdin": False,
                                                      "stop_on_error": True},
                                  metadata={"cellId": cell_id} if cell_id else {})
        self.kc.shell_channel.send(msg)
        while True:
            reply = self.kc.get_shell_msg(timeout=120)
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                assert reply["content"]["status"] == "ok", reply["content"]
                return

    def run_error(self, code: str, timeout: float = 120) -> tuple[str, str, str]:
        """Execute `code` that should fail; return (ename, evalue, output)."""
        out: list[str] = []
        reply = self.kc.execute_interactive(
            code, timeout=timeout, output_hook=lambda msg: self._collect(msg, out), allow_stdin=False
        )
        content = reply["content"]
        if content["status"] == "ok":
            raise AssertionError(f"expected an error from {code!r}, got output {''.join(out)!r}")
        return content.get("ename", ""), content.get("evalue", ""), "".join(out)

    def value(self, expr: str) -> Any:
        """The JSON value of `expr` evaluated in the kernel."""
        text = self.run(f"import json as _j; print('@@' + _j.dumps({expr}))")
        line = [ln for ln in text.splitlines() if ln.startswith("@@")][-1]
        return json.loads(line[2:])

    @staticmethod
    def _collect(msg: dict, out: list[str]) -> None:
        kind = msg["header"]["msg_type"]
        content = msg["content"]
        if kind == "stream":
            out.append(content["text"])
        elif kind in ("execute_result", "display_data"):
            out.append(content["data"].get("text/plain", "") + "\n")
        elif kind == "error":
            out.append("\n".join(content.get("traceback", [])))

    def kill(self) -> None:
        """SIGKILL, no clean-up: what a preempted host does."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.km.provisioner.process.wait()  # type: ignore[union-attr]
        self.close()

    def close(self) -> None:
        try:
            self.kc.stop_channels()
        finally:
            if self.km.has_kernel:
                self.km.shutdown_kernel(now=True)
        self.km.cleanup_resources()


def notice_request(kernel: Kernel, content: dict, timeout: float = 30) -> dict:
    """Send a notice on the control channel (as the server does) and return the kernel's answer."""
    msg = kernel.kc.session.msg(NOTICE_REQUEST, content)
    kernel.kc.control_channel.send(msg)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reply = kernel.kc.control_channel.get_msg(timeout=max(0.1, deadline - time.monotonic()))
        if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
            assert reply["msg_type"] == NOTICE_REPLY
            return reply["content"]
    raise AssertionError("no answer to the notice")
