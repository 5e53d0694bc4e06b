"""Saved notebooks keep the status widget as text, not as a view of a model no reopened notebook has.

A widget's output holds a view of a model that lives in the kernel that drew it. Reopened later (a restored
notebook on a new host, a restarted kernel), JupyterLab finds no such model and shows "Error displaying
widget: model not found" where the widget was. A pre-save hook of the contents manager drops the SpotWarp
widget's view from what is saved (its text/plain, `protocol.WIDGET_TEXT`, stays: it says how to show it
again); the live view in the open notebook is untouched. Other widgets' outputs are left as they are.
"""

from __future__ import annotations

from typing import Any

from ..protocol import WIDGET_TEXT, WIDGET_VIEW_MIME


def drop_widget_views(model: dict[str, Any], **_: Any) -> None:
    """Pre-save hook: remove the SpotWarp status widget's view from every output of a notebook being saved."""
    content = model.get("content") if model.get("type") == "notebook" else None
    if not isinstance(content, dict):
        return
    for cell in content.get("cells") or []:
        for output in cell.get("outputs") or [] if isinstance(cell, dict) else []:
            data = output.get("data") if isinstance(output, dict) else None
            if isinstance(data, dict) and WIDGET_VIEW_MIME in data and _text(data.get("text/plain")) == WIDGET_TEXT:
                del data[WIDGET_VIEW_MIME]


def _text(value: Any) -> str | None:
    """A mime bundle's text: a string, or the list of lines nbformat also allows."""
    if isinstance(value, list):
        value = "".join(str(v) for v in value)
    return value.strip() if isinstance(value, str) else None
