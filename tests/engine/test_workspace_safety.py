"""Workspace files a real session holds: odd names, long names, pipes, link chains, secrets, killed restores.

Each test drives the real `spotwarp` command line (a subprocess) against a real local store, or the engine's
backup against a real store where the race it covers must be placed exactly.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from spotwarp_jupyter.engine import SnapshotEngine
from spotwarp_jupyter.engine.files.backup import backup_workspace

from engines import UNSIGNED, make_engine
from lab_server import LabServer, host_env

KEY = "test-signing-key"
PROJECT = "safety"


def cli(*args: str | bytes, store: str, home: Path, key: str | None = KEY, timeout: float = 300) -> subprocess.CompletedProcess:
    """`spotwarp ARGS --project-id safety --storage STORE` as a user runs it, on its own fresh host."""
    env = host_env(home, **({"SPOTWARP_KEY": key} if key else {}))
    return subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", *args, "--project-id", PROJECT,
                           "--storage", store], capture_output=True, env=env, timeout=timeout)


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    return result


def one_line_failure(result: subprocess.CompletedProcess) -> str:
    """The CLI failed with exit 1 and exactly one line on stderr, no traceback; that line."""
    err = result.stderr.decode(errors="replace")
    assert result.returncode == 1, (result.returncode, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


def btree(root: Path) -> dict[bytes, tuple]:
    """Every file, link and folder under root by its exact bytes path: (kind, content or target, mode)."""
    out: dict[bytes, tuple] = {}
    base = os.fsencode(root)
    for dirpath, dirnames, filenames in os.walk(base):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, base)
            st = os.lstat(path)
            if os.path.islink(path):
                out[rel] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                out[rel] = ("dir",)
            else:
                with open(path, "rb") as f:
                    out[rel] = ("file", f.read(), st.st_mode & 0o777)
    return out


@pytest.fixture
def store(tmp_path: Path) -> str:
    return str(tmp_path / "store")


@pytest.fixture
def engine(store: str) -> SnapshotEngine:
    """The same project as the CLI's, signing with the same key (a crafted manifest must be signed to be loaded)."""
    return make_engine(store, PROJECT, key=KEY)


# -- item 3: names that are not UTF-8 -------------------------------------------------------------------
@pytest.mark.process
@pytest.mark.parametrize("key", [KEY, None], ids=["signed", "unsigned"])
def test_names_that_are_not_utf8_round_trip_byte_for_byte(tmp_path, store, key):
    ws = tmp_path / "ws"
    ws.mkdir()
    base = os.fsencode(ws)
    names = [b"caf\xe9.txt", b"\xff\xfe-raw.bin", b"ok-\xc3\xa9t\xc3\xa9.md"]  # latin-1, junk, real UTF-8
    for i, name in enumerate(names):
        with open(os.path.join(base, name), "wb") as f:
            f.write(b"content %d\n" % i)
    os.mkdir(os.path.join(base, b"d\xe9j\xe0"))
    with open(os.path.join(base, b"d\xe9j\xe0", b"n\xf6te"), "wb") as f:
        f.write(b"nested")
    os.symlink(b"d\xe9j\xe0/n\xf6te", os.path.join(base, b"lien-\xe9"))
    (ws / "plain.txt").write_text("plain")

    snap = ok(cli("snapshot", "--workspace-path", str(ws), "--json", "-m", "odd names", store=store,
                  home=tmp_path / "a", key=key))
    assert json.loads(snap.stdout)["files"] == 6  # five files and a link
    ok(cli("list", store=store, home=tmp_path / "a", key=key))
    assert b"ok:" in ok(cli("verify", store=store, home=tmp_path / "a", key=key)).stdout

    target = tmp_path / "new-host" / "ws"
    ok(cli("restore", "--workspace-path", str(target), store=store, home=tmp_path / "b", key=key))
    assert btree(target) == btree(ws)


@pytest.mark.process
def test_a_message_that_is_not_utf8_is_refused_in_one_line(tmp_path, store):
    ws = tmp_path / "ws"
    ws.mkdir()
    err = one_line_failure(cli("snapshot", "--workspace-path", str(ws), "-m", b"note \xff", store=store,
                               home=tmp_path / "a"))
    assert "--message must be text" in err
    assert not (Path(store) / PROJECT / "snapshots").is_dir() or not list((Path(store) / PROJECT / "snapshots").iterdir())


