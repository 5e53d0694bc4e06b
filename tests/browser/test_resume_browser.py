"""In a real browser, on a host that resumed the session by itself (docs/resume.md), with jupyter-collaboration
turned off (`--YDocExtension.disable_rtc=True`): a notebook opened while its resumed cell runs attaches to that
kernel, shows the outputs written to the file so far and the kernel busy, and interrupting it works as usual.
The real-time path a default install gets is tests/browser/test_resume_live_browser.py."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from new_hosts import cell_outputs, lose_host_in_its_loop, resume_entry, wait_for

pytestmark = pytest.mark.slow

SETUP = "%load_ext spotwarp\n%spotwarp policy --every 0.2s --no-after-cell\nimport spotwarp, time\nseen = []"
LOOP = ("for i in spotwarp.resumable(range(100000), name='slow'):\n"
        "    seen.append(i)\n    print(f'step {i}', flush=True)\n    time.sleep(0.3)\n")


def test_opening_the_notebook_while_its_resumed_cell_runs(start_lab, page, tmp_path):
    lose_host_in_its_loop(start_lab, tmp_path, SETUP, LOOP)

    b = start_lab("host-b", tmp_path / "host-b" / "workspace", jupyter_args=("--YDocExtension.disable_rtc=True",))
    on_disk = b.workspace / "train.ipynb"
    # the file holds the cell's outputs up to the snapshot from the restore on; the resumed run's follow them
    wait_for(lambda: resume_entry(b).get("state") == "running" and "step " in cell_outputs(on_disk, "loop"), 120,
             "the resumed cell running, its outputs in the file", b)

    page.goto(f"{b.url}lab?token=spotwarp-test-token")
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.commands.hasCommand('docmanager:open')")
    page.evaluate("window.jupyterapp.commands.execute('docmanager:open', {path: 'train.ipynb'})")
    expect(page.locator(".jp-NotebookPanel .jp-Notebook")).to_be_visible()
    # the tab attached to the resumed kernel and shows the cell's outputs written so far
    expect(page.locator(".jp-NotebookPanel .jp-Cell").nth(1).locator(".jp-OutputArea")).to_contain_text("step ")
    indicator = page.locator(".jp-NotebookPanel .jp-Notebook-ExecutionIndicator")
    expect(indicator).to_have_count(1)
    expect(indicator).to_have_attribute("data-status", "busy")
    assert "outputs of cell loop go into the notebook file" in b.log()  # not the shared document
    sessions = b.request("GET", "api/sessions")[1]
    assert len(sessions) == 1 and b.request("GET", "api/kernels")[1][0]["id"] == sessions[0]["kernel"]["id"]

    page.evaluate("""async () => {
      const panel = Array.from(window.jupyterapp.shell.widgets('main')).find(w => w.context && w.context.path === 'train.ipynb');
      await panel.sessionContext.session.kernel.interrupt();  // as its stop button does, whatever has the focus
    }""")
    entry = wait_for(lambda: resume_entry(b).get("state") == "failed" and resume_entry(b), 60,
                     "the resumed cell to end", b)
    assert "KeyboardInterrupt" in entry["line"], entry
    expect(page.locator(".jp-NotebookPanel .jp-Notebook-ExecutionIndicator[data-status='idle']")).to_have_count(1)
    assert "KeyboardInterrupt" in json.dumps(json.loads(on_disk.read_text())["cells"][1]["outputs"])
