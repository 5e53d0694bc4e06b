"""Fixtures the cross-host tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lab_server import LabServer


@pytest.fixture
def hosts() -> Iterator[list[LabServer]]:
    """The hosts a test starts (append each): every one is stopped, with its kernels, when the test ends."""
    started: list[LabServer] = []
    yield started
    for server in started:
        server.discard()
