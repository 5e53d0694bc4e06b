"""SpotWarp behind a real JupyterHub on 127.0.0.1: two users, each protected, nobody sees another's snapshots.

One hub for the module: DummyAuthenticator with a password, SimpleLocalProcessSpawner (homes under a
temp folder), configurable-http-proxy from npm, the guide's deploy/jupyterhub_config.py and the
single-user image's deploy/jupyter_server_config.py, storage on the moto S3 emulator with one prefix
per user (`s3://bucket/<run>/{username}/{server_name}`). Everything goes through the hub's public URL
with each user's own API token, as a browser or a script of that user would.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

from spotwarp_jupyter.engine import ConfigError, Settings, SnapshotEngine
from spotwarp_jupyter.server.hub import HubIdentity, restore_on_start, shared_prefix_warning, workspace_is_fresh

from engines import make_engine
from lab_server import Execution
from real_hub import (
    HUB_KEY_SECRET,
    TRAIN,
    TRAIN_SETUP,
    USERS,
    Hub,
    cell_text,
    listing,
    poll,
    reference_run,
    running_hub,
    snapshot,
    train_and_lose_the_server,
)

pytest_plugins = ("pytest_jupyter.jupyter_server",)

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]  # a real hub, its proxy and spawned servers


@pytest.fixture(scope="module")
def hub(tmp_path_factory, s3_server) -> Iterator[Hub]:
    with running_hub(tmp_path_factory.mktemp("hub"), s3_server) as running:
        yield running


@pytest.fixture(scope="module")
def two_users(hub: Hub) -> Hub:
    """alice and bob, each with files at home and a running server (started through the hub's API)."""
    for name in USERS:
        hub.add_user(name)
        home = hub.home(name)
        (home / "data").mkdir(parents=True, exist_ok=True)
        (home / "notes.md").write_text(f"# {name}'s notes\n")
        (home / "data" / "values.csv").write_text(f"owner\n{name}\n")
    for name in USERS:
        hub.start(name)
    for name in USERS:
        hub.wait_ready(name)
    return hub


def test_each_user_sees_only_their_own_snapshots(two_users: Hub):
    hub = two_users
    taken = {name: snapshot(hub, name, f"{name}'s work") for name in USERS}
    for name in USERS:
        status = hub.call("GET", name, "spotwarp/api/status").json()
        assert status["storage"] == f"{hub.storage_root}/{name}/default"  # the prefix comes from the hub's identity
        assert status["workspace"] == str(hub.home(name).resolve())
        start = status["start_restore"]  # a kept home, and nothing stored yet: served as it is
        assert start["restored"] is False and start["kept"] is True, start
        assert start["reason"] == "project 'default' has no snapshot with files yet: the workspace's files are " \
            "served as they are" == start["line"], start
        assert [s["id"] for s in listing(hub, name)] == [taken[name]["id"]]
        assert taken[name]["message"] == f"{name}'s work" and taken[name]["files"] >= 2

    # in storage, each user's snapshots lie under their own prefix and nowhere else
    import fsspec

    fs = fsspec.filesystem("s3", **hub.storage_options, skip_instance_cache=True, use_listings_cache=False)
    root = hub.storage_root.split("://", 1)[1]
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(root)) == sorted(USERS)
    for name in USERS:
        manifests = fs.ls(f"{root}/{name}/default/default/snapshots")
        assert [m.rsplit("-", 1)[-1] for m in manifests] == [f"{taken[name]['id']}.json"]


