"""Install as a new user would: a fresh clone, a clean venv, the README's first command; the wheel without Node.js.

These tests clone the repository's committed HEAD into a temporary folder, so they check what a
user gets from the repository, not this working tree.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest

from waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def readme_first_command() -> str:
    """The first command of README.md's "Two commands" section (set up and run SpotWarp)."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Two commands", 1)[1]
    return re.findall(r"```bash\n(.*?)\n```", section, re.S)[0].strip()


def clean_env(path: str) -> dict[str, str]:
    """A user's shell: no test venv, no PYTHONPATH, only `path` to find programs on."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME") and not k.startswith("PYTEST")}
    env["PATH"] = path
    return env


def system_path() -> str:
    """PATH without this test run's virtual environment."""
    here = str(Path(sys.executable).parent)
    return os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p and p != here)


def new_venv(where: Path) -> Path:
    """A clean virtual environment made by the machine's python3, as a user would."""
    python = shutil.which("python3", path=system_path()) or "python3"
    subprocess.run([python, "-m", "venv", str(where)], check=True, timeout=300, env=clean_env(system_path()))
    return where


def run(cmd: list[str] | str, cwd: Path, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          shell=isinstance(cmd, str), executable="/bin/bash" if isinstance(cmd, str) else None)


def checked(proc: subprocess.CompletedProcess) -> str:
    """Output of a command that must succeed, without terminal colours."""
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    dest = tmp_path / "spotwarp"
    subprocess.run(["git", "clone", "-q", str(REPO), str(dest)], check=True, timeout=120)
    assert not (dest / "spotwarp_jupyter" / "labextension").exists(), "a fresh clone has no prebuilt panel"
    return dest


def assert_spotwarp_installed(venv: Path, env: dict[str, str]) -> None:
    """The panel, the server extension and the console script, as `jupyter` and a shell see them."""
    labext = checked(run([str(venv / "bin" / "jupyter"), "labextension", "list"], venv, env))
    assert re.search(r"^\s*spotwarp v[\d.]+\S* enabled\s+OK", labext, re.M), labext
    serverext = checked(run([str(venv / "bin" / "jupyter"), "server", "extension", "list"], venv, env))
    assert re.search(r"^\s*spotwarp_jupyter\.server enabled", serverext, re.M), serverext
    assert re.search(r"^\s*spotwarp_jupyter\.server [\d.]+\S*\s+OK", serverext, re.M), serverext
    # jupyter-collaboration comes with it: a resumed cell's outputs go live into the notebook (docs/resume.md)
    assert re.search(r"^\s*jupyter_server_ydoc 3\.[\d.]+\s+OK", serverext, re.M), serverext
    helptext = checked(run([str(venv / "bin" / "spotwarp"), "--help"], venv, env))
    assert "start" in helptext and "restore" in helptext
    # published as spotwarp-jupyter (PyPI's `spotwarp` is another project): `import spotwarp` and the magic work
    probe = ("import importlib.metadata as m, spotwarp, spotwarp_jupyter; "
             "print(m.version('spotwarp-jupyter') == spotwarp_jupyter.__version__, m.metadata('spotwarp-jupyter')['Name'])")
    assert checked(run([str(venv / "bin" / "python"), "-c", probe], venv, env)).split() == ["True", "spotwarp-jupyter"]
    magic = checked(run([str(venv / "bin" / "ipython"), "--quick", "-c", "%load_ext spotwarp\n%spotwarp policy"],
                        venv, env))
    assert "SpotWarp policy: on, every 5m" in magic, magic


def serve_readme_start(clone: Path, start: str, env: dict[str, str]) -> None:
    """The README's `spotwarp start ...` as written (root or not: spot GPU images run as root), on a free port."""
    from lab_server import TOKEN, free_port

    port = free_port()
    command = (f". .venv/bin/activate && exec spotwarp start{start} --port {port} -- --no-browser "
               f"--ServerApp.token={TOKEN} --ServerApp.ip=127.0.0.1")
    log = clone / "start.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, shell=True, executable="/bin/bash", cwd=clone, stdout=out,
                                stderr=subprocess.STDOUT, env={**env, "HOME": str(clone / "home")},
                                start_new_session=True)
    try:
        wait_for(lambda: proc.poll() is not None or _answers(port, TOKEN), "the README's spotwarp start serving",
                 timeout=180)
        assert proc.poll() is None, log.read_text()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _answers(port: int, token: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/spotwarp/api/status?token={token}", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def test_readme_install_then_wheel_without_node(clone: Path, tmp_path: Path):
    user_env = clean_env(system_path())
    assert shutil.which("node", path=user_env["PATH"]), "this check needs Node.js on the machine (scripts/test.sh)"

    # `python -m build` from the clone: sdist, then the wheel from it, the panel compiled once
    checked(run([sys.executable, "-m", "build", "--outdir", str(tmp_path / "dist"), "."], clone, user_env))
    wheel = next((tmp_path / "dist").glob("spotwarp_jupyter-*.whl"))  # the distribution spotwarp-jupyter
    names = zipfile.ZipFile(wheel).namelist()
    assert any(re.search(r"share/jupyter/labextensions/spotwarp/static/remoteEntry\.[0-9a-f]+\.js$", n) for n in names)
    assert any(n.endswith("etc/jupyter/jupyter_server_config.d/spotwarp.json") for n in names)
    assert not any("node_modules" in n for n in names)

    # the README's first command, up to `spotwarp start`, in the clone, as written
    command = readme_first_command()
    install, sep, _start = command.partition(" && spotwarp start")
    assert sep, f"the README's first command should end by starting SpotWarp: {command!r}"
    checked(run(install, clone, user_env, timeout=1800))
    assert_spotwarp_installed(clone / ".venv", user_env)
    assert (clone / "spotwarp_jupyter" / "labextension" / "static").is_dir(), "the editable install built the panel"
    serve_readme_start(clone, _start, user_env)

    # the wheel into a second clean venv with no Node.js anywhere on PATH
    venv = new_venv(tmp_path / "wheel-venv")
    no_node = clean_env(str(venv / "bin"))
    assert shutil.which("node", path=no_node["PATH"]) is None
    checked(run([str(venv / "bin" / "pip"), "install", "-q", "-c", str(clone / "constraints.txt"), str(wheel)],
                tmp_path, no_node, timeout=1800))
    assert_spotwarp_installed(venv, no_node)


@pytest.mark.parametrize("editable", [False, True], ids=["pip-install", "pip-install-e"])
def test_building_from_source_without_node_is_one_line(clone: Path, tmp_path: Path, editable: bool):
    venv = new_venv(tmp_path / "venv")
    no_node = clean_env(str(venv / "bin"))
    target = ["-e", "."] if editable else ["."]
    proc = run([str(venv / "bin" / "pip"), "install", "--no-deps", *target], clone, no_node)
    assert proc.returncode != 0
    lines = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if "SpotWarp's JupyterLab panel" in ln]
    assert lines == [
        "SpotWarp's JupyterLab panel is built from source with Node.js >= 20, and Node.js is not on PATH: "
        "install Node.js >= 20 (e.g. `apt-get install nodejs npm`) and retry, or install the prebuilt wheel, "
        "which needs no Node.js"
    ], proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
