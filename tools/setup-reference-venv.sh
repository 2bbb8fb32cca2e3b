#!/usr/bin/env bash
# Creates .venv-ref with the official PyTorch package (qwen-tts 0.1.1) for the fixture
# regeneration test and the benchmark's reference side. Prints the venv's python.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${VOCABLE_REFERENCE_VENV:-.venv-ref}"
# a venv whose making stopped half-way (python3-venv missing, an interrupt) has a python but no
# pip: made again, not used
if ! "$venv/bin/python" -c "import pip" 2>/dev/null; then
    python3 -m venv --clear "$venv"
fi
"$venv/bin/python" -m pip install -q -r tools/fixtures/requirements.txt
"$venv/bin/python" -m pip install -q --no-deps qwen-tts==0.1.1
echo "$(cd "$venv/bin" && pwd)/python"
