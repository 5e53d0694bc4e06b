"""Where each setting comes from, strongest first: flags, `SPOTWARP_*` variables, config files, defaults.

One table, three doors: the `spotwarp` command line (`c.SpotWarp.*` in jupyter_server_config.py is its config
file), a real jupyter_server (`--SpotWarp.*` arguments, `c.SpotWarp.*` in its config file, `GET status`) and the
`%spotwarp` magic in a real kernel (`%spotwarp policy` flags, `c.SpotWarpMagics.*` in ipython_kernel_config.py).
Each row gives the layer named and every weaker one, each with its own value, and checks the strongest won.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spotwarp_jupyter.engine import ConfigError
from spotwarp_jupyter.engine.settings import LOCATION, SERVER, SETTINGS, resolve_setting
from spotwarp_jupyter.server.app import SpotWarp

from kernels import Kernel
from server_config import EXPORTED

pytest_plugins = ("pytest_jupyter.jupyter_server",)

LAYERS = ("flag", "env", "config", "default")
VARIABLES = {"project": "SPOTWARP_PROJECT", "storage": "SPOTWARP_STORAGE", "workspace": "SPOTWARP_WORKSPACE",
             "shutdown_grace": "SPOTWARP_SHUTDOWN_GRACE", "every": "SPOTWARP_EVERY"}
CLEARED = (*EXPORTED, "SPOTWARP_KEY", "SPOTWARP_SHUTDOWN_GRACE", "SPOTWARP_EVERY", "JUPYTER_CONFIG_PATH")


def given(strongest: str) -> tuple[str, ...]:
    """The layers a row sets: the one it names and every weaker one (the default is always there)."""
    return LAYERS[LAYERS.index(strongest):-1]


def table(door: str, settings: tuple[str, ...], packed: bool = False) -> list:
    """One row per setting and strongest layer given; `packed` rows hold one (setting, layer) value."""
    return [pytest.param(*([(setting, layer)] if packed else [setting, layer]), id=f"{door}-{setting}-from-{layer}")
            for setting in settings for layer in LAYERS]


def value(setting: str, layer: str, tmp_path: Path) -> Any:
    """The value `layer` gives `setting` in a row: each layer its own, so the answer names the winner."""
    if setting == "project":
        return f"from-{layer}"
    if setting in ("storage", "workspace"):
        folder = tmp_path / f"{setting}-{layer}"
        folder.mkdir(exist_ok=True)
        return str(folder)
    if setting == "shutdown_grace":
        return {"flag": 7.0, "env": 8.0, "config": 9.0}[layer]
    if setting == "every":
        return {"flag": "1m", "env": "2m", "config": "3m"}[layer]
    raise KeyError(setting)


def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No SpotWarp variable of the test process leaks into a row (monkeypatch puts them back afterwards)."""
    for name in CLEARED:
        monkeypatch.setenv(name, "unset")
        monkeypatch.delenv(name)


# -- the command line -------------------------------------------------------------------------------------------
CLI_FLAGS = {"project": "--project-id", "storage": "--storage", "workspace": "--workspace-path"}


def run_cli(tmp_path: Path, setting: str, strongest: str, *command: str) -> subprocess.CompletedProcess:
    """`spotwarp COMMAND` with the row's layers: its flag, its variable, `c.SpotWarp.*` in the Jupyter config dir."""
    config_dir = tmp_path / "jupyter-config"
    config_dir.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTWARP_") and k != "JUPYTER_CONFIG_PATH"}
    env.update(HOME=str(tmp_path / "home"), JUPYTER_CONFIG_DIR=str(config_dir))
    args = list(command)
    layers = given(strongest)
    if "flag" in layers:
        args += [CLI_FLAGS[setting], value(setting, "flag", tmp_path)]
    if "env" in layers:
        env[VARIABLES[setting]] = value(setting, "env", tmp_path)
    if "config" in layers:
        (config_dir / "jupyter_server_config.py").write_text(
            f"c.SpotWarp.{setting} = {value(setting, 'config', tmp_path)!r}\n")
    return subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", *args], check=False, capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=120)


@pytest.mark.process
@pytest.mark.parametrize("setting, strongest", table("cli", ("project", "storage")))
def test_cli(tmp_path: Path, setting: str, strongest: str):
    default_store = tmp_path / "home" / ".spotwarp" / "store"
    default_store.mkdir(parents=True)
    result = run_cli(tmp_path, setting, strongest, "status", "--json")
    assert result.returncode == 0, result.stderr
    expected = {"project": "default", "storage": str(default_store)}[setting] if strongest == "default" \
        else value(setting, strongest, tmp_path)
    assert json.loads(result.stdout)[setting] == expected


