"""Warm standbys are never left running: a race whose provider fails after taking them, a watch that ends."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Sequence

import pytest

from spotwarp_jupyter.failover.provider import GONE, LaunchSpec, Offer
from spotwarp_jupyter.failover.providers.local import LocalProvider
from spotwarp_jupyter.failover.race import race
from spotwarp_jupyter.failover.standby import WarmStandby

from engines import make_engine
from waiting import wait_for


class OffersFailLater(LocalProvider):
    """The local provider whose offers fail once `broken` is set (a cloud's API going down mid-failover)."""

    broken = False

    def offers(self, spec: LaunchSpec, count: int) -> Sequence[Offer]:
        if self.broken:
            raise RuntimeError("the provider's API is down")
        return super().offers(spec, count)


def standby_of(tmp_path: Path, provider: LocalProvider) -> tuple[WarmStandby, Any]:
    store = make_engine(tmp_path / "store", "leaks").store
    spec = LaunchSpec("leaks", str(tmp_path / "store"))
    return WarmStandby(provider, spec, store, 1, lambda kind, data: None, None, threading.Event(), poll_s=0.05), spec


@pytest.mark.process
def test_standbys_taken_by_a_race_whose_offers_fail_are_torn_down(tmp_path: Path) -> None:
    # each candidate sleeps before it starts: it stays pending (usable) and never serves
    provider = OffersFailLater({"root": str(tmp_path / "hosts"), "delays": "60", "grace": "2"})
    standby, spec = standby_of(tmp_path, provider)
    standby.start()
    try:
        wait_for(lambda: standby.candidates, "the standby launched", timeout=30)
        handles = [c.handle for c in standby.candidates]
        provider.broken = True
        with pytest.raises(RuntimeError, match="API is down"):
            race(provider, spec, standby.store, 2, warm=standby.take)
        assert [provider.poll(h).state for h in handles] == [GONE]
        assert provider.leaks() == []
    finally:
        standby.drop()


def test_dropping_standbys_tears_down_every_one_launched(tmp_path: Path) -> None:
    provider = LocalProvider({"root": str(tmp_path / "hosts"), "delays": "60", "grace": "2"})
    standby, _ = standby_of(tmp_path, provider)
    standby.start()
    standby.drop()  # at once: whatever the standby's thread launched meanwhile goes down before drop returns
    assert standby.thread is not None and not standby.thread.is_alive()
    assert all(h.data["down"] for h in provider._handles) and provider.leaks() == []
