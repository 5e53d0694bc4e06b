"""The policy's interval holds between cells too: a cell that ends before its automatic snapshot is due leaves
state nothing stores, and an idle kernel reaches no safe point; once the interval has passed it takes it."""

from __future__ import annotations

import time

from engines import make_engine
from waiting import wait_for

WAIT = "assert __import__('spotwarp_jupyter.kernel.session', fromlist=['x']).current().wait_in_flight(120)"


def _manifests(store_url: str) -> list:
    return make_engine(store_url).manifests()



def test_state_a_cell_left_before_the_interval_is_saved_once_it_passes_while_the_kernel_idles(start_kernel, store_url):
    k = start_kernel("host-a", JPY_SESSION_NAME="train.ipynb")
    k.run("%load_ext spotwarp\n%spotwarp policy --every 4s\nweights = [1]")  # the first cell: protected at once
    k.run(WAIT)
    (first,) = _manifests(store_url)
    started = time.monotonic()
    k.run("weights = [1, 2]\nsteps = 200")  # ends long before the interval has passed: nothing is due yet
    assert time.monotonic() - started < 4 and len(_manifests(store_url)) == 1
    # the kernel idles: within the interval (and a margin for a loaded machine) the cell's state is stored
    newest = wait_for(lambda: next((m for m in _manifests(store_url) if m.id != first.id), None),
                      "automatic snapshot of the idle kernel", timeout=30, every=0.1)
    assert "steps" in newest.kernels["train.ipynb"]["variables"]
    assert newest.created - first.created >= 3.5  # when the interval had passed, not at the cell's end