@pytest.mark.process
@pytest.mark.parametrize("setting, strongest", table("cli", ("workspace",)))
def test_cli_workspace(tmp_path: Path, setting: str, strongest: str):
    for count, layer in enumerate(LAYERS[:-1], 1):  # a workspace of 1, 2 or 3 files: the snapshot says which
        for n in range(count):
            Path(value(setting, layer, tmp_path), f"{layer}-{n}.txt").write_text(layer)
    result = run_cli(tmp_path, setting, strongest, "snapshot", "--json", "--storage", str(tmp_path / "store"))
    if strongest == "default":  # no workspace unless one is given
        assert result.returncode == 1 and "needs --workspace-path" in result.stderr
        return
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["files"] == LAYERS.index(strongest) + 1


@pytest.mark.process
def test_cli_names_a_bad_variable_in_one_line(tmp_path: Path):
    env = {**os.environ, "HOME": str(tmp_path), "SPOTWARP_PROJECT": "no such/project"}
    result = subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", "status"], check=False, capture_output=True,
                            text=True, env=env, timeout=120)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "SPOTWARP_PROJECT='no such/project' cannot be used" in result.stderr


# -- the server ---------------------------------------------------------------------------------------------------
@pytest.fixture
def server_row(request) -> tuple[str, str]:
    return request.param


@pytest.fixture
def jp_argv(server_row, tmp_path) -> list[str]:
    setting, strongest = server_row
    return [f"--SpotWarp.{setting}={value(setting, 'flag', tmp_path)}"] if "flag" in given(strongest) else []


@pytest.fixture
def jp_server_config(server_row, tmp_path, jp_config_dir, monkeypatch) -> dict[str, Any]:
    """The row's variable in the server's environment and `c.SpotWarp.*` in its jupyter_server_config.py."""
    setting, strongest = server_row
    clean_environment(monkeypatch)
    if "env" in given(strongest):
        monkeypatch.setenv(VARIABLES[setting], str(value(setting, "env", tmp_path)))
    if "config" in given(strongest):
        (jp_config_dir / "jupyter_server_config.py").write_text(
            f"c.SpotWarp.{setting} = {value(setting, 'config', tmp_path)!r}\n")
    return {"ServerApp": {"jpserver_extensions": {"spotwarp_jupyter.server": True}, "allow_root": True},
            "SpotWarp": {"backup_interval": 0, "heartbeat_interval": 0}}


@pytest.mark.parametrize("server_row", table("server", ("project", "storage", "workspace", "shutdown_grace"), True),
                         indirect=True)
async def test_server(server_row, jp_fetch, jp_serverapp, jp_root_dir, tmp_path):
    setting, strongest = server_row
    if setting == "shutdown_grace":
        await jp_serverapp.extension_manager.start_all_extensions()  # the watchers start with the server
    response = await jp_fetch("spotwarp", "api", "status")
    status = json.loads(response.body)
    shown = {"project": status["project"], "storage": status["storage"], "workspace": status["workspace"],
             "shutdown_grace": next((w.get("grace_s") for w in status["watchers"] if w["name"] == "signals"), None)}
    defaults = {"project": "default", "storage": os.path.expanduser("~/.spotwarp/store"),
                "workspace": str(jp_root_dir.resolve()), "shutdown_grace": 20.0}
    expected = defaults[setting] if strongest == "default" else value(setting, strongest, tmp_path)
    assert shown[setting] == expected


@pytest.mark.process
@pytest.mark.parametrize("server_row", [pytest.param(("shutdown_grace", "config"), id="bad-variable")], indirect=True)
def test_server_names_a_bad_variable_in_one_line(server_row, jp_configurable_serverapp, jp_server_config,
                                                 monkeypatch):
    monkeypatch.setenv("SPOTWARP_SHUTDOWN_GRACE", "soon")  # beats the good config value, so it is used and refused
    config = {**jp_server_config, "ServerApp": {**jp_server_config["ServerApp"],
                                                "reraise_server_extension_failures": True}}
    with pytest.raises(ConfigError) as info:
        jp_configurable_serverapp(config=config)
    assert str(info.value) == ("SPOTWARP_SHUTDOWN_GRACE='soon' cannot be used: bad duration 'soon': "
                               "write it like 30s, 5m or 1h")


# -- the magic ----------------------------------------------------------------------------------------------------
MAGIC_FLAGS = {"project": "--project", "storage": "--storage", "every": "--every"}


