#!/usr/bin/env bash
# Sets up everything the tests need on a fresh machine, then runs every test: jest (the panel),
# pytest (engine, kernels, server, storage emulators, JupyterHub, install checks) and the browser test,
# after ruff and the import-layer contract (lint-imports).
# Python packages come from constraints.txt into a virtual environment (.venv, or $SPOTWARP_VENV);
# system parts (Node.js >= 20, Debian's chromium, rsync) are installed when running as root with apt-get,
# otherwise the script stops with one line saying what to install.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SPOTWARP_VENV:-.venv}
CHP_VERSION=5.3.0  # configurable-http-proxy, JupyterHub's proxy, from npm into the venv

say() { printf 'spotwarp tests: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }
can_apt() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; }
apt_install() { say "installing $* (apt-get)"; apt-get update -qq >/dev/null && apt-get install -y -qq "$@" >/dev/null; }
node_ok() { command -v node >/dev/null && command -v npm >/dev/null \
    && [ "$(node -p 'process.versions.node.split(".")[0]')" -ge 20 ]; }

# constraints.txt pins what the tests ran with; the newest of those needs Python 3.11.5 (soupsieve 4.1.3)
python3 -c 'import sys; sys.exit(sys.version_info < (3, 11, 5))' \
    || die "Python >= 3.11.5 is needed for the versions constraints.txt pins (python3 is $(python3 --version 2>&1)): install it and re-run"
python3 -c 'import venv, ensurepip' 2>/dev/null \
    || { can_apt && apt_install python3-venv; } \
    || die "Python's venv module is missing: install python3-venv and re-run"
if ! node_ok; then
    can_apt && apt_install nodejs npm || true
    node_ok || die "Node.js >= 20 with npm is needed to build and test the panel: install it and re-run"
fi
if ! command -v rsync >/dev/null; then  # SkyPilot provisions through rsync, even in dryrun tests
    can_apt && apt_install rsync || true
    command -v rsync >/dev/null || die "rsync is needed by SkyPilot (the failover provider tests): install it and re-run"
fi
if [ ! -x /usr/bin/chromium ]; then
    can_apt && apt_install chromium || true
    [ -x /usr/bin/chromium ] || die "Debian's chromium (/usr/bin/chromium) is needed for the browser test: apt-get install chromium, then re-run"
fi

[ -x "$VENV/bin/python" ] || { say "creating $VENV"; python3 -m venv "$VENV"; }
VENV=$(cd "$VENV" && pwd)
PY="$VENV/bin/python"
say "installing SpotWarp and the test requirements (constraints.txt)"
"$PY" -m pip install -q -c constraints.txt "pip==26.3"
# editable: builds the panel from labextension/ with jlpm (jupyter-builder) into spotwarp_jupyter/labextension
"$PY" -m pip install -q -c constraints.txt -e ".[test,gcs,s3,hub,failover]"
if [ ! -x "$VENV/node/node_modules/.bin/configurable-http-proxy" ]; then
    say "installing configurable-http-proxy $CHP_VERSION (npm)"
    npm install --silent --no-save --no-package-lock --prefix "$VENV/node" "configurable-http-proxy@$CHP_VERSION" >/dev/null
fi
export PATH="$VENV/bin:$VENV/node/node_modules/.bin:$PATH"

say "ruff (lint) and lint-imports (the import layers of docs/architecture.md)"
"$VENV/bin/ruff" check .
"$VENV/bin/lint-imports"
say "jest (labextension)"
(cd labextension && jlpm test --silent)
say "pytest"
"$PY" -m pytest -q -p no:cacheprovider --durations=15 --ignore=tests/browser
# Playwright's sync API clashes with pytest-jupyter's event loop: the browser test runs on its own.
say "pytest (browser)"
"$PY" -m pytest -q -p no:cacheprovider tests/browser
