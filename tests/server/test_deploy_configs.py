"""The deployment files in deploy/ and the snippets of docs/jupyterhub.md: loaded as JupyterHub, Jupyter,
IPython and Helm would load them, and checked against the classes and SpotWarp code they configure.
(tests/e2e/test_jupyterhub.py runs a real hub with deploy/jupyterhub_config.py and jupyter_server_config.py.)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from traitlets.config import Config

from spotwarp_jupyter.engine import Settings
from spotwarp_jupyter.engine.settings import resolve_setting

from hub_configs import load, spawner_environment

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
GUIDE = ROOT / "docs" / "jupyterhub.md"


def assert_known_traits(config: Config, classes: dict[str, type]) -> None:
    """Every section names a class we know, and every key a configurable trait of it (no typos)."""
    for section, values in config.items():
        assert section in classes, f"unexpected config section {section}"
        traits = classes[section].class_traits(config=True)
        for key in values:
            assert key in traits, f"{section}.{key} is not a configurable trait of {classes[section].__name__}"


def kubespawner_expand(template: str, username: str, servername: str = "") -> str:
    """What KubeSpawner does to every string of singleuser.extraEnv before the pod sees it (str.format)."""
    return template.format(username=username, servername=servername, unescaped_username=username,
                           user_server=username, safe_username=username, userid=1)


# -- jupyterhub_config.py --------------------------------------------------------------------------
def test_jupyterhub_config_gives_every_user_their_own_prefix(monkeypatch):
    from jupyterhub.app import JupyterHub
    from jupyterhub.spawner import Spawner

    config = load("jupyterhub_config.py", monkeypatch=monkeypatch)
    assert_known_traits(config, {"Spawner": Spawner, "JupyterHub": JupyterHub})
    env = spawner_environment(config)
    assert env["SPOTWARP_STORAGE"] == "s3://my-team-bucket/spotwarp/{username}/{server_name}"
    assert env["SPOTWARP_RESTORE_ON_START"] == "auto" and env["SPOTWARP_BACKUP_INTERVAL"] == "2m"
    assert "SPOTWARP_STORAGE_OPTIONS" not in env and "SPOTWARP_KEY" not in env  # nothing the hub does not have
    assert config.Spawner.http_timeout >= 120 and config.Spawner.start_timeout >= config.Spawner.http_timeout
    assert config.Spawner.disable_user_config is True
    # a local spawner stops a server with SIGINT, then SIGTERM after `interrupt_timeout` (10 s by default)
    from jupyterhub.spawner import LocalProcessSpawner
    shutdown_grace = resolve_setting("shutdown_grace", env={"SPOTWARP_SHUTDOWN_GRACE": env["SPOTWARP_SHUTDOWN_GRACE"]})
    assert shutdown_grace <= LocalProcessSpawner.interrupt_timeout.default_value
    # what each single-user server makes of it (JupyterHub's base Spawner passes the string unchanged)
    for user, server, expected in (("alice", "", "alice/default"), ("bob", "gpu", "bob/gpu")):
        settings = Settings.resolve(env={**env, "JUPYTERHUB_USER": user, "JUPYTERHUB_SERVER_NAME": server})
        assert settings.storage == f"s3://my-team-bucket/spotwarp/{expected}"


def test_jupyterhub_config_takes_storage_and_secrets_from_the_hubs_environment(monkeypatch):
    config = load("jupyterhub_config.py", monkeypatch=monkeypatch, env={
        "SPOTWARP_HUB_STORAGE": "gs://b/sw/{username}/{server_name}",
        "SPOTWARP_STORAGE_OPTIONS": '{"project": "p"}', "SPOTWARP_KEY": "k" * 32, "UNRELATED_SECRET": "x"})
    env = spawner_environment(config)
    assert env["SPOTWARP_STORAGE"] == "gs://b/sw/{username}/{server_name}"
    assert env["SPOTWARP_STORAGE_OPTIONS"] == '{"project": "p"}'
    assert callable(env["SPOTWARP_KEY"])  # each user's own key, derived from the hub's (tests/server/test_hub_keys.py)
    assert "UNRELATED_SECRET" not in env  # only the names listed are passed on
    config = load("jupyterhub_config.py", monkeypatch=monkeypatch, env={
        "SPOTWARP_HUB_PASS_ENV": "AWS_ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID": "AKIA", "SPOTWARP_KEY": "k"})
    env = spawner_environment(config)
    assert env["AWS_ACCESS_KEY_ID"] == "AKIA" and env["SPOTWARP_KEY"] != "k"


# -- the single-user image's configs ---------------------------------------------------------------
def test_jupyter_server_config_names_real_classes():
    from jupyter_server.auth.authorizer import Authorizer
    from jupyter_server.serverapp import ServerApp
    from traitlets.utils.importstring import import_item

    from spotwarp_jupyter.server.app import SpotWarp
    from spotwarp_jupyter.server.hub import RESTORE_MODES

    config = load("jupyter_server_config.py")
    assert_known_traits(config, {"ServerApp": ServerApp, "SpotWarp": SpotWarp})
    assert issubclass(import_item(config.ServerApp.authorizer_class), Authorizer)
    assert config.SpotWarp.restore_on_start in RESTORE_MODES
    assert SpotWarp(config=config).restore_on_start == config.SpotWarp.restore_on_start


def test_ipython_configs_point_at_the_spotwarp_module():
    import importlib

    from IPython.core.magic import MagicsManager
    from IPython.core.shellapp import InteractiveShellApp

    lazy = load("ipython_config.py")
    assert_known_traits(lazy, {"MagicsManager": MagicsManager})
    assert lazy.MagicsManager.lazy_magics == {"spotwarp": "spotwarp"}
    kernel = load("ipython_kernel_config.py")
    assert_known_traits(kernel, {"InteractiveShellApp": InteractiveShellApp})
    assert kernel.InteractiveShellApp.extensions == ["spotwarp"]
    module = importlib.import_module(lazy.MagicsManager.lazy_magics["spotwarp"])
    assert callable(module.load_ipython_extension) and callable(module.unload_ipython_extension)


def _profile(tmp_path: Path, *files: str) -> dict[str, str]:
    """An IPYTHONDIR whose default profile holds deploy's files (in an image: /etc/ipython)."""
    profile = tmp_path / "ipython" / "profile_default"
    profile.mkdir(parents=True)
    for name in files:
        shutil.copy(DEPLOY / name, profile / name)
    return {"IPYTHONDIR": str(tmp_path / "ipython")}