def test_another_users_snapshot_is_refused(two_users: Hub):
    hub = two_users
    theirs = {name: listing(hub, name)[0]["id"] if listing(hub, name) else snapshot(hub, name, "x")["id"]
              for name in USERS}
    # through alice's own server, bob's snapshot id does not exist
    reply = hub.call("POST", "alice", f"spotwarp/api/snapshots/{theirs['bob']}/restore")
    assert reply.status_code == 404, reply.text
    assert theirs["bob"] in reply.json()["message"]
    # ids are validated: no way out of the project through the URL
    for bad in ("..%2F..%2Fbob%2Fdefault", "..", "%2E%2E", "bob%2Fdefault"):
        reply = hub.call("POST", "alice", f"spotwarp/api/snapshots/{bad}/restore")
        assert reply.status_code in (400, 404), (bad, reply.status_code, reply.text)
    # through bob's server URL with alice's token: the hub does not let her in
    for method, path in (("GET", "spotwarp/api/snapshots"), ("GET", "spotwarp/api/status"),
                         ("POST", "spotwarp/api/snapshots"), ("POST", f"spotwarp/api/snapshots/{theirs['bob']}/restore")):
        reply = hub.call(method, "bob", path, as_user="alice")
        assert reply.status_code in (302, 403), (method, path, reply.status_code, reply.text[:300])
        if reply.status_code == 302:
            assert "/hub/" in reply.headers["Location"]
    # without any token: refused too
    reply = requests.get(f"{hub.url}user/bob/spotwarp/api/snapshots", timeout=30, allow_redirects=False)
    assert reply.status_code in (302, 403)
    assert [s["id"] for s in listing(hub, "bob")] == [theirs["bob"]]  # nothing of alice's crept in


def test_shared_server_is_read_only_for_spotwarp(two_users: Hub):
    """alice shares her server with bob (JupyterHub sharing): he can list her snapshots, not take or restore them."""
    hub = two_users
    reply = hub.api("POST", "shares/alice/", json={"user": "bob"})
    assert reply.status_code in (200, 201), reply.text
    try:
        before = listing(hub, "alice")
        assert listing(hub, "alice", as_user="bob") == before
        for method, path in (("POST", "spotwarp/api/snapshots"), ("POST", "spotwarp/api/snapshots/latest/restore")):
            reply = hub.call(method, "alice", path, as_user="bob")
            assert reply.status_code == 403, (method, path, reply.status_code, reply.text)
        assert listing(hub, "alice") == before  # nothing was taken
        assert snapshot(hub, "alice", "the owner still can")["id"]  # the owner keeps every right
    finally:
        hub.api("PATCH", "shares/alice/", json={"user": "bob"})


