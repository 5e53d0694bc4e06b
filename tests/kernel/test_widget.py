"""The status widget in real kernels, driven through the Jupyter widget protocol as a browser would."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from engines import make_engine

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
WIDGET_DIR = Path(__file__).parents[2] / "spotwarp_jupyter" / "widget"


def execute(kernel, code: str) -> list[dict]:
    """Run `code`; return every iopub message it caused (comm opens and updates included)."""
    msgs: list[dict] = []
    reply = kernel.kc.execute_interactive(code, timeout=120, output_hook=msgs.append, allow_stdin=False)
    assert reply["content"]["status"] == "ok", reply["content"]
    return msgs


def widget_open(msgs: list[dict]) -> tuple[str, dict]:
    """The comm id and initial state of the one StatusWidget opened by these messages."""
    opens = [m for m in msgs if m["msg_type"] == "comm_open"
             and m["content"]["data"]["state"].get("_model_name") == "AnyModel"]
    assert len(opens) == 1, [m["msg_type"] for m in msgs]
    content = opens[0]["content"]
    shown = [m for m in msgs if m["msg_type"] in ("display_data", "execute_result")
             and WIDGET_MIME in m["content"]["data"]]
    assert shown and shown[0]["content"]["data"][WIDGET_MIME]["model_id"] == content["comm_id"]
    return content["comm_id"], dict(content["data"]["state"])


def send_action(kernel, comm_id: str, state: dict, content: dict[str, Any], deadline_s: float = 120,
                request_id: str | None = "auto") -> dict:
    """Send a button's custom message (with a fresh request id); apply the kernel's state updates until it is
    idle again; the widget's `answered` must then echo the request id."""
    if request_id == "auto":
        request_id = uuid.uuid4().hex[:12]
    if request_id is not None:
        content = {**content, "request_id": request_id}
    msg = kernel.kc.session.msg("comm_msg", {"comm_id": comm_id, "data": {"method": "custom", "content": content}})
    kernel.kc.shell_channel.send(msg)
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        m = kernel.kc.get_iopub_msg(timeout=deadline - time.monotonic())
        if m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == comm_id:
            data = m["content"]["data"]
            if data.get("method") == "update":
                state.update(data["state"])
        if (m["msg_type"] == "status" and m["content"]["execution_state"] == "idle"
                and m["parent_header"].get("msg_id") == msg["header"]["msg_id"]):
            assert state.get("answered") == (request_id or ""), (state.get("answered"), request_id)
            return state
    raise AssertionError(f"no answer to {content} within {deadline_s}s")


@pytest.fixture
def nb_env() -> dict[str, str]:
    return {"JPY_SESSION_NAME": "train.ipynb"}


def test_load_ext_shows_widget_and_snapshot_button_protects(start_kernel, store_url, nb_env):
    k = start_kernel("host-a", **nb_env)
    comm_id, state = widget_open(execute(k, "%load_ext spotwarp"))
    status = state["status"]
    assert status["protected"] is False and status["protection"] == "no snapshot from this kernel yet"
    assert status["notebook"] == "train.ipynb" and status["project"] == "proj"
    assert "every 5m" in status["policy_text"]
    assert state["newer"] is None

    k.run("import socket\nweights = list(range(1000))\nsock = socket.socket()")
    state = send_action(k, comm_id, state, {"action": "snapshot"})
    assert state["notice_kind"] == "ok", state["notice"]
    assert state["busy"] == ""
    last = state["status"]["last_snapshot"]
    assert state["status"]["protected"] is True
    assert state["notice"].startswith(f"Snapshot {last['id']}:")
    assert "sock" in state["status"]["skipped"] and "weights" not in state["status"]["skipped"]
    # the newest of two: the first cell's automatic snapshot, then the button's
    assert [m.id for m in make_engine(store_url).manifests("train.ipynb")][:1] == [last["id"]]


def test_second_load_and_magic(start_kernel, nb_env):
    k = start_kernel("host-a", **nb_env)
    widget_open(execute(k, "%load_ext spotwarp"))
    again = execute(k, "%load_ext spotwarp")
    assert not [m for m in again if m["msg_type"] == "comm_open"], "the widget shows on the first load only"
    comm_id, state = widget_open(execute(k, "%spotwarp widget"))
    assert state["status"]["notebook"] == "train.ipynb"
    ename, evalue, _ = k.run_error("%spotwarp widget now")
    assert ename == "UsageError" and "takes no arguments" in evalue


def test_show_widget_false_shows_nothing(start_kernel, nb_env):
    k = start_kernel("host-a", **nb_env)
    msgs = execute(k, "get_ipython().config.SpotWarpMagics.show_widget = False\n%load_ext spotwarp")
    assert not [m for m in msgs if m["msg_type"] in ("comm_open", "display_data")]


