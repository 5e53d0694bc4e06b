"""`%spotwarp restore latest` loads only this notebook's own state; another notebook's needs its id."""

from __future__ import annotations

LAST_ID = "__import__('spotwarp_jupyter.kernel.session', fromlist=['x']).current().last.id"


def test_latest_never_loads_another_notebooks_variables(start_kernel):
    a = start_kernel("hostA", JPY_SESSION_NAME="analysis/a.ipynb")
    a.run("%load_ext spotwarp\nsecret_of_a = 'only for a.ipynb'\n%spotwarp snapshot -m 'a'")
    snap = a.value(LAST_ID)
    a.kill()

    b = start_kernel("hostB", JPY_SESSION_NAME="b.ipynb")
    b.run("%load_ext spotwarp\nmine = 1")
    ename, evalue, _out = b.run_error("%spotwarp restore latest")
    assert ename == "UsageError" and "\n" not in evalue.strip(), evalue
    assert "b.ipynb" in evalue and "analysis/a.ipynb" in evalue and snap in evalue, evalue
    assert b.value("'secret_of_a' in dir()") is False  # nothing was loaded
    assert b.value("mine") == 1
    ename, evalue, _out = b.run_error("%spotwarp restore")  # latest is the default
    assert ename == "UsageError" and snap in evalue

    # asked for by id, it loads, and says whose snapshot it was
    out = b.run(f"%spotwarp restore {snap}")
    assert b.value("secret_of_a") == "only for a.ipynb"
    assert "analysis/a.ipynb" in out and snap in out, out

    # the notebook that made it gets it back with `latest`, as before
    again = start_kernel("hostC", JPY_SESSION_NAME="analysis/a.ipynb")
    out = again.run("%load_ext spotwarp\n%spotwarp restore latest")
    assert again.value("secret_of_a") == "only for a.ipynb"
    assert snap in out