@pytest.mark.process
def test_automatic_and_final_snapshots_of_names_that_are_not_utf8(tmp_path, store):
    """`spotwarp start` with automatic backups every second, then SIGTERM: both snapshots hold the odd names."""
    ws = tmp_path / "ws"
    ws.mkdir()
    with open(os.path.join(os.fsencode(ws), b"caf\xe9.csv"), "wb") as f:
        f.write(b"a,b\n")
    (ws / "plain.txt").write_text("plain")
    env = host_env(tmp_path / "home", SPOTWARP_BACKUP_INTERVAL="1", SPOTWARP_WATCHERS="signals", SPOTWARP_KEY=KEY)
    server = LabServer(ws, store, PROJECT, env, tmp_path / "lab.log")
    engine = make_engine(store, PROJECT)
    try:
        server.wait_ready()
        deadline = time.monotonic() + 120
        status: dict = {}
        while time.monotonic() < deadline:
            status = server.request("GET", "spotwarp/api/status")[1]
            if status["last_snapshot"] or status["last_error"]:
                break
            time.sleep(0.1)  # poll interval of a deadline-bounded wait for the first automatic backup
        assert status["last_error"] is None and status["last_snapshot"], (status, server.log()[-2000:])
        assert status["last_snapshot"]["message"] == "automatic backup" and status["last_snapshot"]["files"] == 2
        (ws / "plain.txt").write_text("changed before the notice")
        os.kill(server.proc.pid, signal.SIGTERM)
        assert server.proc.wait(timeout=120) == 0, server.log()[-3000:]
    finally:
        server.kill()
    final = engine.get("latest")
    assert final.message.startswith("final snapshot"), server.log()[-3000:]
    assert set(final.files["entries"]) == {os.fsdecode(b"caf\xe9.csv"), "plain.txt"}


# -- item 4: names up to the filesystem's limit ----------------------------------------------------------
@pytest.mark.process
def test_names_of_255_bytes_back_up_and_restore(tmp_path, store):
    ws = tmp_path / "ws"
    ws.mkdir()
    longest = "n" * 251 + ".bin"  # 255 bytes: the most ext4, xfs and tmpfs allow
    wide = "\u00e9" * 127  # 254 bytes of UTF-8
    (ws / longest).write_bytes(os.urandom(1000))
    (ws / ("d" * 255)).mkdir()
    (ws / ("d" * 255) / ("f" * 255)).write_text("deep")
    (ws / wide).write_text("wide")
    (ws / ("l" * 255)).symlink_to(longest)

    ok(cli("snapshot", "--workspace-path", str(ws), store=store, home=tmp_path / "a"))
    target = tmp_path / "new-host" / "ws"
    ok(cli("restore", "--workspace-path", str(target), store=store, home=tmp_path / "b"))
    assert btree(target) == btree(ws)
    # restoring again over the same files: everything already in place
    again = json.loads(ok(cli("restore", "--workspace-path", str(target), "--json", store=store,
                              home=tmp_path / "b")).stdout)
    assert again["files_unchanged"] == 3 and again["files_restored"] == 0


# -- item 5: a file replaced by a pipe while the backup runs ------------------------------------------
def test_a_file_replaced_by_a_fifo_during_backup_is_skipped_not_waited_on(tmp_path, engine):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.bin").write_bytes(os.urandom(200_000))
    (ws / "b.txt").write_text("about to become a pipe")
    (ws / "c.txt").write_text("after the pipe")
    swapped = []

    def replace_b(done: int, total: int, relpath: str) -> None:
        # between the scan (b.txt a regular file) and its read, b.txt becomes a named pipe nobody writes to
        if relpath == "a.bin" and not swapped:
            (ws / "b.txt").unlink()
            os.mkfifo(ws / "b.txt")
            swapped.append(True)

    result: dict = {}

    def run() -> None:
        try:
            result["files"] = backup_workspace(engine.store, str(ws), progress=replace_b)[0]
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            result["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=60)
    try:
        assert not worker.is_alive(), "the backup is blocked opening a named pipe"
    finally:
        if worker.is_alive():  # let the blocked open return so the thread ends
            fd = os.open(ws / "b.txt", os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
            worker.join(timeout=30)
    assert swapped and "error" not in result, result
    files = result["files"]
    assert set(files["entries"]) == {"a.bin", "c.txt"}
    assert "not a regular file" in files["skipped"]["b.txt"]


@pytest.mark.process
def test_pipes_sockets_and_fifos_present_from_the_start_are_skipped_by_the_cli(tmp_path, store):
    import socket

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "kept.txt").write_text("kept")
    os.mkfifo(ws / "pipe")
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(ws / "sock"))
        out = json.loads(ok(cli("snapshot", "--workspace-path", str(ws), "--json", store=store,
                                home=tmp_path / "a", timeout=120)).stdout)
    finally:
        sock.close()
    assert out["files"] == 1