def server_environment(hub: Hub, name: str) -> dict[str, str]:
    """The environment of `name`'s single-user server process, as the spawner set it."""
    state = hub.api("GET", f"users/{name}").json()["servers"][""]["state"]
    environ = Path(f"/proc/{state['pid']}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in environ if b"=" in item)


def test_each_users_server_signs_with_its_own_key(two_users: Hub):
    keys = {name: server_environment(two_users, name).get("SPOTWARP_KEY") for name in USERS}
    assert all(keys.values()) and keys["alice"] != keys["bob"], keys
    assert HUB_KEY_SECRET not in keys.values()


def websocket_status(hub: Hub, owner: str, path: str, as_user: str) -> int:
    """101 when `as_user` may open the websocket at `path` of `owner`'s server, else the HTTP refusal."""
    import asyncio

    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    async def connect() -> int:
        request = HTTPRequest(hub.url.replace("http", "ws", 1) + f"user/{owner}/{path}",
                              headers={"Authorization": f"token {hub.tokens[as_user]}"}, request_timeout=60)
        try:
            conn = await websocket_connect(request)
        except HTTPClientError as exc:
            return exc.code
        conn.close()
        return 101

    return asyncio.run(connect())


def test_a_shared_user_runs_no_code_unless_the_share_grants_it(two_users: Hub):
    """bob, with alice's server shared to him, may look but not run code or change files; a share with
    `custom:jupyter_server:execute:*` lets him run code, still not write files."""
    hub = two_users
    reply = hub.call("POST", "alice", "api/kernels", json={"name": "python3"})
    assert reply.status_code == 201, reply.text
    kernel = reply.json()["id"]
    reply = hub.api("POST", "shares/alice/", json={"user": "bob"})
    assert reply.status_code in (200, 201), reply.text
    try:
        assert hub.call("GET", "alice", "api/kernels", as_user="bob").status_code == 200
        assert hub.call("GET", "alice", "api/contents/notes.md", as_user="bob").status_code == 200
        refused = {
            "start a kernel": hub.call("POST", "alice", "api/kernels", as_user="bob", json={"name": "python3"}),
            "interrupt": hub.call("POST", "alice", f"api/kernels/{kernel}/interrupt", as_user="bob"),
            "open a terminal": hub.call("POST", "alice", "api/terminals", as_user="bob"),
            "write a file": hub.call("PUT", "alice", "api/contents/planted.py", as_user="bob",
                                     json={"type": "file", "format": "text", "content": "print('bob was here')"}),
        }
        assert {what: r.status_code for what, r in refused.items()} == {what: 403 for what in refused}
        assert websocket_status(hub, "alice", f"api/kernels/{kernel}/channels", "bob") == 403
        assert not (hub.home("alice") / "planted.py").exists()
        assert len(hub.call("GET", "alice", "api/kernels").json()) == 1  # bob started nothing

        # the owner's share grants running code: now he may, and still may not write files
        reply = hub.api("POST", "shares/alice/", json={"user": "bob", "scopes": ["custom:jupyter_server:execute:*"]})
        assert reply.status_code in (200, 201), reply.text
        hub.add_user("bob")  # a new token: alice's server caches what the hub said of the old one for minutes
        assert hub.call("POST", "alice", f"api/kernels/{kernel}/interrupt", as_user="bob").status_code == 204
        assert websocket_status(hub, "alice", f"api/kernels/{kernel}/channels", "bob") == 101
        reply = hub.call("PUT", "alice", "api/contents/planted.py", as_user="bob",
                         json={"type": "file", "format": "text", "content": "x"})
        assert reply.status_code == 403
        # the owner keeps every right
        assert hub.call("POST", "alice", f"api/kernels/{kernel}/interrupt").status_code == 204
    finally:
        hub.api("PATCH", "shares/alice/", json={"user": "bob"})
        hub.call("DELETE", "alice", f"api/kernels/{kernel}")


def run_in_kernel(hub: Hub, owner: str, kernel: str, code: str) -> str:
    """Run `code` in `owner`'s kernel through the hub's proxy (the kernel websocket, as JupyterLab does)."""
    async def run() -> str:
        request = HTTPRequest(hub.url.replace("http", "ws", 1) + f"user/{owner}/api/kernels/{kernel}/channels",
                              headers={"Authorization": f"token {hub.tokens[owner]}"}, request_timeout=60)
        conn = await websocket_connect(request)
        try:
            execution = Execution(code)
            await conn.write_message(execution.request)
            while not execution.done:
                execution.feed(await asyncio.wait_for(conn.read_message(), 120))
            return execution.output()
        finally:
            conn.close()

    return asyncio.run(run())


def test_a_notebook_renamed_before_spotwarp_loads_is_known_by_its_new_name_under_a_hub(two_users: Hub):
    """JupyterLab asks for a name at the first save, before `%load_ext spotwarp`: the single-user server records
    the new name beside the kernel's connection file, where the kernel (its child) reads it at load."""
    hub = two_users
    blank = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    assert hub.call("PUT", "alice", "api/contents/Untitled.ipynb",
                    json={"type": "notebook", "format": "json", "content": blank}).status_code in (200, 201)
    reply = hub.call("POST", "alice", "api/sessions", json={"path": "Untitled.ipynb", "name": "Untitled.ipynb",
                                                            "type": "notebook", "kernel": {"name": "python3"}})
    assert reply.status_code == 201, reply.text
    session, kernel = reply.json()["id"], reply.json()["kernel"]["id"]
    try:
        assert hub.call("PATCH", "alice", "api/contents/Untitled.ipynb", json={"path": "train.ipynb"}).status_code == 200
        reply = hub.call("PATCH", "alice", f"api/sessions/{session}", json={"path": "train.ipynb", "name": "train.ipynb"})
        assert reply.status_code == 200, reply.text
        said = run_in_kernel(hub, "alice", kernel, "%load_ext spotwarp\n%spotwarp off\nimport os\n"
                             "s = __import__('spotwarp_jupyter.kernel.session', fromlist=['x']).current()\n"
                             "print(os.environ['JPY_SESSION_NAME'].rsplit('/', 1)[-1], repr(s.notebook))")
        assert "Untitled.ipynb 'train.ipynb'" in said, said  # its environment still says the first name
    finally:
        hub.call("DELETE", "alice", f"api/sessions/{session}")


def test_prestop_hook_snapshots_through_the_servers_own_token(two_users: Hub):
    """What a Kubernetes preStop hook runs in the pod: a snapshot through the server, with the pod's env."""
    hub = two_users
    state = hub.api("GET", "users/bob").json()["servers"][""]["state"]
    environ = Path(f"/proc/{state['pid']}/environ").read_bytes().split(b"\0")
    env = dict(item.decode().split("=", 1) for item in environ if b"=" in item)
    assert env["JUPYTERHUB_USER"] == "bob"
    before = {s["id"] for s in listing(hub, "bob")}
    done = subprocess.run([sys.executable, "-m", "spotwarp_jupyter.server.hub", "prestop", "--timeout", "60"],
                          env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    after = listing(hub, "bob")
    assert after[0]["id"] not in before and after[0]["message"] == "preStop: the pod is stopping"
    assert after[0]["id"] in done.stdout


def test_new_server_on_an_empty_home_restores_that_users_workspace(two_users: Hub):
    hub = two_users
    (hub.home("alice") / "notes.md").write_text("# alice's notes, edited\n")
    last = snapshot(hub, "alice", "before the preemption")
    hub.stop("alice")
    shutil.rmtree(hub.home("alice"))  # a new pod: nothing of alice's on this disk
    hub.home("alice").mkdir()
    hub.start("alice")
    hub.wait_ready("alice")
    assert (hub.home("alice") / "notes.md").read_text() == "# alice's notes, edited\n"
    assert (hub.home("alice") / "data" / "values.csv").read_text() == "owner\nalice\n"
    status = hub.call("GET", "alice", "spotwarp/api/status").json()
    restored = status["start_restore"]
    # from alice's newest snapshot holding files: the one taken above, or the final one the server
    # took when the hub stopped it (SIGTERM)
    newest = [s for s in listing(hub, "alice") if s["kind"] == "project"]
    assert last["id"] in {s["id"] for s in newest}
    assert restored["restored"] is True and restored["id"] == newest[0]["id"], (restored, newest[:2])
    assert restored["files_restored"] >= 2 and restored["host"]
    # bob's workspace and snapshots are untouched by alice's restore
    assert (hub.home("bob") / "notes.md").read_text() == "# bob's notes\n"
    assert all(s["id"] != last["id"] for s in listing(hub, "bob"))


# -- a respawned server resumes the training by itself, its home kept or new --------------------------
def _resumed(hub: Hub, name: str) -> dict[str, Any]:
    """Once the respawned server's resume of train.ipynb finished: its entry; the outputs and state checked."""
    def entry() -> dict[str, Any] | None:
        status = hub.call("GET", name, "spotwarp/api/status").json()
        found = [e for e in status.get("resume") or [] if e["notebook"] == "train.ipynb"]
        return found[0] if found and found[0]["state"] in ("finished", "failed") else None

    done = poll("the resumed training cell to finish", entry, timeout=180, log=hub.log)
    assert done["state"] == "finished" and done["cell"] == "train", done
    notebook = hub.home(name) / "train.ipynb"
    text = poll("the resumed cell's last output in the notebook", lambda: "done:" in cell_text(notebook, "train")
                and cell_text(notebook, "train"), timeout=60, log=hub.log)
    assert "done: 60 steps" in text
    steps = [int(line.split()[1]) for line in text.splitlines() if line.startswith("step ")]
    assert steps == list(range(1, 61)), steps  # the loop went on at the next step, nothing run twice
    assert run_in_kernel(hub, name, done["kernel_id"], "print(seen == _ref)".replace(
        "_ref", repr(reference_run()))).strip() == "True"  # bit for bit an uninterrupted run's values
    return done


def _file_id_database_held(hub: Hub, name: str) -> list[str]:
    """The paths of jupyter_server_fileid's database the user's server holds open (' (deleted)': replaced under it)."""
    pid = hub.api("GET", f"users/{name}").json()["servers"][""]["state"]["pid"]
    held = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if "file_id_manager.db" in target:
            held.append(target)
    return held


def test_a_respawned_server_resumes_the_training_with_its_home_kept_or_new(two_users: Hub):
    hub = two_users
    home = hub.home("alice")
    cells = [{"cell_type": "code", "execution_count": None, "id": cid, "metadata": {}, "outputs": [], "source": src}
             for cid, src in (("setup", TRAIN_SETUP), ("train", TRAIN))]
    (home / "train.ipynb").write_text(json.dumps({"cells": cells, "metadata": {"kernelspec": {
        "name": "python3", "language": "python", "display_name": "Python 3"}}, "nbformat": 4, "nbformat_minor": 5}))
    # JupyterLab opening the notebook: collaboration gives it a room, and the file-id database an entry
    reply = hub.call("PUT", "alice", "api/collaboration/session/train.ipynb", json={"format": "json", "type": "notebook"})
    assert reply.status_code in (200, 201), reply.text
    reply = hub.call("POST", "alice", "api/sessions", json={"path": "train.ipynb", "name": "train.ipynb",
                                                            "type": "notebook", "kernel": {"name": "python3"}})
    assert reply.status_code == 201, reply.text
    train_and_lose_the_server(hub, "alice", reply.json()["kernel"]["id"])

    # the home outlived the server: its files stay as they are, the kernel resumes from the newest snapshot
    (home / "notes.md").write_text("# alice's notes, after the last snapshot\n")
    hub.start("alice")
    hub.wait_ready("alice")
    entry = _resumed(hub, "alice")
    assert "the notebook on disk kept as it is" in entry["line"], entry["line"]
    assert (home / "notes.md").read_text() == "# alice's notes, after the last snapshot\n"
    start = hub.call("GET", "alice", "spotwarp/api/status").json()["start_restore"]
    assert start["restored"] is True and start["kept"] is True and "kept as they are" in start["line"], start
    log = hub.log.read_text()
    assert re.search(r"\[I [\d: .-]+ [^\]]*\] SpotWarp start restore: the workspace .* already holds files", log)
    assert re.search(r"\[I [\d: .-]+ [^\]]*\] SpotWarp resume: train.ipynb: restored from snapshot", log)

    # again, and this time the server comes back on a new, empty home; the home was backed up whole meanwhile (the
    # backup loop's, or the panel's Snapshot now), with whatever Jupyter keeps in it
    snapshot(hub, "alice", "the whole home")
    train_and_lose_the_server(hub, "alice", entry["kernel_id"])
    shutil.rmtree(home)
    home.mkdir()
    logged = len(hub.log.read_text())
    hub.start("alice")
    hub.wait_ready("alice")
    entry = _resumed(hub, "alice")
    start = hub.call("GET", "alice", "spotwarp/api/status").json()["start_restore"]
    assert start["restored"] is True and start["kept"] is False, start
    # Jupyter's own state was never backed up nor written under the running server: its file-id database is the
    # one it opened, and the outputs went live into the open notebook
    held = _file_id_database_held(hub, "alice")
    assert held and not any(p.endswith("(deleted)") for p in held), held
    after = hub.log.read_text()[logged:]
    assert "readonly database" not in after, after[-4000:]
    assert "outputs of cell train go live into the notebook's shared document" in after, after[-4000:]
    # another user's token is refused on alice's server, as ever
    assert hub.call("GET", "alice", "spotwarp/api/status", as_user="bob").status_code in (302, 403)


LONG_SETUP = """%load_ext spotwarp
%spotwarp policy --every 10m --no-after-cell
import pathlib
progress = pathlib.Path({progress!r})
"""
LONG = """import time, spotwarp
for step in spotwarp.resumable(range(100000), name="long"):
    done = step + 1
    progress.write_text(str(done))
    time.sleep(0.02)
"""


def test_a_prestop_hook_while_training_then_sigterm_commit_the_newest_state(two_users: Hub, tmp_path, monkeypatch):
    """The pod is stopped while bob trains: the preStop hook (through the server's own token) gets a snapshot
    taken at a step after it asked, while the cell goes on; SIGTERM's final snapshot then commits, and no
    snapshot holds older training state than one committed before it."""
    hub, name = two_users, "bob"
    progress = tmp_path / "progress"
    reply = hub.call("POST", name, "api/sessions", json={"path": "long.ipynb", "name": "long.ipynb",
                                                         "type": "notebook", "kernel": {"name": "python3"}})
    assert reply.status_code == 201, reply.text
    kernel = reply.json()["kernel"]["id"]
    env = server_environment(hub, name)
    for variable in ("JUPYTERHUB_USER", "JUPYTERHUB_SERVER_NAME"):  # reading the store as bob's server does
        monkeypatch.setenv(variable, env.get(variable, ""))
    settings = Settings.resolve(env=env)
    engine = SnapshotEngine(settings, key=env["SPOTWARP_KEY"].encode())

    def position(manifest) -> int:
        return (manifest.kernels.get("long.ipynb") or {}).get("positions", {}).get("long", -1)

    def steps() -> int:  # the loop's count, read between its writes
        return int(poll("the loop's step count", lambda: (text := progress.read_text() if progress.exists()
                                                            else "").isdigit() and text, 30, 0.01))

    async def train_and_stop() -> tuple[int, subprocess.CompletedProcess]:
        request = HTTPRequest(hub.url.replace("http", "ws", 1) + f"user/{name}/api/kernels/{kernel}/channels",
                              headers={"Authorization": f"token {hub.tokens[name]}"}, request_timeout=60)
        conn = await websocket_connect(request)
        try:
            setup = Execution(LONG_SETUP.format(progress=str(progress)), cell_id="setup")
            await conn.write_message(setup.request)
            while not setup.done:
                setup.feed(await asyncio.wait_for(conn.read_message(), 120))
            await conn.write_message(Execution(LONG, cell_id="long").request)
            await asyncio.to_thread(poll, "the loop past step 20", lambda: steps() > 20, 120, 0.05, hub.log)
            asked_at = steps()
            hook = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "spotwarp_jupyter.server.hub",
                                                            "prestop", "--timeout", "5"],
                                           env=env, capture_output=True, text=True, timeout=60)
            return asked_at, hook
        finally:
            conn.close()

    asked_at, hook = asyncio.run(train_and_stop())
    assert hook.returncode == 0, hook.stderr
    assert steps() > asked_at  # the cell went on: the hook never waited for its end
    by_hook = next(m for m in engine.manifests() if m.id in hook.stdout)
    # the kernel's state as of a step after the request, not its last committed one
    assert by_hook.stats.get("kernels_fresh") == ["long.ipynb"], by_hook.stats
    assert position(by_hook) >= asked_at, (position(by_hook), asked_at)
    committed = {m.id for m in engine.manifests()}
    hub.stop(name)  # the spawner's SIGINT/SIGTERM: the server's final snapshot, then its exit
    engine = SnapshotEngine(settings, key=env["SPOTWARP_KEY"].encode())
    final = [m for m in engine.manifests() if m.id not in committed]
    assert final, "no final snapshot after SIGTERM"
    assert position(final[0]) >= max(position(m) for m in engine.manifests()), [
        (m.id, m.message, position(m)) for m in engine.manifests()]
    assert position(final[0]) >= position(by_hook) > 0


