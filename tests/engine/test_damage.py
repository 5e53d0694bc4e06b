"""Damaged storage: verify names the bad object and exits non-zero; restore refuses instead of lying."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from spotwarp_jupyter.engine import DamagedObjectError, ManifestError

from engines import make_engine


def _cli(*args: str, store: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spotwarp_jupyter.cli", *args, "--storage", store],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def snapped(store_url):
    engine = make_engine(store_url, resolved=False)
    ns = {"weights": np.arange(1_000_000, dtype=np.float64), "note": "hello", "table": {"a": [1, 2, 3]}}
    manifest = engine.snapshot_kernel(ns)
    return engine, manifest, ns


def _object_files(store_url: str) -> list[Path]:
    return sorted(p for p in Path(store_url, "proj", "objects").rglob("*") if p.is_file())


def _flip(path: Path, offset: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[min(offset, len(data) - 1)] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.process
def test_flipped_byte_is_found_by_verify_and_refused_by_restore(snapped, store_url):
    engine, manifest, ns = snapped
    biggest = max(_object_files(store_url), key=lambda p: p.stat().st_size)
    _flip(biggest, 4096)

    result = _cli("verify", "--project-id", "proj", store=store_url)
    assert result.returncode == 1
    assert biggest.name in result.stdout and "DAMAGED" in result.stdout

    as_json = json.loads(_cli("verify", "--project-id", "proj", "--json", store=store_url).stdout)
    assert as_json["ok"] is False and any(biggest.name in p for p in as_json["problems"])

    target = {"weights": "keep me"}
    with pytest.raises(DamagedObjectError, match=biggest.name):
        engine.restore_kernel("latest", target)
    assert target == {"weights": "keep me"}, "a failed restore changed the namespace"


def test_missing_object_is_named(snapped, store_url):
    engine, manifest, _ = snapped
    victim = _object_files(store_url)[0]
    victim.unlink()
    report = make_engine(store_url, resolved=False).verify()
    assert not report.ok and any(victim.name in p and "missing" in p for p in report.problems)


@pytest.mark.process
def test_truncated_manifest_is_not_listed_and_is_reported(snapped, store_url):
    engine, manifest, _ = snapped
    path = Path(store_url, "proj", "snapshots", manifest.name)
    path.write_bytes(path.read_bytes()[:-40])
    fresh = make_engine(store_url, resolved=False)
    assert fresh.manifests() == []
    with pytest.raises(ManifestError, match="not valid JSON|checksum"):
        fresh.get(manifest.id)
    result = _cli("verify", "--project-id", "proj", store=store_url)
    assert result.returncode == 1 and manifest.name in result.stdout


def test_edited_manifest_fails_its_checksum(snapped, store_url):
    engine, manifest, _ = snapped
    path = Path(store_url, "proj", "snapshots", manifest.name)
    doc = json.loads(path.read_text())
    doc["host"] = "someone-else"
    path.write_text(json.dumps(doc))
    fresh = make_engine(store_url, resolved=False)
    with pytest.raises(ManifestError, match="checksum"):
        fresh.get(manifest.id)


@pytest.mark.process
def test_clean_store_verifies(snapped, store_url):
    result = _cli("verify", "--project-id", "proj", store=store_url)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok: 1 snapshots")
