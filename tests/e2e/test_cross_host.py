"""Kernel A snapshots and dies (SIGKILL); kernel B, a new process in another folder, gets everything back."""

from __future__ import annotations

NOTEBOOK_WORK = r'''
%load_ext spotwarp
import numpy as np
import collections
arr = np.arange(12, dtype=np.float32).reshape(3, 4)
alias = arr
nested = {"arr": arr, "items": [1, 2.5, "three", None], "counts": collections.Counter("spotwarp")}
k = 3
def scale(x):
    return x * k
square = lambda x: x * x
class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y
    def norm2(self):
        return scale(self.x) ** 2 + self.y ** 2
p = Point(1, 2)
points = [p, Point(3, 4)]
same_p = p
gen = (i for i in range(3))
import socket
sock = socket.socket()
%spotwarp snapshot -m "before the host dies"
'''

CHECKS = r'''
import numpy as np
print("@@", {
    "arr": arr.tolist(),
    "alias_is_arr": alias is arr,
    "nested_shares_arr": nested["arr"] is arr,
    "nested_items": nested["items"],
    "counter": dict(nested["counts"]),
    "scale": scale(2),
    "square": square(5),
    "norm2": p.norm2(),
    "p_is_point": isinstance(p, Point) and type(points[1]) is Point,
    "points_share_p": points[0] is p and same_p is p,
    "np_module": np.__name__,
    "gen_missing": "gen" not in dir(),
    "sock_missing": "sock" not in dir(),
})
'''


def _checks(kernel) -> dict:
    import ast

    out = kernel.run(CHECKS)
    line = [ln for ln in out.splitlines() if ln.startswith("@@")][-1]
    return ast.literal_eval(line[3:])


EXPECTED = {
    "arr": [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0], [8.0, 9.0, 10.0, 11.0]],
    "alias_is_arr": True,
    "nested_shares_arr": True,
    "nested_items": [1, 2.5, "three", None],
    "counter": {"s": 1, "p": 2, "o": 1, "t": 1, "w": 1, "a": 1, "r": 1},
    "scale": 6,
    "square": 25,
    "norm2": 13,
    "p_is_point": True,
    "points_share_p": True,
    "np_module": "numpy",
    "gen_missing": True,
    "sock_missing": True,
}


def test_kernel_state_moves_to_a_new_host(start_kernel):
    a = start_kernel("hostA")
    out = a.run(NOTEBOOK_WORK)
    assert "SpotWarp snapshot" in out
    assert "skipped gen, sock" in out
    status = a.run("%spotwarp status")
    assert "gen: generator" in status and "sock: " in status and "socket" in status
    on_a = _checks(a)  # the reference, on host A (where gen and sock still exist)
    assert {**on_a, "gen_missing": True, "sock_missing": True} == EXPECTED
    assert not on_a["gen_missing"] and not on_a["sock_missing"]
    a.kill()

    b = start_kernel("hostB")
    out = b.run("%load_ext spotwarp\n%spotwarp restore latest")
    assert "restored" in out and "gen (" in out
    assert _checks(b) == EXPECTED
    # B continues to the same result: a class defined on A still works with functions defined on A
    assert b.value("[q.norm2() for q in points]") == [13, 97]


def test_restore_only_some_variables(start_kernel):
    a = start_kernel("hostA")
    a.run("%load_ext spotwarp\nx = [1, 2]\ny = {'x': x}\nz = 'zed'\nclass C: pass\nc = C()\n%spotwarp snapshot")
    a.kill()
    b = start_kernel("hostB")
    b.run("%load_ext spotwarp\n%spotwarp restore latest --vars c,z")
    assert b.value("[type(c).__name__, z, 'x' in dir(), 'y' in dir()]") == ["C", "zed", False, False]


def test_python_api_round_trip(start_kernel):
    a = start_kernel("hostA")
    snap_id = a.value("__import__('spotwarp').snapshot('api') .id if (v := 41) else None")
    a.kill()
    b = start_kernel("hostB")
    b.run(f"import spotwarp\nspotwarp.restore({snap_id!r})")
    assert b.value("v + 1") == 42