# -- the same isolation without a hub: every door refuses another user's prefix -------------------
HUB_ENV = {"JUPYTERHUB_USER": "alice", "JUPYTERHUB_SERVER_NAME": "",
           "SPOTWARP_STORAGE": "s3://team/spotwarp/{username}/{server_name}"}


def test_storage_flags_cannot_leave_the_users_prefix():
    mine = Settings.resolve(env=HUB_ENV)
    assert mine.storage == "s3://team/spotwarp/alice/default"
    assert Settings.resolve(storage="s3://team/spotwarp/alice/default/scratch", env=HUB_ENV).storage.endswith("/scratch")
    assert Settings.resolve(storage="s3://team/spotwarp/{username}/{server_name}", env=HUB_ENV).storage == mine.storage
    for other in ("s3://team/spotwarp/bob/default", "s3://team/spotwarp/alice", "s3://team/spotwarp/alicex/default",
                  "gs://team/spotwarp/alice/default", "s3://elsewhere/x"):
        with pytest.raises(ConfigError, match="outside your prefix s3://team/spotwarp/alice/default"):
            Settings.resolve(storage=other, env=HUB_ENV)
    for sneaky in ("s3://team/spotwarp/alice/default/../../bob/default", "s3://team/spotwarp/alice/default/./x"):
        with pytest.raises(ConfigError, match="segment"):
            Settings.resolve(storage=sneaky, env=HUB_ENV)
    with pytest.raises(ConfigError, match="safely"):  # a hub name that would climb out of the prefix
        Settings.resolve(env={**HUB_ENV, "JUPYTERHUB_USER": ".."})
    # outside a hub, and for local paths (file permissions decide), flags are free as before
    assert Settings.resolve(storage="s3://team/spotwarp/bob/default", env={}).storage == "s3://team/spotwarp/bob/default"
    assert Settings.resolve(storage="/tmp/elsewhere", env=HUB_ENV).storage == "/tmp/elsewhere"


