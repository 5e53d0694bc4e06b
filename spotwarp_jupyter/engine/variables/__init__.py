"""Kernel variables: capture and serialize them, store only what changed, and load them back.

Choosing and grouping the variables (capture, grouping), writing a captured image as objects (save),
reading, checking and unpickling a kernel record (load), and the progressive restore that binds small
variables at once while large ones load behind them (progressive).

May import: pickling, incremental, storage and the engine's base modules.
"""

from .capture import CaptureOptions, KernelImage, capture_namespace, cheap_size, select_variables
from .load import LoadResult, load_record
from .progressive import BackgroundLoad, restore_progressive
from .save import carry_damaged, persist_image

__all__ = [
    "BackgroundLoad", "capture_namespace", "carry_damaged", "CaptureOptions", "cheap_size", "KernelImage", "load_record", "LoadResult",
    "persist_image", "restore_progressive", "select_variables",
]
