"""Snapshots re-pickle only the variable groups that code run since the last one could have touched.

Each test runs real cells in a real kernel; values are checked by restoring the newest snapshot in this
process, so a group wrongly reused (its old record named again) shows up as an old value.
"""

from __future__ import annotations

import numpy as np

from engines import engine_settings, make_engine

SETUP = "%load_ext spotwarp\n%spotwarp off\nfrom spotwarp_jupyter.kernel.session import current as _cur\n"


def _snapshot(k) -> dict:
    k.run("%spotwarp snapshot")
    return k.value("_cur().last.stats")


def _latest(store_url: str) -> dict:
    ns: dict = {}
    make_engine(store_url, resolved=False).restore_kernel("latest", ns)
    return ns


def test_unchanged_state_reuses_every_group_and_writes_nothing(start_kernel, store_url):
    k = start_kernel("host")
    k.run(SETUP)
    k.run("import numpy as np\nbig = np.arange(2_000_000, dtype=np.float32)\n"
          "records = {f'k{i}': [i, str(i)] for i in range(20_000)}\n"
          "class Box:\n    def __init__(self, v):\n        self.v = v\n"
          "box = Box(3)\ndef double(v):\n    return 2 * v\n")
    first = _snapshot(k)
    assert first["groups_reused"] == 0 and "full_reason" in first
    again = _snapshot(k)
    assert again["groups_written"] == 0, again
    assert again["groups_reused"] == first["groups_written"], again
    assert again["bytes_written"] == 0, again
    assert "full_reason" not in again


def test_mutation_inside_notebook_functions_and_methods_is_captured(start_kernel, store_url):
    k = start_kernel("host")
    k.run(SETUP)
    k.run("import numpy as np\nlst = [1]\nweight = np.zeros(4)\nhist = []\n")
    k.run("def grow():\n    lst.append(len(lst) + 1)\n"
          "def bump():\n    weight[:] += 1\n"
          "class Trainer:\n    def step(self):\n        hist.append('stepped')\n"
          "trainer = Trainer()\n")
    _snapshot(k)
    k.run("grow()\nbump()\ntrainer.step()")  # the cell names none of the variables it changes
    stats = _snapshot(k)
    assert stats["groups_reused"] >= 1, stats  # the functions and the class were not re-pickled
    ns = _latest(store_url)
    assert ns["lst"] == [1, 2]
    assert ns["weight"].tolist() == [1.0] * 4
    assert ns["hist"] == ["stepped"]


def test_names_used_where_a_def_is_evaluated_are_captured(start_kernel, store_url):
    k = start_kernel("host")
    k.run(SETUP)
    k.run("log = []\nmarks = []\n")
    _snapshot(k)
    k.run("def g(x=log.append('default')):\n    return x\n"
          "@marks.append\ndef h():\n    pass\n")  # the default and the decorator run now, in no function
    _snapshot(k)
    ns = _latest(store_url)
    assert ns["log"] == ["default"] and len(ns["marks"]) == 1


def test_mutation_through_an_alias_under_another_name_is_captured(start_kernel, store_url):
    k = start_kernel("host")
    k.run(SETUP)
    k.run("d = {'inner': [1]}\nother = [0]\n")
    k.run("e = d['inner']")
    _snapshot(k)
    k.run("e.append(5)")  # changes d without naming it
    stats = _snapshot(k)
    assert stats["groups_reused"] == 1, stats  # `other` only
    ns = _latest(store_url)
    assert ns["d"] == {"inner": [1, 5]}
    assert ns["e"] is ns["d"]["inner"]


def test_del_and_rebinding_are_captured(start_kernel, store_url):
    k = start_kernel("host")
    k.run(SETUP)
    k.run("x = [1]\ny = [2]\nz = [3]\n")
    _snapshot(k)
    k.run("del x\ny = [20]")
    stats = _snapshot(k)
    assert stats["groups_reused"] == 1, stats  # z
    ns = _latest(store_url)
    assert "x" not in ns and ns["y"] == [20] and ns["z"] == [3]


