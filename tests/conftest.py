from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from kernels import Kernel  # noqa: E402

pytest_plugins = ["storage_servers"]  # gcs/s3 emulators and the `storage` fixture


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """A fresh local store, outside every kernel's folder (durable storage shared by two hosts)."""
    return str(tmp_path / "store")


@pytest.fixture
def kernel_env(store_url: str, tmp_path: Path) -> dict[str, str]:
    """Environment for a test kernel: its own HOME, the shared store, a project."""
    (tmp_path / "home").mkdir(exist_ok=True)
    return {
        "SPOTWARP_STORAGE": store_url,
        "SPOTWARP_PROJECT": "proj",
        "HOME": str(tmp_path / "home"),
        "PYTHONHASHSEED": "0",
    }


@pytest.fixture
def start_kernel(tmp_path: Path, kernel_env: dict[str, str]):
    """Start kernels in their own folders ("hosts"); all are shut down at the end."""
    started: list[Kernel] = []

    def start(host: str, **env: str) -> Kernel:
        kernel = Kernel(tmp_path / host, {**kernel_env, **env})
        started.append(kernel)
        return kernel

    yield start
    for k in started:
        try:
            k.close()
        except Exception:  # noqa: BLE001
            pass
