"""Wrong flags, sizes, ids and storage URLs: one clear line, and nothing changes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from spotwarp_jupyter.engine import ConfigError, Settings, StorageError
from spotwarp_jupyter.engine.settings import expand_storage_url
from spotwarp_jupyter.engine.units import parse_duration, parse_size

from engines import make_engine


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", *args], capture_output=True, text=True,
                          timeout=120, env=env)


BAD_MAGIC_LINES = [
    ("%spotwarp frobnicate", "unknown command 'frobnicate'"),
    ("%spotwarp policy --every soon", "bad duration 'soon'"),
    ("%spotwarp policy --every 0s", "more than zero"),
    ("%spotwarp policy --max-var-size lots", "bad size 'lots'"),
    ("%spotwarp policy --keep -3", "--keep"),
    ("%spotwarp policy --exclude 'a b,'", "variable names"),
    ("%spotwarp policy --bogus 1", "unrecognized arguments"),
    ("%spotwarp policy --project ../escape", "bad project id"),
    ("%spotwarp policy --storage nosuch://bucket", "Protocol not known"),
    ("%spotwarp restore zzzzzzzz", "no snapshot 'zzzzzzzz'"),
    ("%spotwarp restore ../../etc/passwd", "bad snapshot id"),
    ("%spotwarp restore latest --vars 1x", "variable names"),
    ("%spotwarp restore latest --vars notthere", "not in this snapshot: notthere"),
    ("%spotwarp list extra", "takes no arguments"),
    ("%spotwarp snapshot --frob", "unrecognized arguments"),
]


def test_bad_magic_lines_fail_in_one_line_and_change_nothing(start_kernel):
    k = start_kernel("host")
    k.run("%load_ext spotwarp\nkeep = 'original'\n%spotwarp policy --every 10m --exclude secret\n%spotwarp snapshot")
    before = k.run("%spotwarp policy")
    for line, expected in BAD_MAGIC_LINES:
        ename, evalue, output = k.run_error(line)
        assert ename == "UsageError", (line, ename, evalue)
        assert expected in evalue, (line, evalue)
        assert "\n" not in evalue.strip(), (line, evalue)
        assert "Traceback" not in output, (line, output)
    assert k.run("%spotwarp policy") == before
    assert k.value("keep") == "original"
    assert k.value("len(__import__('spotwarp_jupyter.kernel.session', fromlist=['x']).current().engine.manifests())") == 1


def test_unreachable_storage_in_the_magic(start_kernel, tmp_path):
    k = start_kernel("host")
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("x")
    k.run("%load_ext spotwarp")
    storage_expr = "__import__('spotwarp_jupyter.kernel.session', fromlist=['x']).current().settings.storage"
    before = k.value(storage_expr)
    ename, evalue, _ = k.run_error(f"%spotwarp policy --storage {blocked}/store")
    assert ename == "UsageError"
    assert "unreachable" in evalue and "\n" not in evalue.strip()
    assert k.value(storage_expr) == before


@pytest.mark.process
@pytest.mark.parametrize("args,code,expected", [
    (["frob"], 2, "invalid choice"),
    (["list", "--bogus"], 2, "unrecognized arguments"),
    (["start", "--workspace-path", "w", "--ip=0.0.0.0"], 2, "Jupyter's own flags go after --: spotwarp start ... -- --ip=0.0.0.0"),
    (["gc", "--keep", "0"], 2, "at least 1"),
    (["gc"], 2, "--keep"),
    (["list", "--project-id", "../x"], 1, "bad project id"),
    (["list", "--storage", "nosuch://x"], 1, "Protocol not known"),
    (["list", "--storage", "/definitely/not/here"], 1, "does not exist"),
    (["verify", "--snapshot", "zzzz"], 1, "no snapshot"),
])
def test_cli_errors_are_one_line_with_exit_codes(args, code, expected, store_url, tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SPOTWARP_STORAGE": store_url}
    import os

    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    (tmp_path / "s").mkdir()
    result = cli(*args, env={**env, "SPOTWARP_STORAGE": str(tmp_path / "s")} if "--storage" not in args else env)
    assert result.returncode == code, result
    assert expected in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_units_and_settings_validation():
    assert parse_duration("30s") == 30 and parse_duration("5m") == 300 and parse_duration("1h") == 3600
    assert parse_size("512MB") == 512 * 10**6 and parse_size("8GB") == 8 * 10**9 and parse_size("1GiB") == 2**30
    for bad in ("", "5 minutes", "-1s", "m5"):
        with pytest.raises(ConfigError):
            parse_duration(bad)
    with pytest.raises(ConfigError, match="SPOTWARP_STORAGE_OPTIONS"):
        Settings.resolve(env={"SPOTWARP_STORAGE_OPTIONS": "{not json"})
    with pytest.raises(ConfigError, match="unknown placeholder"):
        expand_storage_url("s3://b/{user}")
    assert expand_storage_url("s3://b/{username}/{server_name}", {"JUPYTERHUB_USER": "ann"}) == "s3://b/ann/default"
    with pytest.raises(ConfigError):
        expand_storage_url("s3://b/{username}", {"JUPYTERHUB_USER": "../bob"})


def test_settings_precedence(tmp_path):
    env = {"SPOTWARP_PROJECT": "from-env", "SPOTWARP_STORAGE": str(tmp_path / "env")}
    config = {"project": "from-config", "storage": str(tmp_path / "config")}
    assert Settings.resolve(project="flag", env=env, config=config).project == "flag"
    assert Settings.resolve(env=env, config=config).project == "from-env"
    assert Settings.resolve(env={}, config=config).storage == str(tmp_path / "config")
    default = Settings.resolve(env={"HOME": str(tmp_path)}, config={})
    assert default.project == "default" and default.storage.endswith(".spotwarp/store")


def test_storage_that_is_a_file_is_refused(tmp_path):

    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder")
    with pytest.raises(StorageError, match="unreachable|not writable|exist"):
        make_engine(blocker / "store", "p", resolved=False)


@pytest.mark.process
@pytest.mark.parametrize("kind", ["local", "s3"])
def test_a_project_id_the_storage_holds_nothing_of_is_named_and_nothing_is_created(kind, request, tmp_path):
    """`dmeo` for `demo` after a preemption must not read as "no snapshots": one line naming the projects there."""
    import os

    from storage_servers import make_target

    target = make_target(kind, request, tmp_path)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": os.pathsep.join(sys.path),
           **target.kernel_env()}
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "a.txt").write_text("a")
    if kind == "local":
        os.makedirs(target.url)  # an empty store, as an empty bucket is
    empty = cli("list", "--project-id", "demo", env=env)
    assert empty.returncode == 1 and "holds no project yet" in empty.stderr, empty
    for project in ("demo", "train"):
        assert cli("snapshot", "--project-id", project, "--workspace-path", str(workspace), env=env).returncode == 0
    fs = target.filesystem()
    root = target.url.split("://", 1)[-1]

    def stored() -> set[str]:
        return set(fs.find(root, withdirs=True))

    before = stored()
    for command in (["list"], ["status"], ["report"], ["hosts"], ["verify"], ["gc", "--keep", "1"], ["restore"]):
        result = cli(*command, "--project-id", "dmeo", env=env)
        assert result.returncode == 1, (command, result)
        assert f"spotwarp {command[0]}: project 'dmeo' has no snapshots in {target.url}; projects there: demo, train" \
            == result.stderr.strip(), (command, result.stderr)
    launch = cli("launch", "--project-id", "dmeo", "--provider", "local", "--workspace-path", str(workspace), env=env)
    assert launch.returncode == 1 and "(projects there: demo, train)" in launch.stderr, launch
    for command in (["list"], ["status"], ["report"], ["hosts"], ["verify"]):  # read-only: nothing written
        assert cli(*command, "--project-id", "demo", env=env).returncode == 0, command
    assert stored() == before
