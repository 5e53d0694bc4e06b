"""SpotWarp: keep an interactive deep-learning session alive across spot-instance preemptions."""

from ._version import __version__
from .kernel.extension import load_ipython_extension, unload_ipython_extension

__all__ = ["__version__", "load_ipython_extension", "unload_ipython_extension"]
