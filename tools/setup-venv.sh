#!/usr/bin/env bash
# Creates .venv (if needed) and installs Vocable into it, built from this checkout.
# Usage: source-free; prints nothing but pip's errors. VOCABLE_VENV overrides the location.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${VOCABLE_VENV:-.venv}"
# a venv whose making stopped half-way (python3-venv missing, an interrupt) has a python but no
# pip: made again, not used
if ! "$venv/bin/python" -c "import pip" 2>/dev/null; then
    python3 -m venv --clear "$venv"
fi
"$venv/bin/python" -m pip install -q --upgrade pip
# editable, so the tests see the working tree; the native module is built by scikit-build-core
"$venv/bin/python" -m pip install -q -e ".[test]" "$@"
# the desktop app's Qt needs a few system libraries (.ci/run installs them on Debian); say which
# are missing instead of failing later inside a test
if ! QT_QPA_PLATFORM=offscreen "$venv/bin/python" -c "from PySide6 import QtWidgets" 2>/dev/null; then
    echo "warning: PySide6 cannot load (missing system libraries?); on Debian or Ubuntu:" \
         "apt install libegl1 libgl1 libfontconfig1 libglib2.0-0 libxkbcommon0 libdbus-1-3" >&2
fi