def magic_kernel(tmp_path: Path, setting: str, strongest: str, monkeypatch: pytest.MonkeyPatch) -> Kernel:
    """A kernel with the row's variable, and `c.SpotWarpMagics.*` in its profile's ipython_kernel_config.py."""
    clean_environment(monkeypatch)
    profile = tmp_path / "ipython" / "profile_default"
    profile.mkdir(parents=True)
    env = {"HOME": str(tmp_path / "home"), "IPYTHONDIR": str(tmp_path / "ipython")}
    if "env" in given(strongest):
        env[VARIABLES[setting]] = value(setting, "env", tmp_path)
    if "config" in given(strongest):
        (profile / "ipython_kernel_config.py").write_text(
            f"c.SpotWarpMagics.{setting} = {value(setting, 'config', tmp_path)!r}\n")
    return Kernel(tmp_path / "host", env)


@pytest.mark.process
@pytest.mark.parametrize("setting, strongest", table("magic", ("project", "storage", "every")))
def test_magic(tmp_path: Path, setting: str, strongest: str, monkeypatch):
    kernel = magic_kernel(tmp_path, setting, strongest, monkeypatch)
    try:
        flag = f" {MAGIC_FLAGS[setting]} {value(setting, 'flag', tmp_path)}" if strongest == "flag" else ""
        out = kernel.run(f"%load_ext spotwarp\n%spotwarp policy{flag}")
    finally:
        kernel.close()
    policy = re.search(r"SpotWarp policy: .*every ([^,]+),", out)
    where = re.search(r"project (\S+) · storage (\S+)", out)
    assert policy and where, out
    shown = {"every": policy.group(1), "project": where.group(1), "storage": where.group(2)}
    defaults = {"project": "default", "storage": str(tmp_path / "home" / ".spotwarp" / "store"), "every": "5m"}
    expected = defaults[setting] if strongest == "default" else value(setting, strongest, tmp_path)
    assert shown[setting] == expected


@pytest.mark.process
def test_magic_names_a_bad_variable_in_one_line(tmp_path: Path, monkeypatch):
    kernel = magic_kernel(tmp_path, "every", "config", monkeypatch)  # a good config value under a bad variable
    try:
        kernel.run("import os; os.environ['SPOTWARP_EVERY'] = 'soon'")
        ename, evalue, _out = kernel.run_error("%load_ext spotwarp")
        assert kernel.run_error("%spotwarp")[0] == "UsageError"  # nothing was loaded
    finally:
        kernel.close()
    assert ename == "UsageError"
    assert evalue == "SPOTWARP_EVERY='soon' cannot be used: bad duration 'soon': write it like 30s, 5m or 1h"


# -- every declared setting ---------------------------------------------------------------------------------------
BAD = {"storage_options": "{not json", "watchers": "signals,vast", "after_cell": "maybe", "autosnapshot": "maybe",
       "max_var_size": "big", "keep": "some", "project": "a/b", "resume_kernels": "maybe",
       "resume_unsigned": "maybe"}


@pytest.mark.parametrize("name", sorted(n for n, s in SETTINGS.items() if s.parse.__name__ != "_text"))
def test_every_bad_variable_is_named_in_one_line(name: str):
    setting = SETTINGS[name]
    bad = BAD.get(name, "soon")  # durations
    with pytest.raises(ConfigError) as info:
        resolve_setting(name, env={setting.env: bad}, config={name: setting.default_value()})
    assert str(info.value).startswith(f"{setting.env}={bad!r} cannot be used: ") and "\n" not in str(info.value)
    # and each layer stands in its place: flag > variable > config > default
    good = {"storage_options": '{"anon": true}', "watchers": "aws", "after_cell": "false", "autosnapshot": "false",
            "max_var_size": "1GB", "keep": "3", "project": "p", "restore_on_start": "never",
            "resume_kernels": "false", "resume_unsigned": "true"}.get(name, "7s")
    from_env = resolve_setting(name, env={setting.env: good})
    assert resolve_setting(name, env={setting.env: good}, config={name: setting.default_value()}) == from_env
    assert resolve_setting(name, flags={name: setting.default_value()}, env={setting.env: good}) \
        == setting.default_value() != from_env
    assert resolve_setting(name, env={}, config={name: from_env}) == from_env
    assert resolve_setting(name, env={}) == setting.default_value()


@pytest.mark.parametrize("name", LOCATION + SERVER)
def test_every_server_setting_is_a_config_trait_naming_its_variable(name: str):
    assert getattr(SpotWarp(), name) is None  # the config layer: None means no config file set it
    help = SpotWarp.class_traits(config=True)[name].help
    assert help.endswith(f"). ${SETTINGS[name].env} overrides it; a --SpotWarp.* flag overrides both.")
