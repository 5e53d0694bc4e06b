"""Random generator states: captured and restored for `random`, NumPy's global generator, torch CPU
and CUDA (a snapshot from a GPU host restores on a CPU-only one, saying what it could not restore)."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

from spotwarp_jupyter.engine import pickling
from spotwarp_jupyter.training import capture_rng, restore_rng, state_providers


def _draws() -> list:
    return [random.random(), random.gauss(0, 1), float(np.random.rand()), float(np.random.standard_normal()),
            torch.rand(3).tolist(), torch.randn(2).tolist()]


def test_round_trip_of_every_global_generator():
    random.seed(3)
    np.random.seed(3)
    torch.manual_seed(3)
    np.random.standard_normal()  # leaves a cached Gaussian in NumPy's legacy state
    random.gauss(0, 1)  # and one in Python's
    state = capture_rng()
    expected = _draws()
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    assert _draws() != expected
    assert restore_rng(state) == []
    assert _draws() == expected


def test_state_survives_serialization_out_of_band():
    torch.manual_seed(5)
    np.random.seed(5)
    pickled = pickling.dumps({"rng": capture_rng()})
    assert pickled.buffers, "the torch state (a uint8 tensor) travels out of band"
    expected = _draws()
    torch.manual_seed(0)
    np.random.seed(0)
    state = pickling.loads(pickled.codec, pickled.data, [bytearray(b) for b in pickled.buffers])["rng"]
    restore_rng(state)
    assert _draws() == expected


@pytest.mark.process
def test_only_libraries_already_imported_are_captured():
    code = ("import json, sys; from spotwarp_jupyter.training.rng import capture_rng; "
            "s = capture_rng(); print(json.dumps([sorted(s), 'torch' in sys.modules, 'numpy' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    keys, torch_loaded, numpy_loaded = json.loads(out.strip().splitlines()[-1])
    assert "random" in keys
    assert ("torch" in keys) == torch_loaded
    assert ("numpy" in keys) == numpy_loaded


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only side of a GPU snapshot")
def test_cuda_states_from_a_gpu_host_are_reported_not_fatal():
    torch.manual_seed(8)
    state = capture_rng()
    expected = _draws()
    # what a host with two GPUs records: one CUDA generator state per device
    state["cuda"] = [torch.zeros(16, dtype=torch.uint8), torch.zeros(16, dtype=torch.uint8)]
    notes = restore_rng(state)
    assert notes == ["random states of cuda:0, cuda:1 were not restored: this host has 0 CUDA device(s)"]
    assert _draws() == expected  # everything else came back


def test_provider_warns_on_what_it_could_not_restore():
    capture, restore = state_providers()["rng"]
    state = capture()
    state["cuda"] = [torch.zeros(16, dtype=torch.uint8)] * (torch.cuda.device_count() + 1)
    with pytest.warns(RuntimeWarning, match="were not restored"):
        restore(state)


def test_cuda_state_not_read_before_cuda_is_initialised():
    # reading CUDA states would start CUDA in a kernel that never used the GPU
    state = capture_rng()
    assert ("cuda" in state) == (torch.cuda.is_available() and torch.cuda.is_initialized())


def test_kernel_restores_random_states_across_hosts(start_kernel):
    draws = "[random.random(), float(np.random.rand()), float(np.random.standard_normal())]"
    a = start_kernel("host-a")
    a.run("%load_ext spotwarp\nimport random, numpy as np\nrandom.seed(11); np.random.seed(11); np.random.rand(5)")
    a.run("%spotwarp snapshot")
    expected = a.value(draws)
    a.kill()
    b = start_kernel("host-b")
    b.run("import random, numpy as np\n%load_ext spotwarp\n%spotwarp restore latest")
    assert b.value(draws) == expected
