"""JupyterLab pages as the browser tests drive them (Playwright)."""

from __future__ import annotations

from playwright.sync_api import expect


def open_notebook_and_wait_for_kernel(page, path: str) -> None:
    """Open `path` as a user does and wait until its kernel shows idle in the toolbar."""
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.commands.hasCommand('docmanager:open')")
    page.evaluate(f"window.jupyterapp.commands.execute('docmanager:open', {{path: '{path}'}})")
    expect(page.locator(".jp-NotebookPanel .jp-Notebook")).to_be_visible()
    # the toolbar's kernel indicator, as a user sees it
    expect(page.locator(".jp-NotebookPanel .jp-Notebook-ExecutionIndicator[data-status='idle']")).to_have_count(
        1, timeout=120_000)
    page.locator(".jp-NotebookPanel .jp-Cell").first.click()
