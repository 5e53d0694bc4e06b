"""The status widget shown by `%spotwarp widget` (anywidget: a hand-written ES module and CSS, no bundler)."""

from .status import StatusWidget

__all__ = ["StatusWidget"]