def test_new_host_offers_restore_from_newer_snapshot(start_kernel, nb_env):
    a = start_kernel("host-a", **nb_env)
    a.run("%load_ext spotwarp\nx = 41\nhistory = {'loss': [0.9, 0.5]}")
    a.run("%spotwarp snapshot -m epoch1")
    taken = a.value("__import__('spotwarp_jupyter').kernel.session.current().last.id")
    a.kill()

    b = start_kernel("host-b", **nb_env)
    comm_id, state = widget_open(execute(b, "%load_ext spotwarp"))
    assert state["newer"]["id"] == taken and state["newer"]["message"] == "epoch1"
    assert state["newer"]["host"] and state["newer"]["created"].endswith("Z")

    state = send_action(b, comm_id, state, {"action": "restore", "id": "no-such-snap"})
    assert state["notice_kind"] == "error" and "\n" not in state["notice"]
    assert "restore failed" in state["notice"] and "no-such-snap" in state["notice"]
    assert b.value("'x' in globals()") is False
    assert state["newer"]["id"] == taken, "a failed restore changes nothing"

    state = send_action(b, comm_id, state, {"action": "restore", "id": taken})
    assert state["notice_kind"] == "ok", state["notice"]
    assert re.match(rf"Restored \d+ variables from {taken} ", state["notice"])
    assert b.value("x") == 41 and b.value("history") == {"loss": [0.9, 0.5]}
    assert state["newer"] is None, "after the restore the kernel holds the newest state"


def test_unknown_action_and_live_update_while_a_cell_runs(start_kernel, nb_env):
    k = start_kernel("host-a", **nb_env)
    comm_id, state = widget_open(execute(k, "%load_ext spotwarp"))
    state = send_action(k, comm_id, state, {"action": "format-disk"})
    assert state["notice_kind"] == "error" and "unknown widget action" in state["notice"]
    last = "getattr(__import__('spotwarp_jupyter').kernel.session.current().last, 'id', None)"
    before = k.value(last)
    state = send_action(k, comm_id, state, {"action": "snapshot"}, request_id=None)
    assert state["notice_kind"] == "error" and "request_id must be" in state["notice"] and "\n" not in state["notice"]
    assert k.value(last) == before  # nothing was taken

    # A snapshot taken by the magic inside a running cell reaches the widget before the cell ends.
    msgs = execute(k, """
import time as _t
from ipywidgets.widgets.widget import _instances as _w
from spotwarp_jupyter.kernel.session import current as _current
get_ipython().run_line_magic('spotwarp', 'snapshot')
_widget = [w for w in _w.values() if type(w).__name__ == 'StatusWidget'][0]
_deadline = _t.monotonic() + 30
while _t.monotonic() < _deadline and (_widget.status['last_snapshot'] or {}).get('id') != _current().last.id:
    _t.sleep(0.05)
""")
    new_id = k.value("__import__('spotwarp_jupyter').kernel.session.current().last.id")
    pushed = [m["content"]["data"]["state"]["status"] for m in msgs
              if m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == comm_id
              and "status" in m["content"]["data"].get("state", {})]
    assert any((s["last_snapshot"] or {}).get("id") == new_id and s["protected"] for s in pushed)


def test_a_running_cell_tells_the_widget_the_kernel_is_busy_and_there(start_kernel, nb_env):
    """A cell's main thread answers no refresh until it ends: the widget's watcher thread says a cell runs."""
    k = start_kernel("host-a", **nb_env)
    comm_id, state = widget_open(execute(k, "%load_ext spotwarp"))
    assert state["cell_running"] == 0
    msgs = execute(k, """
import time as _t
from ipywidgets.widgets.widget import _instances as _w
_widget = [w for w in _w.values() if type(w).__name__ == 'StatusWidget'][0]
_deadline = _t.monotonic() + 30
while _t.monotonic() < _deadline and not _widget.cell_running:
    _t.sleep(0.05)
""")
    said = [m["content"]["data"]["state"]["cell_running"] for m in msgs
            if m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == comm_id
            and "cell_running" in m["content"]["data"].get("state", {})]
    assert said and said[0] > 0, "sent while the cell ran, before its end"


def test_unusable_storage_is_one_line_in_the_widget(start_kernel, tmp_path, nb_env):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the store should be")
    k = start_kernel("host-a", SPOTWARP_STORAGE=str(blocker / "store"), **nb_env)
    comm_id, state = widget_open(execute(k, "%load_ext spotwarp\nx = 1"))
    assert state["status"]["protected"] is False
    assert state["status"]["protection"].startswith("storage: ") and "\n" not in state["status"]["protection"]
    state = send_action(k, comm_id, state, {"action": "snapshot"})
    assert state["notice_kind"] == "error" and state["notice"].startswith("snapshot failed: ")
    assert "\n" not in state["notice"] and state["busy"] == ""
    assert k.value("x") == 1 and not blocker.with_name("store").exists()