def test_dynamic_access_makes_a_full_snapshot(start_kernel, store_url):
    k = start_kernel("host")
    k.run(SETUP)
    k.run("lst = [1]\nother = [0]\n")
    _snapshot(k)
    k.run("globals()['lst'].append(2)")
    stats = _snapshot(k)
    assert stats["groups_reused"] == 0 and "globals" in stats["full_reason"], stats
    assert _latest(store_url)["lst"] == [1, 2]
    k.run("exec('lst.append(3)')")
    assert "exec" in _snapshot(k)["full_reason"]
    assert _latest(store_url)["lst"] == [1, 2, 3]
    k.run("lst")  # the cell's value becomes `_`
    k.run("_.append(4)")
    assert "full_reason" in _snapshot(k)
    assert _latest(store_url)["lst"] == [1, 2, 3, 4]


def test_a_notebook_function_using_globals_makes_every_snapshot_full(start_kernel, store_url):
    k = start_kernel("host")
    k.run(SETUP)
    k.run("lst = [1]\ndef sneaky():\n    globals()['lst'].append(len(globals()['lst']) + 1)\n")
    _snapshot(k)
    k.run("sneaky()")
    assert "globals" in _snapshot(k)["full_reason"]
    assert _latest(store_url)["lst"] == [1, 2]


def test_a_cell_still_running_at_a_snapshot_is_counted_again_at_the_next(start_kernel, store_url):
    k = start_kernel("host")
    k.run(SETUP)
    k.run("lst = []\nother = [0]\n")
    _snapshot(k)
    k.run("lst.append(1)\n%spotwarp snapshot\nlst.append(2)")  # changes lst after the snapshot began
    stats = _snapshot(k)
    assert stats["groups_reused"] == 1, stats  # `other` only
    assert _latest(store_url)["lst"] == [1, 2]


def test_snapshot_full_serializes_everything_again(start_kernel, store_url):
    k = start_kernel("host")
    k.run(SETUP)
    k.run("lst = [1]\n")
    _snapshot(k)
    k.run("%spotwarp snapshot --full")
    stats = k.value("_cur().last.stats")
    assert stats["groups_reused"] == 0 and stats["full_reason"] == "a full snapshot was asked for", stats
    ename, evalue, _ = k.run_error("%spotwarp snapshot --fully")
    assert ename == "UsageError", (ename, evalue)


def test_every_nth_snapshot_is_a_full_pass(start_kernel, store_url):
    k = start_kernel("host", SPOTWARP_FULL_EVERY="2")
    k.run(SETUP)
    k.run("lst = [1]\n")
    assert "full_reason" in _snapshot(k)  # no earlier one
    assert "full_reason" not in _snapshot(k)
    assert "SPOTWARP_FULL_EVERY" in _snapshot(k)["full_reason"]


def test_restore_makes_the_next_snapshot_full(start_kernel, store_url):
    k = start_kernel("host")
    k.run(SETUP)
    k.run("lst = [1]\n")
    _snapshot(k)
    _snapshot(k)
    k.run("%spotwarp restore")
    assert "full_reason" in _snapshot(k)
    assert np.array_equal(_latest(store_url)["lst"], [1])


def test_a_background_snapshot_with_only_small_values_to_save_forks_no_writer(start_kernel, store_url):
    k = start_kernel("host")
    k.run(SETUP)
    k.run("import numpy as np\nbig = np.ones(1_000_000)\ncounter = 0\n")
    _snapshot(k)
    k.run("counter = 7")
    out = k.run("job = _cur().snapshot_in_background()\n_cur().wait_in_flight(60)\n"
                "print(job.pid, _cur().last_error, _cur().last.stats['groups_reused'])")
    assert out.split() == ["None", "None", "1"], out  # a writer thread, no error, `big` reused
    assert _latest(store_url)["counter"] == 7
    k.run("big[0] = 5.0")
    out = k.run("job = _cur().snapshot_in_background()\n_cur().wait_in_flight(60)\nprint(job.pid is None, _cur().last_error)")
    assert out.split() == ["False", "None"], out  # an array to serialize: a forked writer
    assert _latest(store_url)["big"][0] == 5.0


