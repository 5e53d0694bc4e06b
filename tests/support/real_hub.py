"""A real JupyterHub for tests and benchmarks: the guide's deploy/ config, SimpleLocalProcessSpawner (homes under a
temp folder), configurable-http-proxy from npm, storage on the moto S3 emulator with one prefix per user
(`s3://bucket/<run>/{username}/{server_name}`), each user's own key; its REST API as an admin service, each user's
server through the proxy with the user's own token. And the training notebook a lost server resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import requests
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

from lab_server import Execution
from storage_servers import free_port

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PASSWORD = "spot-warp-test-pw"
USERS = ("alice", "bob")
HUB_KEY_SECRET = uuid.uuid4().hex


def poll(what: str, check: Callable[[], Any], timeout: float = 90.0, every: float = 0.2, log: Path | None = None) -> Any:
    """`check()`'s first truthy answer; fails naming `what` (and the hub log's tail) at the deadline."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    tail = log.read_text()[-4000:] if log is not None and log.exists() else ""
    raise AssertionError(f"{what}: not within {timeout:.0f}s (last answer {last!r})\n{tail}")


class Hub:
    """A running JupyterHub and an admin service token for its REST API."""

    def __init__(self, url: str, admin_token: str, homes: Path, proc: subprocess.Popen, log: Path,
                 storage_root: str, storage_options: dict[str, Any]):
        self.url, self.admin_token, self.homes, self.proc, self.log = url, admin_token, homes, proc, log
        self.storage_root, self.storage_options = storage_root, storage_options
        self.tokens: dict[str, str] = {}

    # -- the hub's REST API, as the admin service ---------------------------------------------
    def api(self, method: str, path: str, **kwargs) -> requests.Response:
        return requests.request(method, f"{self.url}hub/api/{path}", timeout=30,
                                headers={"Authorization": f"token {self.admin_token}"}, **kwargs)

    def add_user(self, name: str) -> str:
        """Create `name` and an API token of theirs (the token a script of that user would hold)."""
        assert self.api("POST", f"users/{name}").status_code in (201, 409)
        reply = self.api("POST", f"users/{name}/tokens", json={"note": "test"})
        assert reply.status_code == 201, reply.text
        self.tokens[name] = reply.json()["token"]
        return self.tokens[name]

    def home(self, name: str) -> Path:
        return self.homes / name

    def server(self, name: str) -> dict[str, Any] | None:
        reply = self.api("GET", f"users/{name}")
        assert reply.status_code == 200, reply.text
        return reply.json()["servers"].get("")

    def start(self, name: str) -> None:
        reply = self.api("POST", f"users/{name}/server")
        assert reply.status_code in (201, 202), reply.text

    def wait_ready(self, name: str) -> dict[str, Any]:
        return poll(f"{name}'s server ready", lambda: (s := self.server(name)) and s.get("ready") and s,
                    timeout=120, log=self.log)

    def stop(self, name: str) -> None:
        reply = self.api("DELETE", f"users/{name}/server")
        assert reply.status_code in (202, 204), reply.text
        poll(f"{name}'s server stopped", lambda: self.server(name) is None, log=self.log)

    # -- a user's single-user server, through the proxy ----------------------------------------
    def call(self, method: str, owner: str, path: str, as_user: str | None = None, **kwargs) -> requests.Response:
        """`path` under `/user/<owner>/`, with `as_user`'s token (the owner's by default)."""
        token = self.tokens[as_user or owner]
        return requests.request(method, f"{self.url}user/{owner}/{path}", timeout=120, allow_redirects=False,
                                headers={"Authorization": f"token {token}"}, **kwargs)


def hub_config(tmp: Path, port: int, hub_port: int, proxy_api_port: int, admin_token: str,
                spawn_env: dict[str, str]) -> str:
    """The test hub's config: the guide's file first, then what only a test needs."""
    args = ["--allow-root"] if os.geteuid() == 0 else []
    return f"""
load_subconfig({str(DEPLOY / "jupyterhub_config.py")!r})

c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.ConfigurableHTTPProxy.should_start = True
c.JupyterHub.db_url = "sqlite:///{tmp / 'hub.sqlite'}"
c.JupyterHub.cookie_secret_file = {str(tmp / 'cookie_secret')!r}
c.JupyterHub.pid_file = {str(tmp / 'hub.pid')!r}
c.JupyterHub.cleanup_servers = True
c.JupyterHub.tornado_settings = {{"slow_spawn_timeout": 0}}  # spawn requests answer at once: servers start together

c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = {PASSWORD!r}
c.Authenticator.allowed_users = {set(USERS)!r}

c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = {str(tmp / 'homes' / '{username}')!r}
c.Spawner.cmd = [{sys.executable!r}, "-m", "jupyterhub.singleuser"]
c.Spawner.args = {args!r}
c.Spawner.environment.update({spawn_env!r})

c.JupyterHub.services = [{{"name": "test-admin", "api_token": {admin_token!r}}}]
c.JupyterHub.load_roles = [{{
    "name": "test-admin",
    "scopes": ["admin:users", "admin:servers", "admin:server_state", "tokens", "shares", "access:servers",
               "read:users", "list:users", "custom:jupyter_server:execute:*"],
    "services": ["test-admin"],
}}]
"""


