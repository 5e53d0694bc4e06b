"""Streams written by older snapshots name rebuilders as `spotwarp_jupyter.engine.pickling.<name>`: they still load.

tests/golden/pickled_group_v1.pickle was written by the single-module engine/pickling.py (before it was split):
a torch Parameter with its gradient, a string array, a GradScaler (state_dict route), a DataLoader, a lambda
and a function saved by value, a notebook function saved by name.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch

from spotwarp_jupyter.engine import pickling

GOLDEN = Path(__file__).parents[1] / "golden" / "pickled_group_v1.pickle"
OLD_NAMES = ["_main_attr", "_rebuild_tensor", "_rebuild_str_array", "_set_state_and_load", "_new_instance", "_load_dill"]


def test_a_stream_from_before_the_split_still_loads():
    blob = pickle.loads(GOLDEN.read_bytes())
    for name in OLD_NAMES:  # what the stream refers to, by module and name
        assert name.encode() in blob["data"]
        assert callable(getattr(pickling, name))

    def by_name(v):
        return v * 3

    with pickling.main_namespace({"by_name": by_name}):
        group = pickling.loads(blob["codec"], blob["data"], [bytearray(b) for b in blob["buffers"]])
    param = group["param"]
    assert isinstance(param, torch.nn.Parameter) and param.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert param.grad.tolist() == [[1.0] * 3] * 2
    assert isinstance(group["labels"], np.ndarray) and group["labels"][1999] == "row-1999"
    assert group["scaler"].get_scale() == 512.0
    assert [b.tolist() for b in group["loader"]][0] == [0, 1, 2]
    assert group["inc"](1) == 3 and group["top_level"](1) == 2
    assert group["by_name"] is by_name


def test_the_old_module_still_names_every_rebuilder():
    for name in ["_create_type", "_new_class", "_rebuild_tensor", "_rebuild_str_array", "_set_state_and_load",
                 "_new_instance", "_load_dill", "_main_attr", "_default_setstate", "_reduce_tensor",
                 "Pickled", "dumps", "loads", "main_namespace", "device_notes", "restore_device", "PROTOCOL"]:
        assert hasattr(pickling, name), name


GOLDEN_V2 = Path(__file__).parents[1] / "golden" / "pickled_group_v2.pickle"


def test_a_stream_of_the_storage_format_still_loads():
    """tests/golden/pickled_group_v2.pickle (make_pickled_group_v2.py): the v2 group format, kept loadable."""
    blob = pickle.loads(GOLDEN_V2.read_bytes())
    for name in ["_rebuild_strided", "_rebuild_storage", "_rebuild_view", "_rebuild_optimizer", "_recreate_lock"]:
        assert name.encode() in blob["data"] and callable(getattr(pickling, name))
    group = pickling.loads(blob["codec"], blob["data"], [bytearray(b) for b in blob["buffers"]])
    base, row, tr = group["base"], group["row"], group["tr"]
    assert sum(len(b) for b in blob["buffers"]) < 2_000  # every storage once
    row[0] = 100.0
    assert base[1, 0] == 100.0 and tr[0, 1] == 100.0 and row.storage_offset() == 6 and tr.stride() == (1, 6)
    conv, opt = group["conv"], group["opt"]
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    # a forward pass's last bits depend on the CPU's kernels (the blob was written on another machine):
    # the restored weights are what must be exact, and they are when the output agrees this closely
    torch.testing.assert_close(conv(torch.ones(1, 2, 5, 5)).detach().flatten(), torch.tensor(blob["conv_out"]),
                               rtol=1e-5, atol=1e-6)
    assert opt.param_groups[0]["params"][0] is conv.weight and float(opt.state[conv.weight]["step"]) == 1.0
    opt.zero_grad()
    conv(torch.ones(1, 2, 5, 5)).sum().backward()
    opt.step()
    assert float(opt.state[conv.weight]["step"]) == 2.0
    assert group["flagged"].no_decay is True and isinstance(group["flagged"], torch.nn.Parameter)
    group["arr_view"][0, 0] = -1
    assert group["arr"][1, 0] == -1 and group["held"].locked()
    assert not group["sparse"].is_coalesced() and group["sparse"].to_dense().tolist() == [3.0, 0.0, 5.0]
