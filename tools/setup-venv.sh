#!/usr/bin/env bash
# Creates .venv (if needed) and installs Vocable into it, built from this checkout.
# Usage: source-free; prints nothing but pip's errors. VOCABLE_VENV overrides the location.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${VOCABLE_VENV:-.venv}"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --upgrade pip
# editable, so the tests see the working tree; the native module is built by scikit-build-core
"$venv/bin/python" -m pip install -q -e ".[test]" "$@"
