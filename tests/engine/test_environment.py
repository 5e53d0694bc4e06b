"""Environment facts in snapshots: secrets never reach storage; a restore says when versions differ."""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import pytest

from spotwarp_jupyter.engine import SnapshotEngine
from spotwarp_jupyter.engine.manifests.environment import collect_facts, package_versions, redacted_environment
from spotwarp_jupyter.engine.variables.capture import capture_namespace
from spotwarp_jupyter.engine.variables.save import persist_image

from engines import make_engine

SECRET = "s3cr3t-value-that-must-never-be-stored"



def _every_stored_byte(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


@pytest.mark.parametrize("name", ["AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "DB_PASSWORD", "GOOGLE_APPLICATION_CREDENTIALS",
                                  "WANDB_API_KEY", "my_private_thing"])
def test_secret_looking_variables_are_redacted(name):
    env = redacted_environment({name: SECRET, "PATH": "/usr/bin"})
    assert env[name] == "<redacted>"
    assert env["PATH"] == "/usr/bin"


def test_password_inside_a_url_is_redacted():
    env = redacted_environment({"DATABASE_URL": f"postgres://user:{SECRET}@db.internal:5432/x"})
    assert SECRET not in env["DATABASE_URL"]
    assert env["DATABASE_URL"].startswith("postgres://user:")


def test_a_secret_never_reaches_storage(engine, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("SPOTWARP_TEST_API_TOKEN", SECRET)
    monkeypatch.setenv("SPOTWARP_TEST_URL", f"https://alice:{SECRET}@example.invalid/repo")
    manifest = engine.snapshot_kernel({"x": np.arange(10)})
    assert manifest.env["env"]["SPOTWARP_TEST_API_TOKEN"] == "<redacted>"
    stored = _every_stored_byte(tmp_path / "store")
    assert stored, "the snapshot wrote something"
    assert SECRET.encode() not in stored


def test_facts_name_the_machine_and_packages():
    facts = collect_facts()
    assert facts["python"] == platform.python_version()
    assert facts["hostname"]
    assert "numpy" in facts["packages"] and "torch" in facts["packages"]
    assert isinstance(facts["gpus"], list)


def _snapshot_from_other_host(engine: SnapshotEngine, packages: dict[str, str], python: str | None = None) -> None:
    """Commit a snapshot whose facts say it was made where these package versions were installed."""
    image = capture_namespace({"x": np.arange(3)})
    kernel, objects, _stats = persist_image(engine.store, image)
    manifest = engine.new_manifest("kernel", kernels={"default": kernel}, objects=objects)
    manifest.env["packages"].update(packages)
    if python:
        manifest.env["python"] = python
    engine.commit_manifest(manifest)


def test_restore_warns_when_package_versions_differ(engine):
    installed = package_versions()["numpy"]
    _snapshot_from_other_host(engine, {"numpy": "0.0.1"}, python="3.0.0")
    ns: dict = {}
    _manifest, result = engine.restore_kernel("latest", ns)
    assert f"numpy 0.0.1 made this snapshot; {installed} is installed here" in result.warnings
    assert any(line.startswith("Python 3.0.0 made this snapshot") for line in result.warnings)
    assert list(ns["x"]) == [0, 1, 2]  # a warning, not a failure


def test_restore_of_same_versions_is_quiet(engine):
    engine.snapshot_kernel({"x": 1})
    _manifest, result = engine.restore_kernel("latest", {})
    assert not any("made this snapshot" in line for line in result.warnings)


def test_kernel_prints_the_version_warning(start_kernel, store_url):
    engine = make_engine(store_url)
    _snapshot_from_other_host(engine, {"numpy": "0.0.1"})
    kernel = start_kernel("host-b")
    out = kernel.run("%load_ext spotwarp\n%spotwarp restore latest")
    assert "warning: numpy 0.0.1 made this snapshot" in out


def test_installed_versions_are_what_importlib_metadata_says():
    """The restore's quick look-up (METADATA's headers only) agrees with importlib.metadata for every
    installed distribution, and knows a missing one."""
    from importlib import metadata

    from spotwarp_jupyter.engine.manifests.environment import installed_version

    names = {d.metadata["Name"] for d in metadata.distributions()}
    assert len(names) > 20
    assert {n: installed_version(n) for n in names} == {n: metadata.version(n) for n in names}
    assert installed_version("no-such-distribution-anywhere") is None
