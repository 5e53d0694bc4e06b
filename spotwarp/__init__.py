"""`import spotwarp` / `%load_ext spotwarp`: a thin alias of `spotwarp_jupyter`."""

from spotwarp_jupyter import __version__, load_ipython_extension, unload_ipython_extension
from spotwarp_jupyter.api import restore, resumable, snapshot

__all__ = ["__version__", "load_ipython_extension", "restore", "resumable", "snapshot", "unload_ipython_extension"]
