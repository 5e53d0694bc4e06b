"""`spotwarp hosts` on a messy `hosts/` folder: stray names, wrong types, torn and huge files are skipped and
counted, never a traceback; files are never read whole; silent hosts are shown stale; `--prune` removes them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spotwarp_jupyter.engine.coordination.fence import Lease, write_lease
from spotwarp_jupyter.engine.storage import Store

from lab_server import host_env

pytestmark = pytest.mark.process  # every test here starts a process (a kernel, server or command)

# The CLI runs as the child of a fresh, small Python, which reports its child's peak RSS alone (RUSAGE_CHILDREN):
# measured in the CLI process itself, ru_maxrss would carry the high-water mark of whatever spawned it (Linux
# keeps it across exec), so a test process grown to 1 GB would read as 1 GB here.
MEASURE = """import resource, subprocess, sys
code = subprocess.call([sys.executable, "-m", "spotwarp_jupyter.cli", *sys.argv[1:]])
print("MAXRSS_KB", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)
sys.exit(code)
"""


def beat(ident: str, **fields) -> dict:
    doc = {"id": ident, "candidate": ident, "generation": 1, "state": "standby", "time": time.time(), "beat": 3,
           "interval": 1.0, "ready": True, "ready_at": time.time(), "pid": 1, "port": 1, "url": None,
           "host": "h", "why": None, "restore": {"snapshot": "abc", "duration_s": "fast"}}
    return {**doc, **fields}


def hosts(tmp_path: Path, store: str, *args: str) -> subprocess.CompletedProcess:
    script = tmp_path / "measure.py"
    script.write_text(MEASURE)
    return subprocess.run([sys.executable, str(script), "hosts", "--project-id", "p", "--storage", store, *args],
                          capture_output=True, text=True, env=host_env(tmp_path / "home"), timeout=120)


def test_hosts_skips_stray_files_reads_nothing_whole_marks_stale_and_prunes(tmp_path):
    store = str(tmp_path / "store")
    Store(store, "p")
    write_lease(Store(store, "p"), Lease(2, "live", time.time()))
    folder = tmp_path / "store" / "p" / "hosts"
    folder.mkdir(parents=True)
    (folder / "live.json").write_text(json.dumps(beat("live", generation=2, state="holder")))
    (folder / "dead-holder.json").write_text(json.dumps(beat("dead-holder", state="holder", time=time.time() - 7200)))
    (folder / "loser.json").write_text(json.dumps(beat("loser", time=time.time() - 600)))
    (folder / "bad name!.json").write_text("{}")
    (folder / "soon.json").write_text(json.dumps(beat("soon", time="soon")))
    (folder / "typed.json").write_text(json.dumps(beat("typed", generation="2")))
    (folder / "torn.json").write_text(json.dumps(beat("torn"))[:30])
    (folder / "README").write_text("not a heartbeat")
    with open(folder / "huge.json", "wb") as f:
        f.truncate(200 * 1024 * 1024)  # sparse: 200 MB that costs no disk
    old = time.time() - 7200
    for name in ("torn.json", "huge.json"):
        os.utime(folder / name, (old, old))

    out = hosts(tmp_path, store, "--json")
    assert out.returncode == 0, out.stderr
    rss_kb = int(out.stderr.rsplit("MAXRSS_KB", 1)[1])
    assert rss_kb < 200 * 1024, rss_kb  # the 200 MB file was not read whole
    data = json.loads(out.stdout)
    shown = {h["id"]: h for h in data["hosts"]}
    assert set(shown) == {"live", "dead-holder", "loser"}
    assert not shown["live"]["stale"] and shown["dead-holder"]["stale"] and shown["loser"]["stale"]
    assert sorted(data["unreadable"]) == ["huge", "soon", "torn", "typed"]

    text = hosts(tmp_path, store)
    assert text.returncode == 0 and "lost (was holder)" in text.stdout and "lost (was standby)" in text.stdout, text
    assert "4 unreadable file(s) in hosts/ skipped (damaged" in text.stdout and "Traceback" not in text.stderr

    pruned = json.loads(hosts(tmp_path, store, "--prune", "5m", "--json").stdout)
    assert sorted(pruned["pruned"]) == ["dead-holder", "huge", "loser", "torn"]
    assert sorted(p.name for p in folder.iterdir()) == ["README", "bad name!.json", "live.json", "soon.json",
                                                         "typed.json"]  # recent ones and stray names stay
