#!/usr/bin/env bash
# Creates .venv-peers with the peer engines that tools/bench/peers.py times beside Vocable:
#   - qwentts.cpp through its CPU wheel, realtimetts-qwen-native-cpu (import qwentts_cpp_cpu);
#   - vox-tts (import vox), with its own C++ kernels and its own converter (vox.build).
# gguf goes in too: the bench re-quantizes qwentts.cpp's F32 GGUF with the wheel's own ggml.
# qwentts.cpp's converter, convert.py, is not on PyPI and needs torch: clone qwentts.cpp
#   git clone https://github.com/ServeurpersoCom/qwentts.cpp
# and pass its convert.py to the bench (--qwentts-convert or VOCABLE_QWENTTS_CONVERT); it runs on
# the reference venv's Python (bash tools/setup-reference-venv.sh) with gguf from
# $venv/convert-libs, installed here without dependencies (the reference venv has them).
# Prints the venv's python.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv="${VOCABLE_PEERS_VENV:-.venv-peers}"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q realtimetts-qwen-native-cpu==0.4.2 vox-tts==0.19.5 gguf==0.19.0
"$venv/bin/python" -m pip install -q --no-deps --upgrade --target "$venv/convert-libs" gguf==0.19.0
echo "$(cd "$venv/bin" && pwd)/python"
