#!/usr/bin/env bash
# Fuzzes every reader of untrusted input for SECONDS each (default 60):
#   C++ (libFuzzer, clang, ASan + UBSan; native/fuzz/): model loading (fuzz-model), synthesis
#   requests with any voice, ids and settings (fuzz-synthesize), the reference path on any
#   samples (fuzz-reference);
#   Python (atheris; tools/fuzz/): voice files, audio files, GGUF headers and the tokenizer
#   built from them, the text front end.
# Each starts from its seed corpus (valid files and crafted ones, made here from the test
# fixtures) and keeps what it finds in build/fuzz/corpus/<target>/, so later runs go on from
# there. Prints executions, coverage and findings per target; a finding (crash-*, leak-*,
# timeout-* in build/fuzz/findings/<target>/) fails the run.
#
#   bash tools/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
bash tools/system-packages.sh fuzz
bash tools/setup-venv.sh
py="$PWD/${VOCABLE_VENV:-.venv}/bin/python"
"$py" -m pip install -q atheris==2.3.0 cmake ninja
# CMake looks for ninja on PATH; on a fresh machine the venv's is the only one
export PATH="$(dirname "$py"):$PATH"
root="$PWD"
build="$root/build/fuzz"
mkdir -p "$build"

"$py" -m cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
    -DVOCABLE_GGML_C_COMPILER="$(command -v cc)" -DVOCABLE_GGML_CXX_COMPILER="$(command -v c++)" \
    -DVOCABLE_BUILD_FUZZERS=ON -DVOCABLE_BUILD_TESTS=OFF -DVOCABLE_BUILD_PYTHON=OFF \
    -DPython_EXECUTABLE="$py" > "$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
"$py" -m cmake --build "$build" --target fuzz-model fuzz-synthesize fuzz-reference > "$build/build.log" 2>&1 \
    || { cat "$build/build.log"; exit 1; }

# The model the C++ targets run on, and the seeds made from it and the fixtures.
model="$build/tiny-0.6b-q8_0.gguf"
[ -f "$model" ] || "$py" -m vocable convert -q tests/fixtures/tiny-0.6b/model "$model" --type q8_0
export VOCABLE_FUZZ_MODEL="$model"
VOCABLE_FUZZ_MODEL_HEADER_BYTES="$("$py" tools/fuzz/make_seeds.py "$model" "$build/seeds")"
export VOCABLE_FUZZ_MODEL_HEADER_BYTES

targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
    targets=(fuzz-model fuzz-synthesize fuzz-reference voice_file audio_file gguf_header text)
fi
# where ASan and UBSan stop at the first report and symbolize it; leaks count as findings
export ASAN_OPTIONS="abort_on_error=1:symbolize=1:detect_leaks=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export ASAN_SYMBOLIZER_PATH="$(command -v llvm-symbolizer-14 || command -v llvm-symbolizer || true)"
summary=()
failed=0
for target in "${targets[@]}"; do
    corpus="$build/corpus/$target"
    findings="$build/findings/$target"
    mkdir -p "$corpus" "$findings"
    log="$build/$target.log"
    printf '== %s: %s s\n' "$target" "$seconds"
    case "$target" in
        fuzz-*)
            dict=()
            [ "$target" = fuzz-model ] && dict=(-dict="$root/tools/fuzz/gguf.dict")
            cmd=("$build/native/$target" "$corpus" "$build/seeds/$target" "${dict[@]}" -max_len=1048576
                 -timeout=60 -rss_limit_mb=4096 -max_total_time="$seconds" -print_final_stats=1
                 -artifact_prefix="$findings/")
            ;;
        *)
            # the Python targets run without ASan's runtime: the Python code is what they test
            cmd=(env -u ASAN_OPTIONS "$py" "fuzz_$target.py" "$corpus" "$build/seeds/$target"
                 -max_len=262144 -timeout=60 -rss_limit_mb=4096 -max_total_time="$seconds" -print_final_stats=1
                 -artifact_prefix="$findings/")
            ;;
    esac
    if (cd tools/fuzz && "${cmd[@]}") > "$log" 2>&1; then
        status=ok
    else
        status="FOUND (see $log and $findings/)"
        failed=1
    fi
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1 || true)
    cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -1 || true)
    summary+=("$(printf '%-16s %8s executions  %-22s %s' "$target" "${execs:-?}" "${cov:-cov: ?}" "$status")")
    [ "$status" = ok ] || tail -40 "$log"
done
printf '\nfuzzing, %s s per target:\n' "$seconds"
printf '  %s\n' "${summary[@]}"
exit "$failed"
