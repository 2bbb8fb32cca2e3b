#!/usr/bin/env bash
# Gathers, on a machine with a network, what tools/device-check.sh needs on a lent GPU machine
# that reaches none, into .device-kit/ (ignored by git; the device tool carries it): ggml's pinned
# sdist, checked against cmake/ggml.cmake's sha256, and the wheels of the engine's Python
# dependencies that such a machine's Python lacks (its image has numpy, tokenizers, pybind11,
# scikit-build-core, PyYAML, tqdm, requests and pytest), pinned by version and sha256 for
# CPython 3.12 on x86-64 Linux, the lent machines' Python.
#
#     bash tools/device-kit.sh
set -euo pipefail
cd "$(dirname "$0")/.."
kit=.device-kit
python="${PYTHON:-python3}"
rm -rf "$kit"
mkdir -p "$kit"

version=$(sed -n 's/^set(VOCABLE_GGML_SDIST_VERSION \(.*\))$/\1/p' cmake/ggml.cmake)
sha=$(sed -n 's/^set(VOCABLE_GGML_SDIST_SHA256 \(.*\))$/\1/p' cmake/ggml.cmake)
sdist="libggml_python-$version.tar.gz"
cached="${VOCABLE_GGML_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vocable/ggml}/sdist/$sdist"
if [ -f "$cached" ]; then
    cp "$cached" "$kit/"
else
    "$python" -m pip download -q --no-deps --no-binary libggml-python "libggml-python==$version" -d "$kit"
fi
echo "$sha  $kit/$sdist" | sha256sum --check --quiet

cat > "$kit/requirements.txt" <<'EOF'
gguf==0.19.0 --hash=sha256:70bcd10edfe697fb2dad6e40af2234b9d8ece9a41a99761405121ebda1c3c1cd
soundfile==0.14.0 --hash=sha256:1e38bac1853412871318e82a1ba69a8be677619b56025bbfcccdb41b6cafe82d
cffi==2.1.1 --hash=sha256:c1453022f490d2459a11819d83ad1d586e9ff65a12ac3e705ffebd46d3685dcf
pycparser==3.12 --hash=sha256:a076f3f489b39b43ed13563a1dafe42447445bec2e294154ec5c57fcdda4c85e
soxr==1.1.0 --hash=sha256:3b033078e86f3c4a658e5697fac8995764fad9e799563616b630136b613167f1
platformdirs==4.14.9 --hash=sha256:d0d3a23e7ff282cfa94b77f5a22b81030dcb68ba0430f90c74f4bd8d090782ea
sounddevice==0.5.6 --hash=sha256:de099612311ad81e55d31ccbd83f43ea6bf4d87b48f9b6ea55a1fbcde0eee4e0
EOF
"$python" -m pip download -q --no-deps --require-hashes --only-binary :all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$kit" -r "$kit/requirements.txt"
du -sh "$kit"
