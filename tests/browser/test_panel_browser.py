"""In a real browser: the SpotWarp panel in JupyterLab from `spotwarp start`, and the notebook's status widget."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from lab_pages import open_notebook_and_wait_for_kernel
from playwright.sync_api import expect

from lab_server import TOKEN

# JupyterLab from `spotwarp start` and a real chromium: minutes; it also runs in its own pytest process
pytestmark = pytest.mark.slow

DOCS_IMG = Path(__file__).parents[2] / "docs" / "img"


def until(condition, what: str, timeout: float = 60):
    """Poll `condition` until it returns something truthy, or fail naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)  # poll interval of a deadline-bounded wait
    raise AssertionError(f"timed out waiting for {what}")


def screenshot(locator, name: str, tmp_path: Path) -> Path:
    """Save a PNG next to the test's files; also into docs/img when SPOTWARP_SCREENSHOTS=1 (README images)."""
    out = tmp_path / name
    locator.screenshot(path=str(out))
    if os.environ.get("SPOTWARP_SCREENSHOTS") == "1":
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        (DOCS_IMG / name).write_bytes(out.read_bytes())
    return out


def widen_left_area(page, pixels: int) -> None:
    """Drag the left sidebar's edge, as a user does, so the screenshot shows the panel unwrapped."""
    handle = page.locator("#jp-main-split-panel > .lm-SplitPanel-handle").first
    box = handle.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x + pixels, y, steps=5)
    page.mouse.up()


def confirm(page, title: str, button: str) -> None:
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_contain_text(title)
    dialog.get_by_role("button", name=button, exact=True).click()
    expect(dialog).to_have_count(0)


def test_panel_snapshot_restore_and_notebook_widget(lab, page, tmp_path):
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{lab.url}lab?token={TOKEN}")

    # The panel: its own icon in the left sidebar, checked against the server extension's version.
    page.locator('.jp-SideBar.jp-mod-left .lm-TabBar-tab[data-id="spotwarp-panel"]').click()
    panel = page.locator("#spotwarp-panel")
    expect(panel).to_be_visible()
    expect(panel.locator(".jp-SpotWarp-statusSection")).to_contain_text("browser")
    expect(panel.locator(".jp-SpotWarp-empty").first).to_be_visible()
    expect(panel.locator('[role="alert"]')).to_have_count(0)

    # Snapshot now, confirmed; the panel's timeline shows the snapshot the server just committed.
    panel.locator(".jp-SpotWarp-snapshotNow").click()
    confirm(page, "Take a SpotWarp snapshot?", "Snapshot")
    snaps = until(lambda: lab.request("GET", "spotwarp/api/snapshots")[1]["snapshots"], "the snapshot")
    snap_id = snaps[0]["id"]
    entry = panel.locator(f'[data-snapshot-id="{snap_id}"]')
    expect(entry).to_be_visible()
    expect(entry).to_contain_text(snaps[0]["host"])
    expect(entry.locator(".jp-SpotWarp-contents")).to_contain_text("2 files")

    # A workspace file goes bad; restoring the snapshot from the panel brings it back.
    (lab.workspace / "data.txt").write_text("garbage\n")
    entry.get_by_role("button", name="Restore").click()
    confirm(page, f"Restore snapshot {snap_id}?", "Restore")
    expect(page.get_by_text(f"Restored {snap_id}")).to_be_visible()
    assert (lab.workspace / "data.txt").read_text() == "epoch 3\n"

    # The notebook: %load_ext spotwarp shows the widget, which renders the kernel's status live.
    open_notebook_and_wait_for_kernel(page, "train.ipynb")
    run_cells(page)
    widget = page.locator(".spotwarp-widget")
    expect(widget).to_be_visible(timeout=120_000)
    expect(widget.locator(".spotwarp-w-where")).to_have_text("browser · train.ipynb")
    expect(widget.locator(".spotwarp-w-state")).to_have_text("protected", timeout=120_000)
    expect(widget.locator(".spotwarp-w-skip")).to_contain_text("conn")
    expect(widget.locator(".spotwarp-w-policy")).to_contain_text("every 5m")

    widget.get_by_role("button", name="Snapshot now").click()
    notice = widget.locator(".spotwarp-w-notice")
    expect(notice).to_contain_text("Snapshot ")
    widget_snap = notice.inner_text().split()[1].rstrip(":")
    expect(widget.locator(".spotwarp-w-id")).to_have_text(widget_snap)

    # The panel lists the notebook's snapshots too, with the notebook named.
    panel.locator(".jp-ToolbarButtonComponent[title='Refresh']").click()
    nb_entry = panel.locator(f'[data-snapshot-id="{widget_snap}"]')
    expect(nb_entry).to_be_visible()
    expect(nb_entry.locator(".jp-SpotWarp-contents")).to_contain_text("train.ipynb")

    widen_left_area(page, 120)
    screenshot(panel, "panel.png", tmp_path)
    screenshot(widget, "widget.png", tmp_path)
    assert not errors, errors



