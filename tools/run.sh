#!/usr/bin/env bash
# Installs the system packages the app needs (tools/system-packages.sh), sets up .venv and opens
# the Vocable desktop app. Without a display (a server, CI) it runs the
# command-line flow on the bundled tiny test model instead: convert it, clone the voice of the
# bundled reference clip, and speak a sentence in it (random tiny weights: the audio is noise,
# the flow is the real one). With arguments, runs `vocable ARGS...`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/system-packages.sh app
bash tools/setup-venv.sh
vocable="${VOCABLE_VENV:-.venv}/bin/vocable"
if [ "$#" -gt 0 ]; then
    exec "$vocable" "$@"
fi
if [ -n "${DISPLAY:-}${WAYLAND_DISPLAY:-}" ] || [ "$(uname)" = Darwin ]; then
    exec "$vocable"
fi
echo "no display: running the command-line demo on the bundled test model" >&2
out="${TMPDIR:-/tmp}/vocable-demo"
mkdir -p "$out"
"$vocable" convert tests/fixtures/tiny-0.6b/model "$out/tiny-q8_0.gguf" --type q8_0
"$vocable" -v embed --model "$out/tiny-q8_0.gguf" --ref tests/fixtures/tiny-0.6b/reference/ref_24k.wav \
    --ref-text "Okay. Yeah. I resent you. I love you. I respect you." --out "$out/demo.voice"
echo "voice written to $out/demo.voice"
"$vocable" say --model "$out/tiny-q8_0.gguf" --voice "$out/demo.voice" \
    --text "Hello from Vocable. This sentence streams as it is generated." --out "$out/demo.wav" --play
