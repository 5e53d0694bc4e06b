"""The SkyPilot provider, offline: real SkyPilot (0.14.1) with small catalog fixtures and a dryrun.

SkyPilot runs here under its own HOME (catalogs from tests/fixtures/sky_catalogs, no credential but
a dummy Mithril config file, which Mithril's check accepts without a call) and its own API server
on a free port, started by SkyPilot's SDK on first use and stopped at the end. Nothing reaches the
network: a catalog file without its .md5 file is never re-downloaded, usage collection is off, and
clouds are limited to the four in the fixtures. RunPod, Vast and AWS stay disabled (their SDKs or
a network check are missing), so a launch there fails in SkyPilot just as a cloud without
credentials does.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from spotwarp_jupyter import __version__
from spotwarp_jupyter.failover.provider import FAILED, GONE, PENDING, LaunchSpec, Offer

from lab_server import free_port

HERE = Path(__file__).parents[1]  # tests/
CATALOGS = HERE / "fixtures" / "sky_catalogs"
GOLDEN = HERE / "golden" / "skypilot_task.yaml"
REPO = HERE.parent

SPEC = LaunchSpec(
    project_id="Demo_Project",
    storage="s3://bucket/sw",
    gpus="A100:1",
    clouds=("runpod", "vast", "aws", "mithril"),
    env={"SPOTWARP_KEY": "not-a-real-secret-4711"},
)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _queue_manager_port(api_port: int) -> int:
    """The port SkyPilot's API server gives its request-queue manager. It moves with the API server's port
    (`sky.server.requests.queues.mp_queue.get_queue_manager_port`) into 50000-59999, a range where the
    kernel also picks the local ports of outgoing connections."""
    return 50000 + (50011 - 50000 + api_port - 46580) % 10000


def _bindable(port: int) -> bool:
    """Whether a server could bind 127.0.0.1:`port` now, as SkyPilot checks it (address reuse on)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _api_server_port() -> int:
    """A free port for SkyPilot's API server whose queue manager's port is free too: a full test run once
    lost three tests to an outgoing connection that held the queue manager's port."""
    for _ in range(100):
        port = free_port()
        if _bindable(_queue_manager_port(port)):
            return port
    raise RuntimeError("no port pair free for SkyPilot's API server and its queue manager")