def test_the_cli_refuses_another_users_prefix_in_one_line(tmp_path):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("SPOTWARP_", "JUPYTERHUB_"))}, **HUB_ENV,
           "HOME": str(tmp_path)}
    for argv in (["list", "--storage", "s3://team/spotwarp/bob/default"],
                 ["gc", "--keep", "1", "--storage", "s3://team/spotwarp/alice/default/../../bob/default"]):
        done = subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", *argv], env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 1, done
        assert len(done.stderr.strip().splitlines()) == 1 and "spotwarp " in done.stderr, done.stderr
        assert "outside your prefix" in done.stderr or "segment" in done.stderr


def test_the_magic_refuses_another_users_prefix_and_fills_username_from_the_hub(start_kernel, s3_server):
    target = s3_server.target(f"magic-{uuid.uuid4().hex[:8]}")
    template = f"{target.url}/{{username}}/{{server_name}}"
    kernel = start_kernel("alice-pod", **target.kernel_env(SPOTWARP_STORAGE=template, JUPYTERHUB_USER="alice",
                                                           JUPYTERHUB_SERVER_NAME="gpu"))
    kernel.run("%load_ext spotwarp")
    mine = f"{target.url}/alice/gpu"
    assert kernel.value("__import__('spotwarp_jupyter.kernel.session', fromlist=['x']).current().settings.storage") == mine
    ename, evalue, _ = kernel.run_error(f"%spotwarp policy --storage {target.url}/bob/gpu")
    assert ename == "UsageError" and "outside your prefix" in evalue and "\n" not in evalue.strip()
    ename, evalue, _ = kernel.run_error(f"%spotwarp policy --storage {target.url}/alice/gpu/../../bob/gpu")
    assert ename == "UsageError" and "segment" in evalue
    # {username} typed in the magic is the hub user, never a shared fallback name
    out = kernel.run(f"%spotwarp policy --storage {template}/scratch --project notes")
    assert f"storage {mine}/scratch" in out
    kernel.run("x = 41")
    out = kernel.run("%spotwarp snapshot")
    assert "SpotWarp snapshot" in out
    fs = target.filesystem()
    assert fs.ls(f"{target.url.split('://', 1)[1]}/alice/gpu/scratch/notes/snapshots")
    assert not fs.exists(f"{target.url.split('://', 1)[1]}/bob")


