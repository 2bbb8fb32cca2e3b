#!/usr/bin/env bash
# Installs the system packages the tests need (tools/system-packages.sh), sets up .venv, builds
# Vocable, then runs every test: the C/C++ tests (ctest) and the Python tests (pytest). Extra
# arguments go to pytest.
#
#   bash tools/test.sh [PYTEST ARGS...]
#   bash tools/test.sh --sanitize [PYTEST ARGS...]
#
# --sanitize runs the same C/C++ tests, and the Python tests that drive the engine, on a build
# with AddressSanitizer and UndefinedBehaviorSanitizer (build/native-asan, and the module in
# .venv-asan): any memory error, leak (C/C++) or undefined behaviour fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
sanitize=0
if [ "${1:-}" = --sanitize ]; then
    sanitize=1
    shift
fi
bash tools/system-packages.sh test
bash tools/setup-venv.sh
venv="$(cd "${VOCABLE_VENV:-.venv}" && pwd)"
py="$venv/bin/python"
"$py" -m pip install -q cmake ninja
# CMake looks for ninja on PATH; on a fresh machine the venv's is the only one
export PATH="$venv/bin:$PATH"

build=build/native-tests
flags=(-DCMAKE_BUILD_TYPE=Release)
if [ "$sanitize" = 1 ]; then
    build=build/native-asan
    flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DVOCABLE_SANITIZE=ON)
    export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1"
    export LSAN_OPTIONS="suppressions='$PWD/tools/lsan-suppressions.txt':print_suppressions=0"   # a path with spaces
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
fi
"$venv/bin/cmake" -S . -B "$build" -G Ninja "${flags[@]}" -DVOCABLE_BUILD_PYTHON=OFF -DPython_EXECUTABLE="$py" \
    > "$build.log" 2>&1 || { cat "$build.log"; exit 1; }
"$venv/bin/cmake" --build "$build" > "$build.log" 2>&1 || { cat "$build.log"; exit 1; }
(cd "$build" && "$venv/bin/ctest" --output-on-failure)

if [ "$sanitize" = 0 ]; then
    "$py" -m pytest -q "$@"
    exit 0
fi

# The module with the sanitizers, in its own venv; Python itself is not instrumented, so the
# sanitizer runtimes are preloaded, and leak checking is off (CPython keeps objects to exit).
asan_venv="${VOCABLE_ASAN_VENV:-.venv-asan}"
VOCABLE_VENV="$asan_venv" bash tools/setup-venv.sh --config-settings=cmake.define.VOCABLE_SANITIZE=ON \
    --config-settings=cmake.build-type=RelWithDebInfo --config-settings="build-dir=build/asan-{wheel_tag}"
runtimes="$(c++ -print-file-name=libasan.so) $(c++ -print-file-name=libubsan.so)"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1"
module=$(LD_PRELOAD="$runtimes" "$asan_venv/bin/python" -c "import vocable._engine as m; print(m.__file__)")
ldd "$module" | grep libasan > /dev/null || { echo "error: $module was built without the sanitizers" >&2; exit 1; }
LD_PRELOAD="$runtimes" "$asan_venv/bin/python" -m pytest -q \
    -p no:cacheprovider tests/test_engine_api.py tests/test_engine_voice_checks.py tests/test_model_errors.py \
    tests/test_parity_generation.py tests/test_parity_voice_ref.py tests/test_long_text.py \
    tests/test_reference_audio.py "$@"
