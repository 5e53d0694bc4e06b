"""A kernel killed (SIGKILL) in the middle of a progressive restore leaves nothing behind.

Host B reads the store through `gated://` (tests/support/gated_fs.py), which holds back every object of
at least 40 MiB until a gate that is never opened: the 30 MB array arrives and is bound, the 200 MB one
is caught half read (its small last chunk in, its 64 MiB chunks held). Host B is killed there. The store
is then exactly as it was, host B's folder holds nothing new, and a fresh kernel restores every variable
equal to what was saved.
"""

from __future__ import annotations

import os
from pathlib import Path

import blake3

from waiting import wait_for

SUPPORT = str(Path(__file__).resolve().parents[1] / "support")  # gated_fs, for the kernels
EARLY = 30_000_000 // 8  # float64s of the array that arrives (over the 4 MiB bound at once, under the gate)
LATE = 200_000_000 // 8  # float64s of the array caught half read
STATE = f'''
%load_ext spotwarp
import numpy as np
n = 5
words = ["a", "b"]
early = np.arange({EARLY}, dtype=np.float64)
late = np.arange({LATE}, dtype=np.float64) * 3
%spotwarp snapshot -m both
'''
CHECK = f"[n, words, bool(np.array_equal(early, np.arange({EARLY}, dtype=np.float64))), " \
        f"bool(np.array_equal(late, np.arange({LATE}, dtype=np.float64) * 3))]"


def _tree(root: Path) -> dict[str, tuple[int, str]]:
    """Every file under `root`: its size and blake3 digest."""
    out = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        out[str(path.relative_to(root))] = (path.stat().st_size, blake3.blake3(path.read_bytes()).hexdigest())
    return out


def _loading_line(kernel) -> str:
    """The line of `%spotwarp status` that names the variables still loading ('' once none are)."""
    return next((ln.strip() for ln in kernel.run("%spotwarp status").splitlines() if "still loading" in ln), "")


def test_a_kernel_killed_mid_restore_leaves_the_store_and_its_folder_as_they_were(start_kernel, tmp_path,
                                                                                  store_url):
    a = start_kernel("host-a")
    a.run(STATE)
    a.close()
    store_before = _tree(Path(store_url))
    fifo = str(tmp_path / "gate")
    os.mkfifo(fifo)  # never opened: the large objects stay held back until the kill
    b = start_kernel("host-b", SPOTWARP_STORAGE="gated://" + store_url, GATED_FS_FIFO=fifo,
                     GATED_FS_MIN=str(40 << 20), PYTHONPATH=os.pathsep.join([SUPPORT, os.environ.get("PYTHONPATH", "")]))
    b.run("import gated_fs, numpy as np")
    folder_before = _tree(b.cwd)
    out = b.run("%load_ext spotwarp\n%spotwarp restore latest", timeout=60)
    assert "in the background" in out, out
    assert b.value("[n, words]") == [5, ["a", "b"]]
    # the 30 MB array is read, checked and bound between cells; the 200 MB one stays held at the gate
    loading = wait_for(lambda: _loading_line(b) if "early" not in _loading_line(b) else None,
                       "the 30 MB array bound", timeout=120)
    assert loading.endswith("still loading late"), loading
    assert b.value("float(early[-1])") == EARLY - 1
    b.kill()

    assert _tree(Path(store_url)) == store_before, "a killed restore changed the store"
    assert _tree(b.cwd) == folder_before, "a killed restore left something in the kernel's folder"
    c = start_kernel("host-c")
    c.run("%load_ext spotwarp\n%spotwarp restore latest\nimport numpy as np", timeout=120)
    assert c.value(CHECK) == [5, ["a", "b"], True, True]
