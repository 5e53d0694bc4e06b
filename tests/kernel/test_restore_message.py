"""The restore message: one short summary line first, then the details (variables, warnings), one per line."""

from __future__ import annotations

from kernels import SESSION


def test_restore_prints_a_summary_line_then_details(start_kernel):
    a = start_kernel("host-a", JPY_SESSION_NAME="train.ipynb")
    a.run("%load_ext spotwarp\n%spotwarp off\nimport torch\nw = torch.ones(2, requires_grad=True)\n"
          "y = w * 2\nz = w * 3\nlr = 0.1\n%spotwarp snapshot")
    a.kill()
    b = start_kernel("host-b", JPY_SESSION_NAME="train.ipynb")
    out = b.run("%load_ext spotwarp\n%spotwarp off\n%spotwarp restore latest")
    lines = [ln for ln in out.splitlines() if ln.strip() and not ln.startswith("<")]
    summary = next(i for i, ln in enumerate(lines) if "restored" in ln)
    assert lines[summary].startswith("SpotWarp restored 4 variables from "), lines
    assert len(lines[summary]) <= 100 and "autograd" not in lines[summary], lines[summary]
    details = lines[summary + 1:]
    assert any(ln.startswith("  variables ") and "lr" in ln for ln in details), details
    changed = [ln for ln in details if "autograd" in ln or "grad_fn" in ln]
    assert len(changed) >= 2 and all(ln.startswith("  warning: ") for ln in changed), details
    # the widget's notice: the same summary line, then one detail per line
    b.run(SESSION + "from spotwarp_jupyter.widget.status import StatusWidget\nwidget = StatusWidget(s)\n"
          "text = widget._restore('latest')")
    text = b.value("text").splitlines()
    assert text[0].startswith("Restored 4 variables from ") and "autograd" not in text[0] and len(text) >= 3, text
