"""Kernel variables: capture and serialize them, store only what changed, and load them back.

Saving is one pipeline, in this order: select the variables, take over the reuse plan's unchanged groups,
announce the bulk buffers to the writer, group, serialize each group lazily (capture), persist (save);
capture.py's docstring says what each stage does and where it runs.

Choosing and grouping the variables (capture, grouping), writing a captured image as objects (save),
reading, checking and unpickling a kernel record (load), and the progressive restore that binds small
variables at once while large ones load behind them (progressive).

May import: pickling, incremental, storage and the engine's base modules (records among them).
"""

from .capture import CaptureOptions, KernelImage, capture_namespace, cheap_size, select_variables
from .load import LoadResult, load_record
from .progressive import BackgroundLoad, restore_progressive
from .save import OnWritten, carry_damaged, persist_image

__all__ = [
    "BackgroundLoad", "capture_namespace", "carry_damaged", "CaptureOptions", "cheap_size", "KernelImage", "load_record", "LoadResult",
    "OnWritten", "persist_image", "restore_progressive", "select_variables",
]
