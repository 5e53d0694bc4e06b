"""The real-time path (docs/resume.md): on host B, with jupyter-collaboration (a dependency, so what a user installs
gets it), a notebook opened in chromium while its resumed cell runs shows that cell's output growing in the open
page, the cell and the kernel busy, and interrupting it from the page ends the cell."""

from __future__ import annotations

import json
import os
import signal

import pytest
from playwright.sync_api import expect

from new_hosts import notebook, wait_for

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


def _status(server, name: str) -> dict:
    return next((e for e in server.request("GET", "spotwarp/api/status")[1].get("resume") or []
                 if e["notebook"] == name), {})


def _lose_host_a(start_lab, tmp_path) -> None:
    """Host A runs the slow loop, snapshots inside it, and is SIGKILLed with its kernel."""
    ws_a = tmp_path / "host-a" / "workspace"
    ws_a.mkdir(parents=True)
    (ws_a / "train.ipynb").write_text(json.dumps(notebook([("setup", SETUP), ("loop", LOOP)])))
    a = start_lab("host-a", ws_a)
    nb = a.open_notebook("train.ipynb")
    pid = int(nb.run("import os as _o; print(_o.getpid())").strip())
    assert a.request("POST", "spotwarp/api/snapshots", {"message": "the notebook"})[0] == 201
    nb.run(SETUP, cell_id="setup")
    nb.send(LOOP, cell_id="loop")
    store = tmp_path / "store" / "browser" / "snapshots"
    wait_for(lambda: sum(1 for p in store.glob("*.json") if json.loads(p.read_text()).get("kind") == "kernel"
                         and json.loads(p.read_text())["kernels"]["train.ipynb"].get("at") == "step") >= 3,
             60, "snapshots inside the loop", a)
    os.kill(pid, signal.SIGKILL)
    a.kill()


def test_the_resumed_cell_shows_live_in_a_notebook_opened_while_it_runs(start_lab, page, tmp_path):
    _lose_host_a(start_lab, tmp_path)
    b = start_lab("host-b", tmp_path / "host-b" / "workspace")
    assert "jupyter_server_ydoc | extension was successfully loaded" in b.log()  # the real-time path is on
    wait_for(lambda: _status(b, "train.ipynb").get("state") == "running", 120, "the resumed cell to run", b)

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

    page.evaluate("""async () => {
      const panel = Array.from(window.jupyterapp.shell.widgets('main')).find(w => w.context && w.context.path === 'train.ipynb');
      window.jupyterapp.shell.activateById(panel.id);
      await window.jupyterapp.commands.execute('kernelmenu:interrupt');
    }""")
    expect(cell.locator(".jp-OutputArea")).to_contain_text("KeyboardInterrupt")
    expect(indicator).to_have_attribute("data-status", "idle")
    expect(cell.locator(".jp-InputPrompt")).not_to_contain_text("[*]")
    entry = wait_for(lambda: _status(b, "train.ipynb").get("state") == "failed" and _status(b, "train.ipynb"), 60,
                     "the resumed cell to end", b)
    assert "KeyboardInterrupt" in entry["line"], entry
    on_disk = b.workspace / "train.ipynb"  # the room saved the document, outputs and all, to the file
    wait_for(lambda: "KeyboardInterrupt" in on_disk.read_text(), 30, "the interrupted cell saved to the file", b)
    saved = next(c for c in json.loads(on_disk.read_text())["cells"] if c["id"] == "loop")
    assert saved["source"] == LOOP.splitlines(keepends=True) or "".join(saved["source"]) == LOOP
    assert "step " in "".join("".join(o.get("text", "")) for o in saved["outputs"])
