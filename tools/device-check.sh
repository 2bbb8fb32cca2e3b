#!/usr/bin/env bash
# Issue 17's checks on a GPU, in one script for a lent GPU machine that reaches no network (run
# tools/device-kit.sh first where one is, and carry .device-kit/). It builds ggml with the GPU's
# backend and the engine there, runs every C/C++ test (test-device compares each stage on the GPU
# with the CPU) and the Python device tests on the GPU, then the bench on it.
#
#     bash tools/device-check.sh build|test|bench|all [BENCH ARGS...]
#
# The build runs in a process session of its own, which outlives a call of the device tool that
# ends sooner (each may run 10 minutes): `build` waits for it up to VOCABLE_DEVICE_WAIT seconds
# (default 540), exits 3 if it is still running, and a second `build` waits for the same one.
# Each phase's log and time (phases.txt) are kept in build/device-check and copied to $OUT (the
# device tool's folder) when set.
#
# VOCABLE_DEVICE_BACKEND: cuda (default), or vulkan for a dry run of the whole flow on Mesa's
# software driver where no GPU is (slow: the bench then times correctness, not speed).
# VOCABLE_DEVICE: the device id (default cuda:0 or vulkan:0). PYTHON: default python3.
# CMAKE_CUDA_ARCHITECTURES: default the first GPU's (nvidia-smi).
set -euo pipefail
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$0")/.."
phase="${1:-all}"
shift || true
backend="${VOCABLE_DEVICE_BACKEND:-cuda}"
device="${VOCABLE_DEVICE:-$backend:0}"
python="${PYTHON:-python3}"
logs="$PWD/build/device-check"
site="$PWD/build/device-site"
mkdir -p "$logs" "$site"
export VOCABLE_GGML_CACHE="${VOCABLE_GGML_CACHE:-$PWD/build/device-ggml}"
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"

case "$backend" in
cuda)
    command -v nvcc > /dev/null || export PATH="/usr/local/cuda/bin:$PATH"
    command -v nvcc > /dev/null || { echo "error: no nvcc (the CUDA toolkit) on PATH or in /usr/local/cuda" >&2; exit 1; }
    arch="${CMAKE_CUDA_ARCHITECTURES:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d .)}"
    backend_flags=(-DVOCABLE_CUDA=ON -DVOCABLE_VULKAN=OFF "-DCMAKE_CUDA_ARCHITECTURES=$arch")
    ;;
vulkan)
    backend_flags=(-DVOCABLE_VULKAN=ON)
    export GGML_VK_VISIBLE_DEVICES=0
    ;;
*)
    echo "error: VOCABLE_DEVICE_BACKEND is cuda or vulkan, not $backend" >&2
    exit 2
    ;;
esac

copy_logs() {
    if [ -n "${OUT:-}" ]; then
        cp "$logs"/*.log "$logs"/phases.txt "$OUT"/ 2> /dev/null || true
    fi
}
trap copy_logs EXIT

# Runs phase NAME (NAME-now, in a bash of its own, so that its first failing command ends it and
# gives the phase's rc) with its output in $logs/NAME.log (the last lines on the terminal), and
# records its rc and time in phases.txt.
timed() {
    local name="$1" start=$SECONDS rc=0
    shift
    bash "$self" "$name-now" "$@" > "$logs/$name.log" 2>&1 || rc=$?
    tail -n 25 "$logs/$name.log"
    echo "== $name: rc $rc in $((SECONDS - start)) s" | tee -a "$logs/phases.txt"
    return "$rc"
}

build_now() {
    local kit=.device-kit
    if ls "$kit"/libggml_python-*.tar.gz > /dev/null 2>&1; then
        mkdir -p "$VOCABLE_GGML_CACHE/sdist"
        cp "$kit"/libggml_python-*.tar.gz "$VOCABLE_GGML_CACHE/sdist/"
    fi
    if ! "$python" -c "import gguf, soundfile, soxr, platformdirs, sounddevice" 2> /dev/null; then
        if ! ls "$kit"/*.whl > /dev/null 2>&1; then
            echo "error: $python lacks the engine's dependencies and $kit/ has no wheels:" \
                "run tools/device-kit.sh where a network is, and carry $kit" >&2
            return 1
        fi
        "$python" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" "$kit"/*.whl
    fi
    echo "$(nproc) cores"
    if command -v nvidia-smi > /dev/null; then
        nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv
    fi
    # the module first: the C/C++ tests convert the fixtures with it (ggml is built once, for both)
    "$python" -m pip install -q --no-build-isolation --no-deps --no-index --upgrade --target "$site" \
        -C build-dir=build/device-{wheel_tag} -C cmake.build-type=Release \
        $(printf -- "-C cmake.define.%s " "${backend_flags[@]#-D}") .
    cmake -S . -B build/device-tests -G Ninja -DCMAKE_BUILD_TYPE=Release -DVOCABLE_BUILD_PYTHON=OFF \
        "-DPython_EXECUTABLE=$(command -v "$python")" "${backend_flags[@]}"
    cmake --build build/device-tests --parallel "$(nproc)"
    "$python" -m vocable about | sed '/^Components/,$d'
}

# Starts the build in a session of its own unless one is running, then waits for it.
build() {
    local pid_file="$logs/build.pid" rc_file="$logs/build.rc" waited=0
    if ! { [ -f "$pid_file" ] && kill -0 "$(cat "$pid_file")" 2> /dev/null; }; then
        rm -f "$rc_file"
        setsid bash "$self" build-in-background < /dev/null > /dev/null 2>&1 &
        echo $! > "$pid_file"
    else
        echo "waiting for the build already running"
    fi
    while [ ! -f "$rc_file" ]; do
        if [ "$waited" -ge "${VOCABLE_DEVICE_WAIT:-540}" ]; then
            tail -n 5 "$logs/build.log"
            echo "the build is still running: run 'bash tools/device-check.sh build' again to wait for it"
            exit 3
        fi
        sleep 5
        waited=$((waited + 5))
    done
    tail -n 25 "$logs/build.log"
    tail -n 1 "$logs/phases.txt"
    return "$(cat "$rc_file")"
}

unit_tests() {
    ctest --test-dir build/device-tests --output-on-failure --parallel "$(nproc)"
    # the device test's own output: every stage's cosine on the GPU
    ctest --test-dir build/device-tests -R '^device$' --verbose
    VOCABLE_TEST_DEVICE="$device" "$python" -m pytest -q -s -rs -p no:cacheprovider -p no:pytestqt tests/test_devices.py  # -s: the figures
}

bench() {
    "$python" -m vocable bench --device "$device" --no-reference --cache-dir build/device-bench "$@"
}

case "$phase" in
build-now) build_now ;;
tests-now) unit_tests ;;
bench-now) bench "$@" ;;
build-in-background)
    rc=0
    timed build || rc=$?
    echo "$rc" > "$logs/build.rc"
    ;;
build) build ;;
test) timed tests ;;
bench) timed bench "$@" ;;
all)
    build
    timed tests || true
    timed bench "$@"
    ;;
*)
    echo "usage: bash tools/device-check.sh build|test|bench|all [BENCH ARGS...]" >&2
    exit 2
    ;;
esac
