"""Secrets in a kernel's environment never reach the store: redacted by name and by the shape of the value."""

from __future__ import annotations

from pathlib import Path

import pytest

from spotwarp_jupyter.engine.manifests.environment import redacted_environment

# every value below is a made-up secret; each marked part must appear nowhere in the store
AZURE_KEY = "Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2RlZmdoaWprbG1ub3A/cXJzdHV2d3h5ejAxMjM0NTY3ODk+QUJD=="
GITHUB_PAT = "ghp_R4nd0mT0k3nTh4tMustN3v3rB3St0r3d12"
GH_PAT = "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCDEF"
SLACK_PATH = "T0001ABCD/B0002EFGH/XyZsEcReTwEbHoOkPaRt42"
SENTRY_KEY = "8f3c2d1e0b9a47c6a5d4e3f2a1b0c9d8"
SLASH_PASSWORD = "pa/ss/w0rd-w1th-sl4shes"
URL_TOKEN = "tok3nInTheUserPartOfAUrl9876"
NEUTRAL_CONN = "An0th3rS3cr3tP4ssw0rdV4lue"
ENTROPY_ONLY = "q8Zr2LmX0vT7wKp4NbY6cH1sJ9dF3gA5"

SECRET_ENV = {
    "AZURE_STORAGE_CONNECTION_STRING": "DefaultEndpointsProtocol=https;AccountName=acct;"
                                       f"AccountKey={AZURE_KEY};EndpointSuffix=core.windows.net",
    "GITHUB_PAT": GITHUB_PAT,
    "GH_PAT": GH_PAT,
    "SLACK_WEBHOOK_URL": f"https://hooks.slack.com/services/{SLACK_PATH}",
    "SENTRY_DSN": f"https://{SENTRY_KEY}@o123456.ingest.sentry.io/4504",
    "DATABASE_URL": f"postgresql://app:{SLASH_PASSWORD}@db.internal:5432/prod",
    "GIT_REMOTE": f"https://{URL_TOKEN}@github.com/acme/private.git",
    # neutral names: only the value's shape gives these away
    "MY_SETTING": ENTROPY_ONLY,
    "REPORTS_DB": f"Server=tcp:db.example.net,1433;Database=r;User ID=r;Password={NEUTRAL_CONN};",
    "NOTIFY_TO": "https://outlook.office.com/webhook/0a1b2c3d-secret-hook-path/IncomingWebhook/xyz",
}
SECRET_PARTS = [AZURE_KEY, GITHUB_PAT, GH_PAT, SLACK_PATH, SENTRY_KEY, SLASH_PASSWORD, URL_TOKEN, NEUTRAL_CONN,
                ENTROPY_ONLY, "0a1b2c3d-secret-hook-path"]
HARMLESS = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/home/alice", "LANG": "C.UTF-8", "SHELL": "/bin/bash",
            "OMP_NUM_THREADS": "4", "CUDA_VISIBLE_DEVICES": "0,1", "PROXY_URL": "http://proxy.internal:3128"}


def _every_stored_byte(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


@pytest.mark.parametrize("name", sorted(SECRET_ENV))
def test_each_secret_is_redacted(name):
    env = redacted_environment({name: SECRET_ENV[name]})
    for part in SECRET_PARTS:
        assert part not in env[name], (name, env[name])


def test_harmless_variables_are_kept_as_they_are():
    assert redacted_environment(HARMLESS) == HARMLESS


def test_url_keeps_its_host_without_its_credentials():
    env = redacted_environment({"DATABASE_URL": SECRET_ENV["DATABASE_URL"], "GIT_REMOTE": SECRET_ENV["GIT_REMOTE"]})
    assert env["DATABASE_URL"] == "postgresql://app:<redacted>@db.internal:5432/prod"
    assert env["GIT_REMOTE"] == "https://<redacted>@github.com/acme/private.git"


def test_secrets_set_on_a_real_kernel_never_reach_the_store(start_kernel, store_url):
    kernel = start_kernel("host", **SECRET_ENV)
    kernel.run("%load_ext spotwarp\nweights = [1.0, 2.0]\n%spotwarp snapshot -m 'with secrets around'")
    assert kernel.value("__import__('os').environ['GITHUB_PAT']") == GITHUB_PAT  # the kernel really had them
    stored = _every_stored_byte(Path(store_url))
    assert b"with secrets around" in stored  # the manifest is there, in the clear
    for part in SECRET_PARTS:
        assert part.encode() not in stored, part
    assert b"GITHUB_PAT" in stored and b"<redacted>" in stored  # names are kept, values are not