LOADED = "'spotwarp' in get_ipython().extension_manager.loaded"


def test_lazy_magic_loads_spotwarp_on_first_use(start_kernel, tmp_path):
    kernel = start_kernel("host", **_profile(tmp_path, "ipython_config.py"))
    assert kernel.value(LOADED) is False  # nothing loaded until a notebook asks
    out = kernel.run("%spotwarp status")
    assert "SpotWarp: project proj" in out and "storage" in out
    assert kernel.value(LOADED) is True
    kernel.run("weights = [0.5, 0.25]")
    assert "SpotWarp snapshot" in kernel.run("%spotwarp snapshot -m lazy")
    kernel.run("del weights")
    kernel.run("%spotwarp restore")
    assert kernel.value("weights") == [0.5, 0.25]


def test_kernel_config_protects_every_notebook_from_the_start(start_kernel, tmp_path):
    kernel = start_kernel("host", **_profile(tmp_path, "ipython_config.py", "ipython_kernel_config.py"))
    assert kernel.value(LOADED) is True
    assert kernel.value("__import__('spotwarp_jupyter.kernel.session', fromlist=['x']).current().policy.enabled") is True


# -- values.yaml (zero-to-jupyterhub) --------------------------------------------------------------
@pytest.fixture(scope="module")
def values() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "values.yaml").read_text())


def test_values_storage_gets_past_kubespawner_and_is_per_user(values):
    extra_env = values["singleuser"]["extraEnv"]
    storage = kubespawner_expand(extra_env["SPOTWARP_STORAGE"], "alice")
    assert storage == "s3://my-team-bucket/spotwarp/{username}/{server_name}"
    settings = Settings.resolve(env={"SPOTWARP_STORAGE": storage, "JUPYTERHUB_USER": "alice",
                                     "JUPYTERHUB_SERVER_NAME": ""})
    assert settings.storage == "s3://my-team-bucket/spotwarp/alice/default"
    with pytest.raises(KeyError):  # why the guide doubles the braces: KubeSpawner knows no {server_name}
        kubespawner_expand("s3://b/{username}/{server_name}", "alice")
    assert extra_env["SPOTWARP_RESTORE_ON_START"] == "auto"


