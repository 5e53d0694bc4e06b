"""IPython's banner tip drawn from a generator of its own, so no `kernel_info` moves the notebook's `random`.

IPython (9.x) picks the banner's tip with the global `random.choice` each time the banner is built, which an
ipykernel does for every `kernel_info_request`: each browser tab that connects, each client a server opens.
A notebook that seeds `random` and draws from it (a loss, an augmentation) then gets other numbers than an
undisturbed run, and a resumed run does not continue the run it came from. While SpotWarp is loaded the shell's
banner takes its tip from a private `random.Random`; `%unload_ext spotwarp` puts IPython's own back
(docs/upstream/ipython-banner-tip-random.md is the report for IPython itself).
"""

from __future__ import annotations

import random
from datetime import datetime
from typing import Any, Callable

_OWN = random.Random()
_original: dict[str, Callable[[], str]] = {}


def pick_tip() -> str:
    """IPython's `pick_tip`, drawing from SpotWarp's own generator: the same tips, the global stream untouched."""
    from IPython.core import tips

    every_year: Any = getattr(tips, "_tips", {}).get("every_year", {})
    now = datetime.now()
    if (now.month, now.day) in every_year:
        return every_year[(now.month, now.day)]
    pool = getattr(tips, "_tips", {}).get("random")
    return _OWN.choice(pool) if pool else ""


def install() -> bool:
    """Make the banner use `pick_tip`; False where IPython builds its banner some other way (left as it is)."""
    try:
        from IPython.core import interactiveshell, tips
    except ImportError:
        return False
    if not callable(getattr(interactiveshell, "pick_tip", None)) or not isinstance(getattr(tips, "_tips", None), dict):
        return False
    if "pick_tip" not in _original:
        _original["pick_tip"] = interactiveshell.pick_tip
    interactiveshell.pick_tip = pick_tip
    return True


def uninstall() -> None:
    """Put IPython's own `pick_tip` back."""
    original = _original.pop("pick_tip", None)
    if original is None:
        return
    from IPython.core import interactiveshell

    interactiveshell.pick_tip = original