class RecordingProxy:
    """An HTTP(S) proxy that forwards nothing: it records the first line of every request and hangs up."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    self.seen.append(conn.recv(1024).split(b"\r\n", 1)[0].decode(errors="replace"))
                except OSError:
                    self.seen.append("(no request line)")

    def close(self) -> None:
        self._sock.close()


@pytest.fixture(scope="module")
def sky_home(tmp_path_factory):
    """SkyPilot offline: its own HOME with fixture catalogs, its own API server port; stopped at the end.

    Every HTTP(S) request that is not to 127.0.0.1 goes to a recording proxy that forwards nothing;
    the fixture fails if anything tried (a catalog download, pypi.org, a cloud's API).
    """
    if "sky" in sys.modules:
        pytest.fail("sky was imported before the fixture set HOME: SkyPilot fixes its catalog paths at import")
    home = tmp_path_factory.mktemp("skyhome")
    shutil.copytree(CATALOGS, home / ".sky" / "catalogs" / "v8")
    (home / ".sky" / "config.yaml").write_text("allowed_clouds: [aws, runpod, vast, mithril]\n")
    # The API server asks pypi.org for SkyPilot's latest release unless it asked in the last 24 hours.
    (home / ".sky" / "version_cache.json").write_text(json.dumps({"release_version": None, "cached_at": time.time()}))
    (home / ".config" / "mithril").mkdir(parents=True)
    (home / ".config" / "mithril" / "config.yaml").write_text("api_key: dummy\n")
    proxy = RecordingProxy()
    port = _api_server_port()
    proxy_url = f"http://127.0.0.1:{proxy.port}"
    env = {
        "HOME": str(home),
        "SKYPILOT_API_SERVER_LOCAL_PORT": str(port),
        "SKYPILOT_DISABLE_USAGE_COLLECTION": "1",
        "AWS_EC2_METADATA_DISABLED": "true",  # boto3 must not ask 169.254.169.254 for credentials
        # A dryrun builds SkyPilot's wheel with pip: from the installed setuptools, never from an index.
        "PIP_NO_INDEX": "1",
        "PIP_NO_BUILD_ISOLATION": "0",  # pip reads this negative option inverted: "0" turns isolation off
        **{k: proxy_url for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")},
        **{k: "127.0.0.1,localhost" for k in ("no_proxy", "NO_PROXY")},
    }
    dropped = ["SKYPILOT_API_SERVER_ENDPOINT", "XDG_CONFIG_HOME", "all_proxy", "ALL_PROXY",
               "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
               "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"]  # no AWS credentials but HOME's (none)
    saved = {k: os.environ.get(k) for k in [*env, *dropped]}
    os.environ.update(env)
    for k in dropped:
        os.environ.pop(k, None)
    try:
        yield {"home": home, "port": port}
    finally:
        if "sky" in sys.modules:
            import sky
            from sky.server.requests.queues import mp_queue

            sky.api_stop()  # only the server on this port (SkyPilot matches it by port)
            assert mp_queue.get_queue_manager_port() == _queue_manager_port(port), "SkyPilot moved its queue port"
        deadline = time.monotonic() + 30
        while _port_open(port) and time.monotonic() < deadline:
            time.sleep(0.2)
        proxy.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        assert not _port_open(port), f"SkyPilot's API server still listens on {port}"
        assert proxy.seen == [], f"SkyPilot tried to reach the network: {proxy.seen}"


@pytest.fixture(autouse=True)
def server_log_after_each_test(sky_home):
    """The end of SkyPilot's API server log, printed after each test: pytest shows it when the test fails
    (a server that died while starting says why only there)."""
    yield
    log = sky_home["home"] / ".sky" / "api_server" / "server.log"
    if log.exists():
        tail = log.read_text(errors="replace").splitlines()[-40:]
        print(f"--- {log}, last {len(tail)} lines ---", *tail, sep="\n")


@pytest.fixture
def provider(sky_home):
    from spotwarp_jupyter.failover.providers.skypilot import SkyPilotProvider

    return SkyPilotProvider


VAST_OFFER = Offer(
    provider="skypilot", cloud="vast", region="US, CA", instance_type="1x-A100_SXM4-32-131072",
    accelerators="A100:1", price_per_hour=0.72,
)
AWS_OFFER = Offer(
    provider="skypilot", cloud="aws", region="us-west-2", instance_type="fixture.a100x1",
    accelerators="A100:1", price_per_hour=1.40,
)


def _task_yaml(provider_cls, options=None, offer=VAST_OFFER) -> str:
    task = provider_cls(options).build_task(SPEC, offer, "c-1", 3)
    # use_user_specified_yaml=True: the config with secrets redacted, as SkyPilot shows it.
    return yaml.safe_dump(task.to_yaml_config(use_user_specified_yaml=True), sort_keys=True)


def test_task_matches_golden_yaml(provider):
    """The task for one candidate: start command, pinned spot offer, port, secrets redacted, setup (which
    installs exactly this version of spotwarp-jupyter and checks it got it; the golden file says VERSION)."""
    text = _task_yaml(provider).replace(__version__, "VERSION")
    if os.environ.get("SPOTWARP_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()
    assert "not-a-real-secret-4711" not in text
    task = provider().build_task(SPEC, VAST_OFFER, "c-1", 3)
    secrets = {k: v.get_secret_value() for k, v in task.secrets.items()}  # SkyPilot keeps them as SecretStr
    assert secrets == {"SPOTWARP_KEY": "not-a-real-secret-4711"}  # the candidate still gets it


def test_image_with_spotwarp_and_no_port(provider):
    """An image with SpotWarp preinstalled is pinned; setup installs only when the image lacks spotwarp."""
    config = yaml.safe_load(_task_yaml(provider, {"image_id": "docker:ghcr.io/example/spotwarp:1", "open_port": False}))
    assert config["resources"]["image_id"] == {"US, CA": "docker:ghcr.io/example/spotwarp:1"}  # pinned to the offer's region
    assert "ports" not in config["resources"]
    assert config["setup"].startswith(f"spotwarp --version 2>/dev/null | grep -qxF 'spotwarp {__version__}' || ")


def test_cluster_names_are_valid_for_skypilot(sky_home):
    import sky
    from sky.utils import common_utils

    from spotwarp_jupyter.failover.providers.skypilot import cluster_name

    names = [cluster_name("Demo Project/ü", "cand_1"), cluster_name("p" * 80, "c-2"), cluster_name("p" * 80, "c-3")]
    for name in names:
        common_utils.check_cluster_name_is_valid(name)  # SkyPilot's own rule; raises when invalid
        assert len(name) <= 35
    assert names[0] == "sw-demo-project-cand_1"
    assert names[1] != names[2]  # truncation keeps candidates apart
    assert sky.__version__


@pytest.mark.process
def test_offers_ranked_by_spot_price_and_capped(provider):
    """Catalog offers across clouds, cheapest spot first, one per (cloud, region, instance type), max_price honoured."""
    p = provider({"dryrun_offers": False})
    ranked = [(o.cloud, o.region, o.instance_type, o.price_per_hour) for o in p.offers(SPEC, 10)]
    assert ranked == [
        ("vast", "US, CA", "1x-A100_SXM4-32-131072", 0.72),
        ("vast", "Europe, NL", "1x-A100_SXM4-16-65536", 0.80),
        ("runpod", "CA", "1x_A100_SECURE", 0.89),
        ("runpod", "US", "1x_A100_SECURE", 0.95),
        ("mithril", "us-central1-a", "it_a100x1_fixture", 1.20),
        ("aws", "us-west-2", "fixture.a100x1", 1.40),  # the cheaper of the region's two zones
        ("aws", "us-east-1", "fixture.a100x1", 1.65),
    ]
    capped = LaunchSpec(**{**SPEC.__dict__, "max_price": 0.9})
    assert [o.price_per_hour for o in p.offers(capped, 10)] == [0.72, 0.80, 0.89]
    assert [o.price_per_hour for o in p.offers(SPEC, 2)] == [0.72, 0.80]
    only_aws = LaunchSpec(**{**SPEC.__dict__, "clouds": ("aws",)})
    assert {o.cloud for o in p.offers(only_aws, 10)} == {"aws"}


@pytest.mark.slow  # SkyPilot's API server starts and checks clouds: 30 s to minutes
def test_dryrun_picks_cheapest_feasible_offer(provider):
    """SkyPilot's optimizer (dryrun) confirms offers: disabled clouds drop out, each with one line why."""
    p = provider({"open_port": False})
    offers = p.offers(SPEC, 1)
    assert [(o.cloud, o.instance_type, o.price_per_hour) for o in offers] == [("mithril", "it_a100x1_fixture", 1.20)], "\n".join(p.rejected)
    assert len(p.rejected) == 4  # both vast and both runpod offers, cheaper but not enabled
    for line in p.rejected:
        assert "\n" not in line and "not enabled" in line, line
    assert p.rejected[0] == "vast/US, CA/1x-A100_SXM4-32-131072 $0.72/h: vast is not enabled in SkyPilot (run: sky check vast)"


@pytest.mark.slow  # SkyPilot's API server starts and checks clouds: 30 s to minutes
def test_dryrun_refuses_a_port_the_cloud_cannot_open(provider):
    p = provider()
    mithril = LaunchSpec(**{**SPEC.__dict__, "clouds": ("mithril",)})
    assert p.offers(mithril, 1) == []
    assert len(p.rejected) == 1 and "NotSupportedError" in p.rejected[0] and "\n" not in p.rejected[0]


@pytest.mark.slow  # SkyPilot's API server starts and checks clouds: 30 s to minutes
def test_failed_launch_is_a_failed_candidate(provider):
    """A launch SkyPilot refuses (no credentials for the cloud) polls as FAILED with one line; down is idempotent."""
    p = provider()
    # The race launches each candidate from its own thread.
    with ThreadPoolExecutor(2) as pool:
        handle, other = pool.map(lambda a: p.launch(SPEC, *a), [(AWS_OFFER, "c-2", 4), (VAST_OFFER, "c-3", 4)])
    assert (handle.data["cluster"], other.data["cluster"]) == ("sw-demo_project-c-2", "sw-demo_project-c-3")
    deadline = time.monotonic() + 120
    status, other_status = p.poll(handle), p.poll(other)
    while PENDING in (status.state, other_status.state) and time.monotonic() < deadline:
        time.sleep(0.5)
        status, other_status = p.poll(handle), p.poll(other)
    assert other_status.state == FAILED and "vast which is not enabled" in other_status.message, other_status
    assert status.state == FAILED, status
    assert "\n" not in status.message and "aws which is not enabled" in status.message, status.message
    assert status.message.startswith("ResourcesUnavailableError: ")
    assert p.poll(handle) == status  # stays failed, never raises
    p.down(handle)
    p.down(handle)
    p.down(other)
    assert p.errors == []
    assert p.poll(handle).state == GONE
    assert p.leaks() == []


def test_unknown_option_is_one_line(sky_home):
    from spotwarp_jupyter.engine.errors import SpotWarpError
    from spotwarp_jupyter.failover.providers.skypilot import SkyPilotProvider

    with pytest.raises(SpotWarpError) as e:
        SkyPilotProvider({"imageid": "x"})
    assert "\n" not in str(e.value) and "imageid" in str(e.value) and "image_id" in str(e.value)


def test_options_given_as_text_on_the_command_line(sky_home):
    """`spotwarp launch --provider-option open_port=false` hands text: "false" must not read as yes."""
    from spotwarp_jupyter.engine.errors import SpotWarpError
    from spotwarp_jupyter.failover.providers.skypilot import SkyPilotProvider

    p = SkyPilotProvider({"open_port": "false", "dryrun_offers": "no", "retry_until_up": "true", "idle_minutes": "30"})
    assert (p.open_port, p.dryrun_offers, p.retry_until_up, p.idle_minutes) == (False, False, True, 30)
    for bad in ({"open_port": "maybe"}, {"idle_minutes": "soon"}):
        with pytest.raises(SpotWarpError) as e:
            SkyPilotProvider(bad)
        assert "\n" not in str(e.value) and next(iter(bad)) in str(e.value)


MISSING = """
import sys
{block}
import spotwarp_jupyter.failover, spotwarp_jupyter.failover.provider as pv, spotwarp_jupyter.failover.providers.skypilot as m
assert sys.modules.get("sky") is None, "importing the failover package imported sky"
try:
    m.SkyPilotProvider().offers(pv.LaunchSpec(project_id="p", storage="/s", gpus="A100:1", clouds=("aws",)), 1)
except m.SkyPilotUnavailable as e:
    print(e)
"""


@pytest.mark.process
@pytest.mark.parametrize(
    ("block", "expected"),
    [
        ("sys.modules['sky'] = None  # as if skypilot were not installed", "which is not installed"),
        ("sys.path.insert(0, {old!r})  # an older skypilot's metadata first on the path", "found 0.13.0"),
    ],
)
def test_missing_or_old_skypilot_is_one_line(tmp_path, block, expected):
    old = tmp_path / "old"
    (old / "skypilot-0.13.0.dist-info").mkdir(parents=True)
    (old / "skypilot-0.13.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: skypilot\nVersion: 0.13.0\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(tmp_path)}
    code = MISSING.format(block=block.format(old=str(old)))
    out = subprocess.run([sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1, out.stdout
    assert expected in lines[0] and 'spotwarp-jupyter[failover]"' in lines[0], lines[0]


@pytest.mark.process
def test_setup_installs_exactly_this_version_and_refuses_another_spotwarp(tmp_path):
    """PyPI's `spotwarp` is another project's, with its own `spotwarp` command: setup installs spotwarp-jupyter
    at the launcher's version unless the host has it, then checks the `spotwarp` that `run` calls is that."""
    from spotwarp_jupyter.failover.providers.skypilot import SkyPilotProvider

    setup = SkyPilotProvider().setup_command(SPEC)
    bin_dir, pip_log = tmp_path / "bin", tmp_path / "pip.log"
    bin_dir.mkdir()

    def script(name: str, body: str) -> None:
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)

    script("python3", f'echo "$@" >> {pip_log}')  # pip: records what it was asked to install, installs nothing
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": os.pathsep.join(sys.path)}
    script("spotwarp", 'echo "spotwarp 3.5.2"')  # the other project's command
    out = subprocess.run(["bash", "-c", setup], capture_output=True, text=True, env=env, timeout=60)
    assert pip_log.read_text().split() == ["-m", "pip", "install", "--quiet", f"spotwarp-jupyter[s3]=={__version__}"]
    assert out.returncode == 1 and f"is not SpotWarp {__version__}" in out.stderr and "3.5.2" in out.stderr, out
    pip_log.unlink()
    script("spotwarp", f'exec {sys.executable} -m spotwarp_jupyter.cli "$@"')  # this SpotWarp, already there
    out = subprocess.run(["bash", "-c", setup], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0 and not pip_log.exists(), out


def test_the_run_line_serves_as_root_on_every_interface(provider):
    """The task's `run`, parsed by SpotWarp's own command line: `start` in standby with --allow-root (CUDA images
    run as root, and Jupyter refuses root without it) and `--ServerApp.ip=0.0.0.0` for Jupyter, so the port
    SkyPilot opens reaches JupyterLab (bound to localhost it reaches nothing)."""
    from spotwarp_jupyter.cli import build_parser
    from spotwarp_jupyter.cli.restore import _allow_root

    run = yaml.safe_load(_task_yaml(provider))["run"]
    argv = shlex.split(run)
    assert argv[:2] == ["spotwarp", "start"]
    cut = argv.index("--")
    args = build_parser().parse_args(argv[1:cut])  # strict: an option `start` does not know fails here
    passthrough = argv[cut + 1:]
    assert args.command == "start" and args.candidate_id == "c-1" and args.generation == 3
    assert args.allow_root and _allow_root(args, passthrough)
    assert passthrough == ["--ServerApp.ip=0.0.0.0"]


@pytest.mark.process
@pytest.mark.parametrize("storage", ["LOCAL", "file://LOCAL", "memory://sw", None])
def test_skypilot_refuses_storage_on_this_machine_before_creating_anything(tmp_path, storage):
    """Cloud hosts restore from the project's storage: a folder (or memory) on the launching machine would give
    each one its own empty disk. One line, exit 1, nothing created (the default storage is a local folder too)."""
    folder = tmp_path / "store"
    args = ["--storage", storage.replace("LOCAL", str(folder))] if storage else []
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(tmp_path / "home")}
    env.pop("SPOTWARP_STORAGE", None)
    out = subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", "launch", "--provider", "skypilot",
                          "--project-id", "p", "--allow-empty", *args], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 1, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs storage every host reaches" in lines[0], out.stderr
    assert not folder.exists() and not (tmp_path / "home" / ".spotwarp").exists()
