"""Random number generator states: Python `random`, NumPy's global generator, torch CPU and CUDA.

Only libraries already imported are captured (nothing is imported just to read a state), and the
CUDA states only once CUDA is initialized: reading them earlier would start CUDA in the kernel.
"""

from __future__ import annotations

import random
import sys
from typing import Any


def capture_rng() -> dict[str, Any]:
    """The state of every global generator in this process, as a picklable dict."""
    state: dict[str, Any] = {"random": random.getstate()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()  # legacy tuple: keeps the cached Gaussian too
    torch = sys.modules.get("torch")
    if torch is not None:
        state["torch"] = torch.get_rng_state()
        if _cuda_ready(torch):
            state["cuda"] = [torch.cuda.get_rng_state(i) for i in range(torch.cuda.device_count())]
    return state


def restore_rng(state: dict[str, Any]) -> list[str]:
    """Put the generators back as captured; returns one line per state that could not be restored."""
    notes: list[str] = []
    if "random" in state:
        random.setstate(state["random"])
    if "numpy" in state:
        numpy = _import("numpy")
        if numpy is None:
            notes.append("NumPy's random state was saved but NumPy is not installed here")
        else:
            numpy.random.set_state(state["numpy"])
    if "torch" in state or "cuda" in state:
        torch = _import("torch")
        if torch is None:
            notes.append("torch random states were saved but torch is not installed here")
            return notes
        if "torch" in state:
            torch.set_rng_state(_cpu_byte_tensor(torch, state["torch"]))
        notes.extend(_restore_cuda(torch, state.get("cuda") or []))
    return notes


def _restore_cuda(torch: Any, states: list[Any]) -> list[str]:
    if not states:
        return []
    here = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for index, saved in enumerate(states[:here]):
        torch.cuda.set_rng_state(_cpu_byte_tensor(torch, saved), device=index)
    if here < len(states):
        missing = ", ".join(f"cuda:{i}" for i in range(here, len(states)))
        return [f"random states of {missing} were not restored: this host has {here} CUDA device(s)"]
    return []


def _cpu_byte_tensor(torch: Any, value: Any) -> Any:
    # a state saved on a GPU host may have been mapped anywhere; generators take CPU uint8 tensors
    return value.detach().to("cpu", torch.uint8) if isinstance(value, torch.Tensor) else torch.as_tensor(value, dtype=torch.uint8)


def _cuda_ready(torch: Any) -> bool:
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a broken driver must not break a snapshot
        return False


def _import(name: str) -> Any:
    module = sys.modules.get(name)
    if module is not None:
        return module
    try:
        return __import__(name)
    except ImportError:
        return None