@contextlib.contextmanager
def running_hub(tmp: Path, s3_server: Any) -> Iterator[Hub]:
    """A JupyterHub on 127.0.0.1 under `tmp` (homes, database, log), storage on the moto server `s3_server`: the
    guide's config files, one store prefix and one key per user; stopped with every server it spawned."""
    if shutil.which("configurable-http-proxy") is None:
        raise RuntimeError("configurable-http-proxy is not on the PATH: scripts/test.sh installs it into the venv")
    (tmp / "homes").mkdir(parents=True)
    port, hub_port, proxy_api_port = free_port(), free_port(), free_port()
    run = f"hub-{uuid.uuid4().hex[:8]}"
    target = s3_server.target(run)
    storage_root = target.url  # s3://spotwarp-test/hub-xxxx
    spawn_env = {
        **target.env,
        "SPOTWARP_STORAGE_OPTIONS": json.dumps(target.options),
        "SPOTWARP_BACKUP_INTERVAL": "0",  # the test asks for every snapshot it wants
        "SPOTWARP_KERNEL_TIMEOUT": "10",
        # never a real cloud metadata address from a test: signal watchers only
        "SPOTWARP_WATCHERS": "signals",
        "SPOTWARP_AWS_METADATA_URL": "off", "SPOTWARP_GCP_METADATA_URL": "off", "SPOTWARP_AZURE_METADATA_URL": "off",
        # the single-user image's config files (in an image: /etc/jupyter, /etc/ipython)
        "JUPYTER_CONFIG_PATH": str(DEPLOY),
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
    }
    admin_token = uuid.uuid4().hex
    config = tmp / "jupyterhub_config.py"
    config.write_text(hub_config(tmp, port, hub_port, proxy_api_port, admin_token, spawn_env))
    log = tmp / "hub.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPOTWARP_", "JUPYTERHUB_", "AWS_"))}
    env["CONFIGPROXY_AUTH_TOKEN"] = uuid.uuid4().hex
    env["SPOTWARP_HUB_STORAGE"] = f"{storage_root}/{{username}}/{{server_name}}"  # what deploy/jupyterhub_config.py reads
    env["SPOTWARP_HUB_KEY_SECRET"] = HUB_KEY_SECRET  # each user's server signs with a key derived from it
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(config)], cwd=tmp, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/"
    hub = Hub(url, admin_token, tmp / "homes", proc, log, storage_root, target.options)

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"the hub exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            return requests.get(f"{url}hub/api/", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    try:
        poll("the hub answering on its public URL", up, timeout=90, log=log)
        yield hub
    finally:
        for name in hub.tokens:
            try:
                hub.api("DELETE", f"users/{name}/server")
            except requests.RequestException:
                pass
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # the hub stops its proxy and (cleanup_servers) the user servers
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # anything of the hub's session still alive
        except ProcessLookupError:
            pass




def snapshot(hub: Hub, name: str, message: str) -> dict[str, Any]:
    reply = hub.call("POST", name, "spotwarp/api/snapshots", json={"message": message})
    assert reply.status_code == 201, reply.text
    return reply.json()


def listing(hub: Hub, owner: str, as_user: str | None = None) -> list[dict[str, Any]]:
    reply = hub.call("GET", owner, "spotwarp/api/snapshots", as_user=as_user)
    assert reply.status_code == 200, reply.text
    return reply.json()["snapshots"]


TRAIN_SETUP = """%load_ext spotwarp
%spotwarp policy --every 0.2s --no-after-cell
import random, time, spotwarp
random.seed(5)
w, seen = 0.0, []
"""
TRAIN = """for step in spotwarp.resumable(range(60), name="train"):
    w = w * 0.9 + random.random()
    seen.append(repr(w))
    print(f"step {len(seen)}", flush=True)
    time.sleep(0.1)
print(f"done: {len(seen)} steps")
"""


def reference_run() -> list[str]:
    import random

    rng, w, seen = random.Random(5), 0.0, []
    for _ in range(60):
        w = w * 0.9 + rng.random()
        seen.append(repr(w))
    return seen


def cell_text(path: Path, cell_id: str) -> str:
    try:
        cells = json.loads(path.read_text())["cells"]
    except (OSError, ValueError):
        return ""  # not there yet, or being replaced
    return "".join("".join(o.get("text", "")) for c in cells if c.get("id") == cell_id for o in c.get("outputs", []))


def train_and_lose_the_server(hub: Hub, name: str, kernel: str) -> None:
    """In `name`'s kernel: the setup cell, then the training cell, sent as JupyterLab sends them (with their ids);
    once snapshots inside the loop are committed, the server and the kernel are SIGKILLed (a lost pod)."""
    before = {s["id"] for s in listing(hub, name)}

    async def run() -> int:
        request = HTTPRequest(hub.url.replace("http", "ws", 1) + f"user/{name}/api/kernels/{kernel}/channels",
                              headers={"Authorization": f"token {hub.tokens[name]}"}, request_timeout=60)
        conn = await websocket_connect(request)
        try:
            pid_run = Execution("import os as _o; print(_o.getpid())")
            setup = Execution(TRAIN_SETUP, cell_id="setup")
            for execution in (pid_run, setup):
                await conn.write_message(execution.request)
                while not execution.done:
                    execution.feed(await asyncio.wait_for(conn.read_message(), 120))
            await conn.write_message(Execution(TRAIN, cell_id="train").request)
            in_loop = await asyncio.to_thread(
                poll, "snapshots inside the training loop", lambda: len([
                    s for s in listing(hub, name) if s["id"] not in before and s["kind"] == "kernel"]) >= 4,
                120, 0.1, hub.log)
            assert in_loop
            return int(pid_run.output().strip())
        finally:
            conn.close()

    kernel_pid = asyncio.run(run())
    server_pid = hub.api("GET", f"users/{name}").json()["servers"][""]["state"]["pid"]
    os.kill(kernel_pid, signal.SIGKILL)
    os.kill(server_pid, signal.SIGKILL)
    hub.stop(name)  # the hub finds its server gone


