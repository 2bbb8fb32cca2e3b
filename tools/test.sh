#!/usr/bin/env bash
# Installs the system packages the tests need (tools/system-packages.sh), sets up .venv, builds
# Vocable, then runs every test: the C/C++ tests (ctest) and the Python
# tests (pytest). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/system-packages.sh test
bash tools/setup-venv.sh
venv="${VOCABLE_VENV:-.venv}"
py="$venv/bin/python"
"$py" -m pip install -q cmake ninja

build=build/native-tests
"$venv/bin/cmake" -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DVOCABLE_BUILD_PYTHON=OFF \
    -DPython_EXECUTABLE="$(cd "$(dirname "$py")" && pwd)/$(basename "$py")" > "$build.log" 2>&1 \
    || { cat "$build.log"; exit 1; }
"$venv/bin/cmake" --build "$build" > "$build.log" 2>&1 || { cat "$build.log"; exit 1; }
(cd "$build" && "../../$venv/bin/ctest" --output-on-failure)

"$py" -m pytest -q "$@"
