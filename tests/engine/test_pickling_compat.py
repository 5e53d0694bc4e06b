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