def test_values_credentials_come_from_per_user_secrets(values):
    extra_env = values["singleuser"]["extraEnv"]
    secrets = {name: value["valueFrom"]["secretKeyRef"] for name, value in extra_env.items() if isinstance(value, dict)}
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "SPOTWARP_KEY"} <= set(secrets)
    for name, ref in secrets.items():
        assert set(ref) == {"name", "key"}, name
        assert kubespawner_expand(ref["name"], "alice") == "spotwarp-alice"
    plain = [v for v in extra_env.values() if isinstance(v, str)]
    assert not [v for v in plain if re.search(r"(?i)secret|AKIA", v)]  # no secret written in the file


@pytest.mark.process
def test_values_spot_pool_grace_period_and_prestop_hook(values):
    single = values["singleuser"]
    selector = single["nodeSelector"]
    assert any(t["key"] in selector and t["value"] == selector[t["key"]] and t["effect"] == "NoSchedule"
               for t in single["extraTolerations"])  # the pods tolerate the spot pool's taint they select
    grace = single["extraPodConfig"]["terminationGracePeriodSeconds"]
    command = single["lifecycleHooks"]["preStop"]["exec"]["command"]
    timeout = float(command[command.index("--timeout") + 1])
    assert 0 < timeout < grace  # the hook leaves time for the final snapshot after SIGTERM
    # the hook runs first, SIGTERM after it: the server's grace fits in what is left of the pod's
    shutdown_grace = resolve_setting("shutdown_grace", env=single["extraEnv"])
    assert timeout + shutdown_grace <= grace
    assert values["hub"]["config"]["KubeSpawner"]["http_timeout"] >= 120
    assert single["startTimeout"] >= values["hub"]["config"]["KubeSpawner"]["http_timeout"]
    # the hook's command exists and fails in one clear line outside a hub pod
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTERHUB_")}
    done = subprocess.run([sys.executable, *command[1:]], env=env, capture_output=True, text=True, timeout=60)
    assert command[0] == "python" and done.returncode == 1
    assert done.stderr.strip() == ("spotwarp prestop: not in a JupyterHub single-user server: "
                                   "JUPYTERHUB_SERVICE_URL, JUPYTERHUB_API_TOKEN not set")


# -- the guide -------------------------------------------------------------------------------------
def _blocks(language: str) -> list[str]:
    """The guide's fenced blocks of `language`, dedented (some sit in list items)."""
    found = re.findall(rf"^([ \t]*)```{language}\n(.*?)^\1```", GUIDE.read_text(), flags=re.S | re.M)
    return [textwrap.dedent(body) for _indent, body in found]


def _is_subset(part: Any, whole: Any) -> bool:
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(k in whole and _is_subset(v, whole[k]) for k, v in part.items())
    return part == whole


def test_guide_yaml_snippets_are_parts_of_deploy_values(values):
    snippets = _blocks("yaml")
    assert len(snippets) >= 3
    for snippet in snippets:
        assert _is_subset(yaml.safe_load(snippet), values), snippet


def test_guide_python_snippets_are_the_deploy_files(monkeypatch):
    snippets = _blocks("python")
    assert snippets
    deploy_lines = {line.strip() for f in DEPLOY.glob("*.py") for line in f.read_text().splitlines()}
    for snippet in snippets:
        compile(snippet, "docs/jupyterhub.md", "exec")
        code = [ln.strip() for ln in snippet.splitlines() if ln.strip() and not ln.strip().startswith("#")]
        missing = [ln for ln in code if ln not in deploy_lines]
        assert not missing, f"guide lines not in deploy/*.py: {missing}"


@pytest.mark.process
def test_the_prestop_hook_gives_up_within_its_timeout_on_a_server_that_trickles(values):
    """The hook's --timeout bounds the whole call: a server that answers a byte at a time never holds the pod's
    grace period past it (the final snapshot after SIGTERM needs the rest)."""
    import http.server
    import threading

    released = threading.Event()

    class Trickle(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers["Content-Length"]))
            body = b" " * 200 + b'{"id": "late", "files": 0, "notebooks": []}'
            self.send_response(201)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            for i in range(len(body)):  # each byte well within the socket timeout, the whole far past it
                self.wfile.write(body[i:i + 1])
                self.wfile.flush()
                if released.wait(0.2):
                    return

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        command = values["singleuser"]["lifecycleHooks"]["preStop"]["exec"]["command"]
        argv = [sys.executable, *command[1:command.index("--timeout")], "--timeout", "2"]
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("JUPYTERHUB_")},
               "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{server.server_address[1]}/user/alice/",
               "JUPYTERHUB_API_TOKEN": "token"}
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    finally:
        released.set()
        server.shutdown()
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip() == "spotwarp prestop: the server did not answer within 2 s", done.stderr