def test_widget_module_is_plain_es_module_without_imports():
    from spotwarp_jupyter.widget.status import StatusWidget

    js = str(StatusWidget._esm)  # what the browser gets: format.js (shared with the panel), then widget.js
    assert "export default" in js
    assert not re.search(r"^\s*import\s", js, re.M), "no bundler, no CDN imports"
    assert "http://" not in js and "https://" not in js
    assert (WIDGET_DIR / "widget.css").read_text().count(".spotwarp-") > 10
    shared = (WIDGET_DIR / "format.js").read_text()
    assert js.index(shared) < js.index((WIDGET_DIR / "widget.js").read_text())
    for name in ("formatSize", "formatDuration"):  # defined once, in format.js, which the panel bundles too
        assert len(re.findall(rf"function {name}\(", js)) == 1 and f"export function {name}(" in shared


@pytest.mark.process
@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js")
def test_widget_module_parses_and_formats(tmp_path):
    """The served module is valid JavaScript (no name defined twice) and its formatters answer as agreed."""
    from spotwarp_jupyter.widget.status import StatusWidget

    module = tmp_path / "widget.mjs"
    module.write_text(str(StatusWidget._esm))
    script = (f"import * as m from {json.dumps(module.as_uri())};"
              "console.log(JSON.stringify([typeof m.default.render, m.formatSize(NaN), m.formatSize(-1500),"
              " m.formatDuration(119.6), m.formatDuration(null)]))")
    out = subprocess.run(["node", "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == ["function", "?", "-1.5 KB", "2m 0s", "?"]


@pytest.mark.process
@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js")
def test_a_busy_kernel_reads_busy_and_protected_never_gone(tmp_path):
    """While the kernel says a cell runs, its unanswered refreshes are no silence: "busy, protected <age>"."""
    from spotwarp_jupyter.widget.status import StatusWidget

    module = tmp_path / "widget.mjs"
    module.write_text(str(StatusWidget._esm))
    status = {"protected": True, "protection": "protected", "last_snapshot": {"created": "2026-12-07T09:00:00Z"}}
    now = "Date.parse('2026-12-07T09:00:25Z')"
    script = (f"import * as m from {json.dumps(module.as_uri())}; const s = {json.dumps(status)}; const now = {now};"
              "console.log(JSON.stringify([m.headline(s, '', now - 2000, now), m.headline(s, '', null, now),"
              " m.headline(s, '', now - 11000, now), m.headline({...s, last_snapshot: null}, '', now, now),"
              " m.headline(s, m.silence(now - 12000, now), null, now), m.LAST_LABEL]))")
    out = subprocess.run(["node", "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    busy, idle, stale, resumed, gone, label = json.loads(out.stdout)
    assert busy == [True, "busy, protected 25 s ago"] and idle == [True, "protected"] and stale == idle
    assert resumed == [True, "busy, protected"]
    assert gone == [False, "not protected: no answer from the kernel for 12 s: its server may be gone"]
    assert label == "This notebook's last snapshot"  # the panel's other one is the project's newest


@pytest.mark.process
@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js")
def test_the_offer_says_what_restoring_brings(tmp_path):
    """The restore button names the notebook and variable count; the line under it size, training position, age."""
    from spotwarp_jupyter.widget.status import StatusWidget

    module = tmp_path / "widget.mjs"
    module.write_text(str(StatusWidget._esm))
    offer = {"id": "abc", "notebook": "train.ipynb", "variables": 3, "state_size": 2_500_000,
             "positions": {"train": 41}, "created": "2000-01-01T00:00:00Z", "host": "a"}
    script = (f"import * as m from {json.dumps(module.as_uri())}; const o = {json.dumps(offer)};"
              "console.log(JSON.stringify([m.offerWhat(o), m.offerDetails(o), m.offerWhat({...o, variables: 1}),"
              " m.silence(null, 1e6), m.silence(1000, 5000), m.silence(1000, 13000)]))")
    out = subprocess.run(["node", "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    what, details, one, never_asked, answered_soon, silent = json.loads(out.stdout)
    # a refresh unanswered for 10 s: the widget stops saying "protected" (the browser lost its server)
    assert never_asked == "" and answered_soon == ""
    assert silent == "no answer from the kernel for 12 s: its server may be gone"
    assert what == "3 variables of train.ipynb" and one == "1 variable of train.ipynb"
    assert details.startswith("2.5 MB · train at step 41 · saved ") and details.endswith("days ago · snapshot abc")


def test_panel_and_python_package_versions_match():
    """The panel refuses a server extension of another version, so the two must be released together."""
    from spotwarp_jupyter import __version__

    package = json.loads((Path(__file__).parents[2] / "labextension" / "package.json").read_text())
    assert package["version"] == __version__
    assert package["jupyterlab"]["outputDir"] == "../spotwarp_jupyter/labextension"