RUN_CELLS = """async ([command, path]) => {
  // A notebook command acts on the tracker's current notebook, which follows focus: on a loaded machine it
  // can run before that is set and do nothing. Issue it until the notebook's kernel was sent an
  // execute_request (the command's promise resolves once its cells ran), never again once one was.
  const panel = Array.from(window.jupyterapp.shell.widgets('main')).find(w => w.context && w.context.path === path);
  if (!panel) throw new Error(`${path} is not open`);
  let sent = 0;
  panel.sessionContext.session.kernel.anyMessage.connect((_, m) => {
    if (m.direction === 'send' && m.msg.header.msg_type === 'execute_request') sent += 1;
  });
  for (let tries = 0; sent === 0; tries++) {
    if (tries === 50) throw new Error(`${command} never ran a cell of ${path}`);
    window.jupyterapp.shell.activateById(panel.id);
    await window.jupyterapp.commands.execute(command);
  }
  return sent;
}"""


def run_cells(page, command: str = "notebook:run-all-cells", path: str = "train.ipynb") -> None:
    """Run the open notebook's cells with `command`, as its toolbar button would."""
    page.evaluate(RUN_CELLS, [command, path])


def test_new_host_restores_the_session_from_the_widget(lab, start_lab, page, tmp_path):
    """Host A is preempted; on host B the notebook's widget offers its newest snapshot, and one click restores it."""
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{lab.url}lab?token={TOKEN}")
    open_notebook_and_wait_for_kernel(page, "train.ipynb")
    run_cells(page)
    widget = page.locator(".spotwarp-widget")
    expect(widget.locator(".spotwarp-w-state")).to_have_text("protected", timeout=120_000)
    # The server's snapshot of files and live kernels (what its timer and a preemption notice take).
    code, answer = lab.request("POST", "spotwarp/api/snapshots", {"message": "before preemption"})
    assert code == 201, answer
    taken = answer["id"]
    assert "train.ipynb" in answer["notebooks"], answer
    assert not errors, errors
    lab.kill()
    # the page still shows host A's notebook: its widget stops vouching for a session whose server is gone
    expect(widget.locator(".spotwarp-w-state")).to_contain_text("no answer from the kernel", timeout=60_000)

    # the manual path, from the widget: the server resumes nothing by itself (docs/resume.md)
    b = start_lab("host-b", tmp_path / "host-b" / "workspace", start_args=("--no-resume",))
    assert (b.workspace / "train.ipynb").exists(), "spotwarp start restores the workspace on a new host"
    # host A's page had requests in flight when its server died: what they raise there is not host B's page's
    errors.clear()
    page.goto(f"{b.url}lab?token={TOKEN}")
    open_notebook_and_wait_for_kernel(page, "train.ipynb")
    run_cells(page, "notebook:run-cell")  # only %load_ext spotwarp
    widget = page.locator(".spotwarp-widget")
    expect(widget.locator(".spotwarp-w-state")).to_contain_text("not protected")
    restore = widget.locator(".spotwarp-w-restore")
    expect(restore).to_contain_text("Restore 1 variable of train.ipynb from ")
    expect(restore).to_have_attribute("title", re.compile(rf"^Snapshot {taken}, "))
    expect(widget.locator(".spotwarp-w-offer")).to_contain_text(f"snapshot {taken}")
    screenshot(widget, "widget-restore.png", tmp_path)

    restore.click()
    expect(widget.locator(".spotwarp-w-notice")).to_contain_text(f"Restored 1 variables from {taken}")
    expect(widget.locator(".spotwarp-w-restore")).to_have_count(0)
    assert not errors, errors


def test_panel_says_plainly_when_the_server_extension_is_missing(start_lab, page, tmp_path):
    lab = start_lab("plain", tmp_path / "plain" / "workspace", without_spotwarp=True)
    assert lab.request("GET", "spotwarp/api/status")[0] == 404
    page.goto(f"{lab.url}lab?token={TOKEN}")
    page.locator('.jp-SideBar.jp-mod-left .lm-TabBar-tab[data-id="spotwarp-panel"]').click()
    alert = page.locator('#spotwarp-panel [role="alert"]')
    expect(alert).to_contain_text("The SpotWarp server extension is not running")
    expect(alert).to_contain_text("jupyter server extension enable spotwarp_jupyter")
    expect(page.locator("#spotwarp-panel .jp-SpotWarp-restore")).to_have_count(0)


def test_panel_shows_a_preemption_recorded_in_the_journal(lab, start_lab, page, tmp_path):
    """Host A gets SIGTERM (a spot notice) and commits its final snapshot; host B restores; B's panel reports it."""
    lab.stop()  # SIGTERM to the process group: the watcher journals the notice, the final snapshot is committed
    b = start_lab("host-b", tmp_path / "host-b" / "workspace")
    assert (b.workspace / "train.ipynb").exists(), "spotwarp start restores the workspace on a new host"
    page.goto(f"{b.url}lab?token={TOKEN}")
    page.locator('.jp-SideBar.jp-mod-left .lm-TabBar-tab[data-id="spotwarp-panel"]').click()
    section = page.locator("#spotwarp-panel .jp-SpotWarp-eventsSection")
    expect(section).to_contain_text("Preemptions survived1 of 1")
    preemption = section.locator(".jp-SpotWarp-eventlist li")
    expect(preemption).to_have_count(1)
    expect(preemption).to_contain_text("lost (signals) · final snapshot ")
    expect(preemption).to_contain_text(" · resumed on ")
