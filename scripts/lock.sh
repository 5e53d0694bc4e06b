#!/usr/bin/env bash
# Refresh constraints.txt on purpose: resolve the test environment anew in a scratch venv and freeze it.
# Review the diff (s3fs/gcsfs/aiobotocore/botocore move together) before committing it.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q --upgrade pip
"$tmp/venv/bin/pip" install -q -e ".[test,gcs,s3,hub,failover]"
{
    echo "# The test and CI environment, resolved by scripts/lock.sh on $(date -u +%Y-%m-%d); used by scripts/test.sh."
    "$tmp/venv/bin/pip" freeze --exclude-editable | grep -v '^spotwarp' | sed -E 's/^(torch==[0-9.]+)\+cpu$/\1/'
} > constraints.txt
echo "constraints.txt: $(grep -vc '^#' constraints.txt) pins"
