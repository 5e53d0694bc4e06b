"""The real-time path (docs/resume.md): on host B, with jupyter-collaboration (a dependency, so what a user installs
gets it), a notebook opened in chromium while its resumed cell runs shows that cell's output growing in the open
page, the cell and the kernel busy, and interrupting it from the page ends the cell."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from new_hosts import lose_host_in_its_loop, resume_entry, wait_for

pytestmark = pytest.mark.slow

SETUP = "%load_ext spotwarp\n%spotwarp policy --every 0.2s --no-after-cell\nimport spotwarp, time\nseen = []"
LOOP = ("for i in spotwarp.resumable(range(100000), name='slow'):\n"
        "    seen.append(i)\n    print(f'step {i}', flush=True)\n    time.sleep(0.4)\n")
# the highest `step N` shown in the loop cell's output area (-1 while none)
SHOWN = """() => {
  const area = document.querySelectorAll('.jp-NotebookPanel .jp-Cell')[1]?.querySelector('.jp-OutputArea');
  const steps = [...(area ? area.innerText.matchAll(/step (\\d+)/g) : [])].map(m => Number(m[1]));
  return steps.length ? Math.max(...steps) : -1;
}"""


def test_the_resumed_cell_shows_live_in_a_notebook_opened_while_it_runs(start_lab, page, tmp_path):
    lose_host_in_its_loop(start_lab, tmp_path, SETUP, LOOP)
    b = start_lab("host-b", tmp_path / "host-b" / "workspace")
    assert "jupyter_server_ydoc | extension was successfully loaded" in b.log()  # the real-time path is on
    wait_for(lambda: resume_entry(b).get("state") == "running", 120, "the resumed cell to run", b)

    page.goto(f"{b.url}lab?token=spotwarp-test-token")
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.commands.hasCommand('docmanager:open')")
    page.evaluate("window.jupyterapp.commands.execute('docmanager:open', {path: 'train.ipynb'})")
    cell = page.locator(".jp-NotebookPanel .jp-Cell").nth(1)
    expect(cell.locator(".jp-OutputArea")).to_contain_text("step ")
    # the output grows in the open page, with no reload, step by step as printed (not in bursts, as when the file
    # is written every 3 s and the room reloads it): every change of the highest step shown is recorded
    page.evaluate(f"""() => {{
      const shown = {SHOWN};
      window.stepsShown = [shown()];
      const record = () => {{ const n = shown(); if (n !== window.stepsShown.at(-1)) window.stepsShown.push(n); }};
      new MutationObserver(record).observe(document.querySelectorAll('.jp-NotebookPanel .jp-Cell')[1],
                                           {{subtree: true, childList: true, characterData: true}});
    }}""")
    page.wait_for_function("() => window.stepsShown.slice(1).filter((n, i) => n === window.stepsShown[i] + 1).length >= 3")
    expect(cell.locator(".jp-InputPrompt")).to_contain_text("[*]")  # the cell is running
    assert "outputs of cell loop go live into the notebook's shared document" in b.log()
    indicator = page.locator(".jp-NotebookPanel .jp-Notebook-ExecutionIndicator")
    expect(indicator).to_have_attribute("data-status", "busy")
    sessions = b.request("GET", "api/sessions")[1]
    assert [s["path"] for s in sessions] == ["train.ipynb"], sessions  # the tab attached to the resumed kernel

    # the tab's own kernel connection interrupts, as its toolbar's stop button does (the Kernel menu acts on the
    # shell's current widget, which a headless page need not have made the notebook yet)
    page.evaluate("""async () => {
      const panel = Array.from(window.jupyterapp.shell.widgets('main')).find(w => w.context && w.context.path === 'train.ipynb');
      await panel.sessionContext.session.kernel.interrupt();
    }""")
    # waited for in the page, so that a failure is one line instead of every line of the output
    page.wait_for_function("() => /KeyboardInterrupt/.test(document.querySelectorAll('.jp-NotebookPanel .jp-Cell')[1]"
                           "?.querySelector('.jp-OutputArea')?.innerText || '')")
    expect(indicator).to_have_attribute("data-status", "idle")
    expect(cell.locator(".jp-InputPrompt")).not_to_contain_text("[*]")
    entry = wait_for(lambda: resume_entry(b).get("state") == "failed" and resume_entry(b), 60,
                     "the resumed cell to end", b)
    assert "KeyboardInterrupt" in entry["line"], entry
    on_disk = b.workspace / "train.ipynb"  # the room saved the document, outputs and all, to the file
    wait_for(lambda: "KeyboardInterrupt" in on_disk.read_text(), 30, "the interrupted cell saved to the file", b)
    saved = next(c for c in json.loads(on_disk.read_text())["cells"] if c["id"] == "loop")
    assert saved["source"] == LOOP.splitlines(keepends=True) or "".join(saved["source"]) == LOOP
    assert "step " in "".join("".join(o.get("text", "")) for o in saved["outputs"])
