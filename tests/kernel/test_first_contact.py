"""First contact: `%load_ext spotwarp` protects the session at the end of its first cell, and shows the widget once."""

from __future__ import annotations

from engines import make_engine
from kernels import SESSION

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
NOTEBOOK = {"JPY_SESSION_NAME": "train.ipynb"}


def _widgets_shown(kernel, code: str) -> int:
    msgs: list[dict] = []
    reply = kernel.kc.execute_interactive(code, timeout=120, output_hook=msgs.append, allow_stdin=False)
    assert reply["content"]["status"] == "ok", reply["content"]
    return len([m for m in msgs if m["msg_type"] in ("display_data", "execute_result")
                and WIDGET_MIME in m["content"]["data"]])


def test_first_cell_is_snapshotted_at_once(start_kernel, store_url):
    k = start_kernel("host-a", **NOTEBOOK)
    k.run("weights = list(range(100))\n%load_ext spotwarp")
    k.run(SESSION + "assert s.wait_in_flight(120)")
    manifests = make_engine(store_url).manifests("train.ipynb")
    assert len(manifests) == 1, "the first cell did not leave a snapshot behind (the policy waited 5 minutes)"
    ns: dict = {}
    make_engine(store_url).restore_kernel(manifests[0].id, ns, "train.ipynb")
    assert ns["weights"] == list(range(100))
    assert k.value("s.status()['last_snapshot']['id']") == manifests[0].id
    # later cells wait for the policy's interval again
    k.run("more = 1")
    k.run("assert s.wait_in_flight(120)")
    assert len(make_engine(store_url).manifests("train.ipynb")) == 1


def test_first_cell_never_shadows_a_snapshot_not_yet_restored(start_kernel, store_url):
    a = start_kernel("host-a", **NOTEBOOK)
    a.run("%load_ext spotwarp\n%spotwarp off\nweights = [1, 2, 3]\n%spotwarp snapshot")
    a.kill()
    b = start_kernel("host-b", **NOTEBOOK)  # a new host: the widget offers A's snapshot
    b.run("%load_ext spotwarp")
    b.run(SESSION + "assert s.wait_in_flight(120)")
    manifests = make_engine(store_url).manifests("train.ipynb")
    assert len(manifests) == 1, "an empty new session became the notebook's newest snapshot"
    b.run("%spotwarp restore latest")
    assert b.value("weights") == [1, 2, 3]


def test_off_in_the_first_cell_takes_nothing(start_kernel, store_url):
    k = start_kernel("host-a", **NOTEBOOK)
    k.run("%load_ext spotwarp\n%spotwarp off\nx = 1")
    k.run(SESSION + "assert s.wait_in_flight(120)")
    assert make_engine(store_url).manifests() == []


def test_widget_is_drawn_once_when_asked_for_in_the_loading_cell(start_kernel):
    k = start_kernel("host-a", **NOTEBOOK)
    assert _widgets_shown(k, "%load_ext spotwarp\n%spotwarp widget") == 1
    assert _widgets_shown(k, "%spotwarp widget") == 1  # asked for again later: shown again


def test_the_widgets_text_is_what_a_saved_notebook_keeps(start_kernel):
    """The server keeps only the widget's text/plain in saved notebooks (server/saved_widgets.py): it must be ours."""
    from spotwarp_jupyter.protocol import WIDGET_TEXT

    k = start_kernel("host-a", **NOTEBOOK)
    msgs: list[dict] = []
    k.kc.execute_interactive("%load_ext spotwarp", timeout=120, output_hook=msgs.append, allow_stdin=False)
    (shown,) = [m for m in msgs if m["msg_type"] == "display_data" and WIDGET_MIME in m["content"]["data"]]
    assert shown["content"]["data"]["text/plain"] == WIDGET_TEXT