# -- item 6: link chains that leave the workspace -------------------------------------------------------
def escapes(root: Path) -> list[str]:
    """Links under root through which something outside root is reachable."""
    real_root = os.path.realpath(root)
    bad = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                resolved = os.path.realpath(path)
                if resolved != real_root and not resolved.startswith(real_root + os.sep):
                    bad.append(f"{os.path.relpath(path, root)} -> {resolved}")
    return bad


DEEP = "z/b/c/d/e/f/g"  # seven folders: `../` seven times from its link leads back to the workspace root


def commit_links(engine: SnapshotEngine, links: dict[str, str], message: str) -> str:
    """A signed project snapshot naming only these links (as a crafted, correctly signed manifest would)."""
    manifest = engine.new_manifest("project", message, files={
        "entries": {path: {"link": target, "size": 0} for path, target in links.items()}}, objects={})
    return engine.commit_manifest(manifest).id


@pytest.mark.process
def test_a_link_chain_in_one_snapshot_that_leaves_the_workspace_is_refused(tmp_path, store, engine):
    # l2 resolves to the workspace root; l1 passes through it and climbs out. The lexical check sees
    # l1 -> DEEP/l2/../../../../../../../../etc as `etc` inside the workspace. l1 sorts (and is planted) first.
    evil = commit_links(engine, {
        f"{DEEP}/l2": "../" * 6 + "..",
        "l1": f"{DEEP}/l2/" + "../" * 8 + "etc",
    }, "chain")
    target = tmp_path / "new-host" / "ws"
    err = one_line_failure(cli("restore", "--workspace-path", str(target), "--snapshot", evil, store=store,
                               home=tmp_path / "b"))
    assert "l1" in err and "refusing" in err
    assert not target.exists() or escapes(target) == []
    assert not (target / "l1").exists() and not os.path.lexists(target / "l1")


@pytest.mark.process
def test_a_link_through_a_link_planted_by_an_earlier_restore_is_refused(tmp_path, store, engine):
    target = tmp_path / "ws"
    first = commit_links(engine, {f"{DEEP}/l2": "../" * 6 + ".."}, "harmless on its own")
    ok(cli("restore", "--workspace-path", str(target), "--snapshot", first, store=store, home=tmp_path / "b"))
    assert os.path.realpath(target / DEEP / "l2") == os.path.realpath(target) and escapes(target) == []
    second = commit_links(engine, {"l1": f"{DEEP}/l2/" + "../" * 8 + "etc"}, "climbs through the planted l2")
    err = one_line_failure(cli("restore", "--workspace-path", str(target), "--snapshot", second, store=store,
                               home=tmp_path / "b"))
    assert "l1" in err and "refusing" in err
    assert escapes(target) == [] and not os.path.lexists(target / "l1")


@pytest.mark.process
def test_a_new_link_that_would_turn_a_planted_link_outward_is_refused(tmp_path, store, engine):
    # s/l -> ../d/../x stays inside while d is nothing; `d -> .` is inside itself, but then s/l leaves
    target = tmp_path / "ws"
    first = commit_links(engine, {"s/l": "../d/../x"}, "inside")
    ok(cli("restore", "--workspace-path", str(target), "--snapshot", first, store=store, home=tmp_path / "b"))
    second = commit_links(engine, {"d": "."}, "turns s/l outward")
    err = one_line_failure(cli("restore", "--workspace-path", str(target), "--snapshot", second, store=store,
                               home=tmp_path / "b"))
    assert "refusing" in err
    assert not os.path.lexists(target / "d")
    (target / "x").write_text("inside")
    assert escapes(target) == []


