"""A restored large array or tensor owns memory that stays alive with it: no view into a buffer the restore freed.

A restore reads large buffers straight into memory that becomes the array's or tensor's own. If that
memory were a temporary given back after the restore (unmapped, or reused by the allocator), the values
would change or the process would crash once other work reuses it; both are checked after churning memory.
"""

from __future__ import annotations

import ctypes
import gc
import mmap
from pathlib import Path

import numpy as np
import torch

from engines import UNSIGNED, make_engine


def _mapped(address: int) -> bool:
    """Whether `address` lies in a mapping of this process (/proc/self/maps)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        low, high = (int(x, 16) for x in line.split()[0].split("-"))
        if low <= address < high:
            return True
    return False


def _churn() -> None:
    """Map, fill and unmap a lot of memory, and let Python's allocator reuse what was freed."""
    for _ in range(4):
        m = mmap.mmap(-1, 64 << 20)
        m.write(b"\xa5" * (64 << 20))
        m.close()
    junk = [bytearray(b"\x5a" * (1 << 20)) for _ in range(64)]
    del junk
    gc.collect()


def test_restored_large_buffers_stay_alive_with_their_objects(tmp_path):
    rng = np.random.default_rng(3)
    array = rng.random((3_000_000,))  # 24 MB: read into a buffer of its own
    tensor = torch.from_numpy(rng.random((2_000, 1_500)).astype(np.float32))
    engine = make_engine(tmp_path / "store", key=UNSIGNED, resolved=False)
    engine.snapshot_kernel({"array": array, "tensor": tensor})

    ns: dict = {}
    make_engine(tmp_path / "store", key=UNSIGNED, resolved=False).restore_kernel("latest", ns)
    restored_array, restored_tensor = ns.pop("array"), ns.pop("tensor")
    ns.clear()
    gc.collect()
    _churn()

    assert np.array_equal(restored_array, array) and torch.equal(restored_tensor, tensor)
    array_ptr = restored_array.__array_interface__["data"][0]
    tensor_ptr = restored_tensor.untyped_storage().data_ptr()
    assert _mapped(array_ptr) and _mapped(tensor_ptr)
    # the memory is the objects' own: writing through them changes them and nothing else of the restore
    restored_array[:] = 1.0
    restored_tensor.fill_(2.0)
    assert float(restored_array.sum()) == array.size and float(restored_tensor.sum()) == 2.0 * tensor.numel()
    assert not np.shares_memory(restored_array, restored_tensor.numpy())
    ctypes.memmove(ctypes.c_void_p(array_ptr), ctypes.c_void_p(tensor_ptr), 8)  # both still writable, still mapped