# -- authorization: jupyter_server's model, resource "spotwarp" -----------------------------------
def _authorizer(denied: set[str]):
    from jupyter_server.auth.authorizer import Authorizer

    class Limited(Authorizer):
        def is_authorized(self, handler, user, action, resource):
            return not (resource == "spotwarp" and action in denied)

    return Limited


@pytest.fixture
def jp_server_config(jp_server_config, request, monkeypatch):
    """conftest's server, not under a hub, whose authorizer refuses the test class's `DENIED` spotwarp actions."""
    for name in ("JUPYTERHUB_USER", "SPOTWARP_RESTORE_ON_START"):
        monkeypatch.delenv(name, raising=False)
    denied = getattr(request.cls, "DENIED", set())
    return {**jp_server_config, "ServerApp": {**jp_server_config["ServerApp"], "authorizer_class": _authorizer(denied)}}


async def _code(jp_fetch, method: str, *parts: str) -> int:
    try:
        reply = await jp_fetch(*parts, method=method, body="" if method == "POST" else None)
    except HTTPClientError as exc:
        return exc.code
    return reply.code


class TestReadOnlyAccess:
    DENIED = {"write", "execute"}

    async def test_can_list_but_not_snapshot_or_restore(self, jp_fetch, jp_root_dir):
        (jp_root_dir / "a.txt").write_text("a")
        assert await _code(jp_fetch, "GET", "spotwarp", "api", "status") == 200
        assert await _code(jp_fetch, "GET", "spotwarp", "api", "snapshots") == 200
        assert await _code(jp_fetch, "POST", "spotwarp", "api", "snapshots") == 403
        assert await _code(jp_fetch, "POST", "spotwarp", "api", "snapshots", "latest", "restore") == 403
        reply = await jp_fetch("spotwarp", "api", "snapshots")
        assert json.loads(reply.body)["snapshots"] == []  # the refused snapshot was never taken