@pytest.mark.process
def test_link_chains_that_stay_inside_are_restored(tmp_path, store, engine):
    good = commit_links(engine, {
        f"{DEEP}/l2": "../" * 6 + "..",          # the workspace root itself
        "l1": f"{DEEP}/l2/data",                 # through l2 to data, inside
        "up": f"{DEEP}/l2/z/b/../b",             # through l2, down, up, down again
    }, "inside")
    target = tmp_path / "ws"
    out = json.loads(ok(cli("restore", "--workspace-path", str(target), "--snapshot", good, "--json",
                            store=store, home=tmp_path / "b")).stdout)
    assert out["links_restored"] == 3 and escapes(target) == []
    assert os.path.realpath(target / "up") == os.path.realpath(target / "z" / "b")


@pytest.mark.process
def test_a_file_is_never_written_through_a_planted_link(tmp_path, store, engine):
    """A snapshot naming a file under a folder that the workspace holds as a link to elsewhere is refused."""
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "sub" / "f.txt").write_text("payload")
    ok(cli("snapshot", "--workspace-path", str(ws), store=store, home=tmp_path / "a"))
    outside = tmp_path / "outside"
    outside.mkdir()
    target = tmp_path / "target"
    target.mkdir()
    (target / "sub").symlink_to(outside)
    err = one_line_failure(cli("restore", "--workspace-path", str(target), store=store, home=tmp_path / "b"))
    assert "symbolic link" in err
    assert list(outside.iterdir()) == []


def test_where_links_lead_agrees_with_the_kernel(tmp_path):
    """The restore's model of link chains against the real filesystem: random chains planted, realpath as judge."""
    import random

    from spotwarp_jupyter.engine.files.link_safety import Links

    rng = random.Random(14)
    places = ["l1", "l2", "a/l3", "a/x/l4", "b/l5"]
    steps = ["..", ".", "a", "x", "b", "l1", "l2", "l3", "l5", "a/x", "l4"]
    compared = 0
    for trial in range(400):
        root = tmp_path / str(trial) / "p" / "q" / "ws"
        (root / "a" / "x").mkdir(parents=True)
        (root / "b").mkdir()
        links = {}
        for where in rng.sample(places, rng.randint(1, 4)):
            links[where] = "/".join(rng.choice(steps) for _ in range(rng.randint(1, 5)))
            (root / where).symlink_to(links[where])
        real_root = os.path.realpath(root)
        model = Links(real_root, links)
        for rel in links:
            try:
                os.stat(root / rel)
            except OSError as exc:
                if exc.errno == 40:  # a loop: the kernel reaches nothing, realpath cannot judge
                    continue
            resolved = os.path.realpath(root / rel)
            inside = resolved == real_root or resolved.startswith(real_root + os.sep)
            assert model.stays_inside(rel) == inside, (links, rel, resolved)
            compared += 1
    assert compared > 500


# -- item 9: credentials in a home-folder workspace -----------------------------------------------------
SECRETS = [".ssh/id_ed25519", ".ssh/config", ".aws/credentials", ".aws/sso/cache/token.json", ".netrc",
           ".git-credentials", ".env", ".env.local", "project/.env", ".bash_history", ".zsh_history",
           ".python_history", ".docker/config.json", ".kube/config", ".config/gcloud/credentials.db", ".pgpass",
           ".pypirc", ".kaggle/kaggle.json", ".gnupg/private-keys-v1.d/k.key", ".config/gh/hosts.yml",
           ".databrickscfg", ".huggingface/token"]
KEPT = [".bashrc", ".profile", "project/train.ipynb", "project/data.csv", ".env.example", ".config/app.toml",
        ".aws/config"]


def home_workspace(root: Path) -> None:
    for rel in SECRETS + KEPT:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"contents of {rel}\n")


