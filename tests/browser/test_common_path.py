"""The common path after a preemption, in a real browser: a new notebook renamed
through JupyterLab's dialog, a training cell edited and re-run without saving, SIGTERM; on a new host the
notebook holds the cells that ran, the widget offers exactly that state, one click restores it, and re-running
the training cell continues at the next batch."""

from __future__ import annotations

import json
import re

import pytest
from lab_pages import open_notebook_and_wait_for_kernel
from playwright.sync_api import expect

from engines import make_engine
from lab_server import TOKEN

pytestmark = pytest.mark.slow

SETUP = "%load_ext spotwarp\n%spotwarp policy --every 20s\nimport spotwarp, time\nseen = []"
TRAIN_SAVED = "for step in spotwarp.resumable(range(100), name='train'):\n    seen.append(step)"
TRAIN_RUN = ("start = len(seen)\n"
             "for step in spotwarp.resumable(range(1500), name='train'):\n"
             "    seen.append(step)\n    time.sleep(0.01)\n"
             "print('resumed at', seen[start], flush=True)")

NOTEBOOK_JS = """async ([what, arg]) => {
  const app = window.jupyterapp;
  const panel = app.shell.currentWidget;
  const shared = panel.content.model.sharedModel;
  if (what === 'path') return panel.context.path;
  if (what === 'set') {  // [index, source]: as a user types it
    while (shared.cells.length <= arg[0]) shared.insertCell(shared.cells.length, {cell_type: 'code', source: ''});
    shared.cells[arg[0]].setSource(arg[1]);
    return shared.cells.length;
  }
  if (what === 'run') {  // run cell `arg` as its run button does; resolves once the kernel was sent it
    // (the command itself resolves only when the cell has finished: a training cell must still be running)
    let sent = 0;
    await panel.sessionContext.ready;  // a notebook just opened may still be starting its kernel
    for (let tries = 0; !panel.sessionContext.session?.kernel && tries < 600; tries++) {
      await new Promise(r => setTimeout(r, 100));
    }
    const kernel = panel.sessionContext.session.kernel;
    const count = (_, m) => { if (m.direction === 'send' && m.msg.header.msg_type === 'execute_request') sent += 1; };
    kernel.anyMessage.connect(count);
    try {
      for (let tries = 0; sent === 0 && tries < 50; tries++) {
        app.shell.activateById(panel.id);
        panel.content.activeCellIndex = arg;
        let finished = false;
        app.commands.execute('notebook:run-cell').then(() => { finished = true; }, () => { finished = true; });
        const deadline = Date.now() + 30000;
        while (sent === 0 && !finished && Date.now() < deadline) await new Promise(r => setTimeout(r, 20));
      }
    } finally {
      kernel.anyMessage.disconnect(count);
    }
    return sent;
  }
  if (what === 'source') return shared.cells.map(c => c.getSource());
  if (what === 'dirty') return panel.context.model.dirty;
}"""


def nb(page, what: str, arg=None):
    return page.evaluate(NOTEBOOK_JS, [what, arg])


