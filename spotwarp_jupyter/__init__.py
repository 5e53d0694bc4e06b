"""SpotWarp: keep an interactive deep-learning session alive across spot-instance preemptions.

Importing the package (or its engine) loads no Jupyter or IPython module: the kernel extension is
imported when IPython loads it.
"""

from __future__ import annotations

from typing import Any

from ._version import __version__

__all__ = ["__version__", "load_ipython_extension", "unload_ipython_extension"]


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext spotwarp_jupyter`: register `%spotwarp` and start this kernel's session."""
    from .kernel.extension import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """`%unload_ext spotwarp_jupyter`."""
    from .kernel.extension import unload_ipython_extension as unload

    unload(ipython)