def restored_names(tmp_path: Path, ws: Path, store: str, name: str) -> set[str]:
    ok(cli("snapshot", "--workspace-path", str(ws), store=store, home=tmp_path / "a"))
    target = tmp_path / name
    ok(cli("restore", "--workspace-path", str(target), store=store, home=tmp_path / "b"))
    return {p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()}


@pytest.mark.process
def test_a_home_folder_workspace_leaves_credentials_out_by_default(tmp_path, store):
    home = tmp_path / "home" / "jovyan"
    home_workspace(home)
    names = restored_names(tmp_path, home, store, "restored")
    assert names == set(KEPT), sorted(names ^ set(KEPT))


@pytest.mark.process
def test_spotwarpignore_negation_brings_credentials_back(tmp_path, store):
    home = tmp_path / "home" / "jovyan"
    home_workspace(home)
    (home / ".spotwarpignore").write_text("!.env\n!.ssh/\n!id_ed25519\n")  # a key file also by its name
    names = restored_names(tmp_path, home, store, "restored")
    back = {".env", "project/.env", ".ssh/id_ed25519", ".ssh/config"}
    assert names == set(KEPT) | back | {".spotwarpignore"}, sorted(names ^ (set(KEPT) | back))


# -- item 12: malformed modes and times in a signed manifest --------------------------------------------
@pytest.mark.process
@pytest.mark.parametrize("bad", [{"mode": "rwxr-xr-x"}, {"mode": None}, {"mode": [493]}, {"mode": 1 << 70},
                                 {"mtime_ns": "yesterday"}, {"mtime_ns": 10**30}, {"mtime_ns": {"s": 1}}])
def test_a_malformed_mode_or_mtime_is_refused_in_one_line(tmp_path, store, engine, bad):
    malformed_metadata_is_refused(tmp_path, store, engine, bad, KEY)


@pytest.mark.process
def test_a_malformed_mode_in_an_unsigned_manifest_is_refused_in_one_line(tmp_path, store):
    unsigned = make_engine(store, PROJECT, key=UNSIGNED)
    malformed_metadata_is_refused(tmp_path, store, unsigned, {"mode": "0644", "mtime_ns": -1.5}, None)


def malformed_metadata_is_refused(tmp_path: Path, store: str, engine: SnapshotEngine, bad: dict,
                                  key: str | None) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("payload")
    os.utime(ws / "f.txt", (time.time() - 60, time.time() - 60))  # old enough to be named again unread
    ok(cli("snapshot", "--workspace-path", str(ws), store=store, home=tmp_path / "a", key=key))
    good = engine.get("latest")
    entry = {**good.files["entries"]["f.txt"], **bad}
    inline = {k: v for k, v in good.files.items() if k != "record"}  # the entries in the manifest itself
    evil = engine.new_manifest("project", "bad metadata", files={**inline, "entries": {"f.txt": entry}},
                               objects=dict(good.objects))
    engine.commit_manifest(evil)
    target = tmp_path / "target"
    err = one_line_failure(cli("restore", "--workspace-path", str(target), "--snapshot", evil.id, store=store,
                               home=tmp_path / "b", key=key))
    assert "f.txt" in err
    assert not target.exists() or list(target.iterdir()) == []
    # the next backup, which reads that manifest as its previous one, still works and reads the file again
    out = json.loads(ok(cli("snapshot", "--workspace-path", str(ws), "--json", store=store,
                            home=tmp_path / "a", key=key)).stdout)
    assert out["files"] == 1
    ok(cli("restore", "--workspace-path", str(tmp_path / "again"), store=store, home=tmp_path / "b", key=key))
    assert (tmp_path / "again" / "f.txt").read_text() == "payload"


@pytest.mark.process
@pytest.mark.parametrize("files", ["not a record", {"entries": ["a"]}, {"entries": {"f.txt": 5}}])
def test_a_malformed_files_record_is_refused_in_one_line(tmp_path, store, engine, files):
    evil = engine.commit_manifest(engine.new_manifest("project", "malformed", files=files))
    target = tmp_path / "target"
    for ref in (evil.id, "latest"):
        result = cli("restore", "--workspace-path", str(target), "--snapshot", ref, store=store, home=tmp_path / "b")
        err = result.stderr.decode()
        assert result.returncode == 1 and "Traceback" not in err, err
        (line,) = err.strip().splitlines()
        assert line.startswith("spotwarp restore: ") and "malformed" in line
    assert not target.exists()