class TestWriteWithoutExecute:
    DENIED = {"execute"}

    async def test_can_snapshot_but_not_restore_into_kernels(self, jp_fetch, jp_root_dir):
        (jp_root_dir / "a.txt").write_text("a")
        assert await _code(jp_fetch, "POST", "spotwarp", "api", "snapshots") == 201
        (jp_root_dir / "a.txt").unlink()
        assert await _code(jp_fetch, "POST", "spotwarp", "api", "snapshots", "latest", "restore") == 403
        assert not (jp_root_dir / "a.txt").exists()  # nothing was restored


# -- restore-on-start, without a hub ---------------------------------------------------------------
def test_restore_on_start_fills_a_fresh_workspace_and_only_what_a_kept_one_lacks(tmp_path):
    engine = make_engine(tmp_path / "store", "p")
    source = tmp_path / "old-pod"
    (source / "src").mkdir(parents=True)
    (source / "src" / "train.py").write_text("print('train')\n")
    (source / "notes.md").write_text("notes\n")
    taken = engine.snapshot_project(str(source), message="before")
    alice = HubIdentity("alice")

    fresh = tmp_path / "new-pod"
    fresh.mkdir()
    for name in (".bashrc", ".local", "lost+found"):  # what a new home or volume holds
        (fresh / name).mkdir() if name != ".bashrc" else (fresh / name).write_text("# skel\n")
    assert workspace_is_fresh(str(fresh)) and workspace_is_fresh(str(tmp_path / "missing"))
    assert restore_on_start(engine, str(fresh), "auto", None) is None  # auto: only under a hub
    assert restore_on_start(engine, str(fresh), "never", alice) is None
    assert not (fresh / "notes.md").exists()
    done = restore_on_start(engine, str(fresh), "auto", alice)
    assert done["restored"] is True and done["id"] == taken.id and done["files_restored"] == 2
    assert (fresh / "src" / "train.py").read_text() == "print('train')\n"
    (fresh / "notes.md").write_text("changed since\n")
    (fresh / "src" / "train.py").unlink()
    kept = restore_on_start(engine, str(fresh), "if-empty", None)  # a kept workspace: only what it lacks
    assert kept["restored"] is True and kept["kept"] is True and (kept["files_kept"], kept["files_restored"]) == (1, 1), kept
    assert kept["line"].startswith(f"the workspace {fresh} already holds files: kept as they are (1 on disk), 1 "
                                   f"missing restored from snapshot {taken.id}"), kept["line"]
    assert (fresh / "notes.md").read_text() == "changed since\n"  # never overwritten
    assert (fresh / "src" / "train.py").read_text() == "print('train')\n"

    # a damaged snapshot: reported, not raised (the server still starts), nothing half-written
    oid = taken.files["entries"]["notes.md"]["chunks"][0]["id"]
    with open(engine.store.object_path(oid), "r+b") as f:
        f.write(b"X")
    other = tmp_path / "third-pod"
    done = restore_on_start(SnapshotEngine(engine.settings), str(other), "if-empty", alice)
    assert done["restored"] is False and oid in done["error"]
    assert not (other / "notes.md").exists()
    empty = make_engine(tmp_path / "store", "none")
    assert restore_on_start(empty, str(tmp_path / "fourth"), "if-empty", alice)["reason"] == \
        "project 'none' has no snapshot with files yet: starting with an empty workspace"


def test_restore_on_start_setting_is_checked(monkeypatch):
    from spotwarp_jupyter.server.app import SpotWarp
    from spotwarp_jupyter.server.hub import restore_mode

    monkeypatch.setenv("SPOTWARP_RESTORE_ON_START", "never")
    config = SpotWarp()
    config.resolve()
    assert config.restore_on_start == "never"
    assert restore_mode("IF-EMPTY") == "if-empty"
    with pytest.raises(ConfigError, match="restore_on_start must be one of auto, if-empty, never"):
        restore_mode("sometimes")


def test_a_shared_prefix_under_a_hub_is_warned_about():
    alice = HubIdentity("alice")
    assert "not per user" in shared_prefix_warning("s3://team/spotwarp", alice)
    assert shared_prefix_warning("s3://team/spotwarp/alice/default", alice) is None
    assert shared_prefix_warning("/home/alice/.spotwarp/store", alice) is None  # local: the user's own disk
    assert shared_prefix_warning("s3://team/spotwarp", None) is None