def test_a_preempted_session_comes_back_as_the_user_left_it(start_lab, page, tmp_path):
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    ws_a = tmp_path / "host-a" / "workspace"
    ws_a.mkdir(parents=True)
    (ws_a / "README.txt").write_text("data\n")
    a = start_lab("host-a", ws_a)
    page.goto(f"{a.url}lab?token={TOKEN}")
    # File > New > Notebook once the kernel specs are known (before, JupyterLab asks which kernel to start)
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.commands.hasCommand('notebook:create-new')"
                           " && window.jupyterapp.serviceManager.kernelspecs.specs?.kernelspecs?.python3")
    page.evaluate("window.jupyterapp.commands.execute('notebook:create-new', {kernelName: 'python3'})")
    page.wait_for_function("() => window.jupyterapp.shell.currentWidget?.sessionContext?.session?.kernel",
                           timeout=120_000)
    expect(page.locator(".jp-NotebookPanel .jp-Notebook-ExecutionIndicator[data-status='idle']")).to_have_count(
        1, timeout=120_000)
    assert nb(page, "path") == "Untitled.ipynb"

    # the name asked for at the first save: JupyterLab's rename dialog
    nb(page, "set", [0, SETUP])
    nb(page, "set", [1, TRAIN_SAVED])
    page.evaluate("() => { window.jupyterapp.commands.execute('docmanager:save'); }")  # resolves after the dialog
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_contain_text("Rename file")
    dialog.locator("input[type='text'], input:not([type])").first.fill("train.ipynb")
    dialog.get_by_role("button", name="Rename and Save").click()
    expect(dialog).to_have_count(0)
    page.wait_for_function("() => window.jupyterapp.shell.currentWidget.context.path === 'train.ipynb'")
    page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty")

    widget = page.locator(".spotwarp-widget")
    nb(page, "run", 0)
    expect(widget.locator(".spotwarp-w-where")).to_have_text("browser · train.ipynb", timeout=120_000)
    nb(page, "run", 1)
    expect(widget.locator(".spotwarp-w-state")).to_have_text("protected", timeout=120_000)
    # the training cell edited and run again, not saved; SIGTERM (a spot notice) while it runs
    nb(page, "set", [1, TRAIN_RUN])
    nb(page, "run", 1)
    assert nb(page, "dirty") is True
    expect(page.locator(".jp-NotebookPanel .jp-Notebook-ExecutionIndicator[data-status='busy']")).to_have_count(1)
    a.stop()

    store = make_engine(tmp_path / "store", "browser")
    final = store.manifests()[0]
    record = final.kernels["train.ipynb"]
    position = record["positions"]["train"]
    # saved under the name the user gave it; nothing was ever saved under Untitled.ipynb, so it is no alias
    assert position > 0 and set(final.kernels) == {"train.ipynb"} and not record.get("aliases"), record

    # a new host, an empty workspace: the notebook comes back holding the cells that ran
    # --no-resume: the person's own path; without it the server resumes the notebook by itself
    # (tests/browser/test_resume_browser.py)
    b = start_lab("host-b", tmp_path / "host-b" / "workspace", start_args=("--no-resume",))
    cells = json.loads((b.workspace / "train.ipynb").read_text())["cells"]
    assert ["".join(c["source"]) for c in cells if c["cell_type"] == "code"] == [SETUP, TRAIN_RUN]
    page.goto(f"{b.url}lab?token={TOKEN}")
    open_notebook_and_wait_for_kernel(page, "train.ipynb")
    nb(page, "run", 0)
    restore = widget.locator(".spotwarp-w-restore")
    expect(restore).to_contain_text(f"Restore {len(record['variables'])} variables of train.ipynb from ",
                                    timeout=120_000)
    expect(widget.locator(".spotwarp-w-offer")).to_contain_text(f"train at step {position}")
    expect(widget.locator(".spotwarp-w-offer")).to_contain_text(f"snapshot {final.id}")
    restore.click()
    expect(widget.locator(".spotwarp-w-notice")).to_contain_text(f"Restored {len(record['variables'])} variables")
    expect(widget.locator(".spotwarp-w-restore")).to_have_count(0)
    # protected within one policy interval (at once: the restored state is stored), with the restored policy
    expect(widget.locator(".spotwarp-w-state")).to_have_text("protected", timeout=20_000)
    expect(widget.locator(".spotwarp-w-policy")).to_contain_text("every 20.0 s")

    nb(page, "run", 1)  # re-run the training cell: it continues at the next batch
    output = page.locator(".jp-NotebookPanel .jp-Cell").nth(1).locator(".jp-OutputArea-output")
    expect(output).to_contain_text(f"resumed at {position}", timeout=120_000)
    expect(widget.locator(".spotwarp-w-restore")).to_have_count(0)  # no offer after: its state is this kernel's
    # and what the cell trained since is stored by this kernel's own snapshot, an interval on (idle by then)
    expect(widget.locator(".spotwarp-w-last")).to_contain_text(re.compile(r"\d"), timeout=60_000)
    expect(widget.locator(".spotwarp-w-state")).to_have_text("protected")
    assert not errors, errors