# -- item 13: temporaries of a killed restore ------------------------------------------------------------
def temporaries(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*") if ".spotwarp-tmp-" in p.name)


def stored_content(store: str) -> dict[str, dict[bytes, tuple]]:
    """The store's objects and snapshot manifests (its journal of events aside, which a restore adds to)."""
    root = Path(store) / PROJECT
    return {part: btree(root / part) for part in ("objects", "snapshots")}


@pytest.mark.process
def test_a_killed_restore_leaves_temporaries_the_next_restore_removes(tmp_path, store):
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "big.bin").write_bytes(os.urandom(96 * 1024 * 1024))
    (ws / "sub" / "small.txt").write_text("small")
    ok(cli("snapshot", "--workspace-path", str(ws), store=store, home=tmp_path / "a"))
    store_before = stored_content(store)

    target = tmp_path / "target"
    env = host_env(tmp_path / "b", SPOTWARP_KEY=KEY)
    argv = [sys.executable, "-m", "spotwarp_jupyter.cli", "restore", "--project-id", PROJECT, "--storage", store,
            "--workspace-path", str(target)]
    left: list[str] = []
    for _attempt in range(5):  # until a kill lands while a temporary exists
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)  # poll interval while watching for the temporary (the condition is checked below)
            if target.is_dir() and temporaries(target):
                proc.send_signal(signal.SIGSTOP)  # frozen with its temporary on disk, then killed
                if temporaries(target):
                    proc.kill()
                    break
                proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait(timeout=30)
        left = temporaries(target) if target.is_dir() else []
        if left:
            break
        if target.exists():
            subprocess.run(["rm", "-rf", str(target)], check=True)
    assert left, "the restore was never caught with a temporary on disk"
    # the kill left no partial file under a real name (each is absent or whole), and the store as it was
    source = btree(ws)
    for rel, entry in btree(target).items():
        if entry[0] == "file" and b".spotwarp-tmp-" not in rel:
            assert entry[1] == source.get(rel, ("", b""))[1], f"{rel!r} is partly written under its own name"
    assert stored_content(store) == store_before, "a killed restore changed the store"
    # what an earlier version left behind: `.NAME.spotwarp-tmp-XXXXXXXX` next to the file
    (target / "sub").mkdir(exist_ok=True)
    (target / "sub" / ".small.txt.spotwarp-tmp-0badc0de").write_bytes(b"x" * 1000)
    (target / ".big.bin.spotwarp-tmp-1234abcd").write_bytes(b"y" * 1000)

    # the next backup of that workspace names no temporary
    snap = ok(cli("snapshot", "--workspace-path", str(target), "--json", store=store, home=tmp_path / "b"))
    assert not [p for p in engine_entries(store) if ".spotwarp-tmp-" in p], json.loads(snap.stdout)

    ok(cli("restore", "--workspace-path", str(target), "--snapshot", json.loads(snap.stdout)["parent"],
           store=store, home=tmp_path / "b"))
    assert temporaries(target) == []
    restored = btree(target)
    assert {rel: restored.get(rel) for rel in source} == source  # every file and folder, whole


@pytest.mark.process
def test_the_temporary_of_a_restore_still_running_is_left_alone(tmp_path, store):
    from spotwarp_jupyter.engine.files import temporaries as restore_temporaries

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("payload")
    ok(cli("snapshot", "--workspace-path", str(ws), store=store, home=tmp_path / "a"))
    target = tmp_path / "target"
    target.mkdir()
    running, fd = restore_temporaries.create_locked(str(target))  # this process writes it, as a restore would
    try:
        os.write(fd, b"half written")
        (target / restore_temporaries.new_name()).write_bytes(b"left by a killed restore")
        out = json.loads(ok(cli("restore", "--workspace-path", str(target), "--json", store=store,
                                home=tmp_path / "b")).stdout)
        assert out["temporaries_removed"] == 1
        assert temporaries(target) == [os.path.basename(running)]
    finally:
        os.close(fd)


def engine_entries(store: str) -> list[str]:
    engine = make_engine(store, PROJECT, key=KEY)
    return list(engine.get("latest").files["entries"])
