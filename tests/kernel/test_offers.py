"""What the widget offers and when a session counts as protected, in real kernels: an empty session never
shadows real state, an offer only where restoring brings back state the kernel lacks (and says what), and a
restored kernel keeps its policy and is protected at once."""

from __future__ import annotations

from spotwarp_jupyter.engine.manifests import newest_kernel_records

from engines import make_engine
from kernels import SESSION

OFFER = SESSION + "from spotwarp_jupyter.widget.status import newer_snapshot, protection"
WAIT = "assert __import__('spotwarp_jupyter.kernel.session', fromlist=['x']).current().wait_in_flight(120)"


def test_an_empty_session_never_becomes_the_newest_snapshot(start_kernel, store_url):
    a = start_kernel("host-a", JPY_SESSION_NAME="train.ipynb")
    a.run("%load_ext spotwarp\n%spotwarp off\nweights = [1, 2, 3]\n%spotwarp snapshot")
    a.kill()
    b = start_kernel("host-b", JPY_SESSION_NAME="fresh.ipynb")  # a notebook with nothing saved of its own
    b.run("%load_ext spotwarp\nimport json")  # the tour's first cell: only imports
    b.run(WAIT)  # binds nothing: a test's own variable would be state to protect
    (only,) = make_engine(store_url).manifests()
    assert "train.ipynb" in only.kernels, "an empty session became the project's newest snapshot"
    # the first cell that holds something is protected at once
    b.run("x = 1")
    b.run(WAIT)
    newest = make_engine(store_url).manifests()[0]
    assert "fresh.ipynb" in newest.kernels and "x" in newest.kernels["fresh.ipynb"]["variables"]


def test_no_offer_for_the_kernels_own_state_copied_into_a_newer_project_snapshot(start_kernel, store_url, tmp_path):
    k = start_kernel("host-a", JPY_SESSION_NAME="train.ipynb")
    k.run("%load_ext spotwarp\n%spotwarp off\nweights = [1, 2, 3]\n%spotwarp snapshot")
    engine = make_engine(store_url)
    (tmp_path / "ws").mkdir()
    # the server's automatic backup: files plus each notebook's newest kernel record, in a newer manifest
    backup = engine.snapshot_project(str(tmp_path / "ws"), newest_kernel_records(engine.manifests()), "automatic backup")
    assert engine.manifests()[0].id == backup.id
    k.run(OFFER)
    assert k.value("newer_snapshot(s)") is None


def test_a_new_host_is_offered_the_state_with_what_it_brings(start_kernel, store_url):
    a = start_kernel("host-a", JPY_SESSION_NAME="train.ipynb")
    a.run("%load_ext spotwarp\n%spotwarp off\nimport spotwarp\nweights = list(range(1000))\nlr = 0.1\n"
          "for step in spotwarp.resumable(range(100), name='train'):\n"
          "    if step == 41:\n        %spotwarp snapshot\n        break")
    a.kill()
    b = start_kernel("host-b", JPY_SESSION_NAME="train.ipynb")
    b.run("%load_ext spotwarp")
    b.run(OFFER)
    offer = b.value("newer_snapshot(s)")
    assert offer is not None
    assert offer["notebook"] == "train.ipynb" and offer["variables"] == 3  # weights, lr, step
    assert offer["state_size"] > 1000 and offer["positions"] == {"train": 41} and 0 <= offer["age_s"] < 600
    b.run("%spotwarp restore latest")
    assert b.value("newer_snapshot(s)") is None  # restored: nothing more to bring back


def test_a_new_notebook_reusing_a_renamed_notebooks_old_name_is_offered_nothing(start_kernel, store_url):
    a = start_kernel("host-a", JPY_SESSION_NAME="Untitled.ipynb")
    a.run("%load_ext spotwarp\n%spotwarp off\nweights = [1, 2, 3]\n%spotwarp snapshot")
    a.run(SESSION + "s.rename('train.ipynb')\n%spotwarp snapshot")
    b = start_kernel("host-a2", JPY_SESSION_NAME="Untitled.ipynb")  # File > New: the name is free again
    b.run("%load_ext spotwarp")
    b.run(OFFER)
    assert b.value("newer_snapshot(s)") is None
    assert "No snapshots" in b.run("%spotwarp list")
    assert len(a.run("%spotwarp list").strip().splitlines()) == 4  # formerly ..., header, two snapshots


def test_a_restored_kernel_keeps_its_policy_and_is_protected_at_once(start_kernel, store_url):
    a = start_kernel("host-a", JPY_SESSION_NAME="train.ipynb")
    a.run("%load_ext spotwarp\n%spotwarp policy --every 45s --max-redo 90s --exclude junk --no-after-cell --no-resume\n"
          "weights = [1, 2, 3]\njunk = 1\n%spotwarp snapshot")
    a.kill()
    b = start_kernel("host-b", JPY_SESSION_NAME="train.ipynb")
    b.run("%load_ext spotwarp")
    b.run(OFFER)
    assert b.value("protection(s.status())[0]") is False
    b.run("%spotwarp restore latest")
    assert b.value("s.policy.as_dict()") == {"enabled": True, "every_s": 45.0, "after_cell": False, "include": None,
                                             "exclude": ["junk"], "max_var_size": 8 * 10**9, "keep": None,
                                             "resume": False, "max_redo_s": 90.0}
    assert b.value("protection(s.status())") == [
        True, f"protected: restored from {make_engine(store_url).manifests()[0].id}"]
    assert b.value("s.automatic.due([])") is False  # the restored state is stored: the next snapshot is an interval away


def test_a_fresh_kernel_says_a_newer_snapshot_of_its_notebook_exists_in_its_status(start_kernel, store_url):
    """Not resumed (a kept home opened without resume, --no-resume): `%spotwarp status` names the notebook's newer
    snapshot and how to bring it back; once restored, it says nothing of it."""
    a = start_kernel("host-a", JPY_SESSION_NAME="train.ipynb")
    a.run("%load_ext spotwarp\n%spotwarp off\nweights = list(range(100))\n%spotwarp snapshot")
    a.kill()
    (newest,) = make_engine(store_url).manifests()
    b = start_kernel("host-b", JPY_SESSION_NAME="train.ipynb")
    out = b.run("%load_ext spotwarp\n%spotwarp status")
    line = next((ln for ln in out.splitlines() if ln.strip().startswith("newer")), "")
    assert f"a newer snapshot of this notebook: {newest.id}, " in line and "%spotwarp restore latest" in line, out
    b.run("%spotwarp restore latest")
    assert "newer" not in b.run("%spotwarp status")