def test_a_notice_mid_training_stops_the_snapshot_in_flight_and_takes_its_own_at_once(start_kernel, store_url):
    k = start_kernel("host")
    k.run(SETUP)
    k.run("import numpy as np, os, signal, time\nfrom spotwarp_jupyter import safepoints\n"
          "from spotwarp_jupyter.kernel import notices\nw = np.zeros(1_000_000)\n")
    out = k.run("old = _cur().snapshot_in_background()\n"
                "os.kill(old.pid, signal.SIGSTOP)  # a writer that would take long\n"
                "notices._hold_at_safe_point(_cur().automatic, 'preemption test', time.time() + 30)\n"
                "safepoints.request('preemption test')\n"
                "w += 1\n"
                "safepoints.reached('step')  # the training loop's next step\n"
                "print(old.result.exit_status, _cur().last.message, _cur().last_error)")
    assert out.split()[0] == "-9", out  # the stale writer was stopped, not waited for
    assert "preemption test" in out and out.split()[-1] == "None", out
    assert _latest(store_url)["w"][0] == 1.0


def test_no_reuse_when_another_kernel_committed_the_notebooks_newest_snapshot(store_url, tmp_path):
    from spotwarp_jupyter.kernel.policy import Policy
    from spotwarp_jupyter.kernel.session import KernelSession

    def session(ns: dict) -> KernelSession:
        s = KernelSession(ns, {}, engine_settings(store_url, resolved=False), Policy(enabled=False), notebook="nb")
        s.access.hooked = s.access.attached = True  # as after a cell through the kernel's hook
        return s

    mine = session({"lst": [1], "other": [2]})
    first = mine.snapshot()
    # the server's periodic project snapshot names the same record: still this kernel's newest state
    (tmp_path / "ws").mkdir()
    mine.engine.snapshot_project(str(tmp_path / "ws"), kernels={"nb": first.kernels["nb"]})
    assert mine.snapshot().stats["groups_reused"] == 2
    session({"lst": ["theirs"]}).snapshot()  # the same notebook's kernel on another host
    stats = mine.snapshot().stats
    assert stats["groups_reused"] == 0, stats
    ns = _latest(store_url)
    assert ns["lst"] == [1] and ns["other"] == [2]


def test_a_bad_full_every_setting_is_one_warning_and_the_default(start_kernel):
    k = start_kernel("host", SPOTWARP_FULL_EVERY="often")
    out = k.run("%load_ext spotwarp\nprint(__import__('spotwarp_jupyter').kernel.session.current().full_every)")
    assert "SPOTWARP_FULL_EVERY='often' is not a whole number" in out and out.split()[-1] == "20", out
    assert "Traceback" not in out


def test_the_cell_loading_spotwarp_is_not_tracked_so_what_it_does_after_a_snapshot_is_captured(start_kernel, store_url):
    k = start_kernel("host")
    k.run("%load_ext spotwarp\n%spotwarp off\nx = [1]\nother = [0]\n%spotwarp snapshot\nx.append(2)")
    k.run("%spotwarp snapshot")
    assert _latest(store_url)["x"] == [1, 2]


def test_functions_defined_in_the_cell_loading_spotwarp_count_at_every_snapshot(start_kernel, store_url):
    k = start_kernel("host")
    # no hook saw this cell: its functions' globals come from their code, found in the namespace
    k.run(SETUP + "import numpy as np\nx = np.zeros(10)\nkept = np.ones(10)\n"
          "def fill():\n    x[:] = 5\n"
          "class Filler:\n    def run(self):\n        kept[:] = 7\n"
          "filler = Filler()\ndef evaluate(model):\n    return model.eval()\n")
    _snapshot(k)
    k.run("fill()\nfiller.run()")  # the cell names neither array
    stats = _snapshot(k)
    assert "full_reason" not in stats, stats  # `model.eval()` is a method, not the builtin
    ns = _latest(store_url)
    assert ns["x"].tolist() == [5.0] * 10, "a stale group was reused"
    assert ns["kept"].tolist() == [7.0] * 10, "a stale group was reused"
    assert stats["groups_reused"] >= 1, stats  # the functions and the class themselves were not re-pickled


def test_a_function_of_the_loading_cell_using_globals_makes_snapshots_full(start_kernel, store_url):
    k = start_kernel("host")
    k.run(SETUP + "x = [1]\ndef sneaky():\n    globals()['x'].append(2)\n")
    _snapshot(k)
    k.run("sneaky()")
    stats = _snapshot(k)
    assert "globals" in stats.get("full_reason", ""), stats
    assert _latest(store_url)["x"] == [1, 2]
