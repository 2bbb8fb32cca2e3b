#!/usr/bin/env bash
# Installs the system packages Vocable needs that this machine lacks, for one purpose:
#   app    build and run the app (a compiler, Python's venv, PortAudio, libsndfile, what the
#          PySide6 wheels' Qt loads from the system, a font, the xcb plugin's extra libraries;
#          for ggml's Vulkan backend glslc, the Vulkan and SPIR-V headers, and Mesa's Vulkan
#          drivers: those of AMD and Intel GPUs, and lavapipe, the software one the tests use)
#   test   the above, and what the tests drive: espeak-ng (speech-like clips), a PulseAudio
#          server with a null sink (the playback and recording tests) and its ALSA plugin
#   bundle the above, and what the bundle's check runs: Xvfb and desktop-file-validate
#   fuzz   the above, and clang 14 with its libFuzzer and sanitizer runtimes (tools/fuzz.sh)
# On Debian or Ubuntu it installs the missing ones with apt-get, as root or through sudo
# without a password prompt; where it cannot, it prints the command to run and goes on (the
# parts that need a missing package then say so or skip with the reason). Elsewhere it lists
# what to install. VOCABLE_NO_SYSTEM_PACKAGES=1 skips it all.
set -euo pipefail
purpose="${1:-app}"

app_packages=(g++ python3 python3-venv python3-dev libsndfile1 libportaudio2
    libegl1 libgl1 libfontconfig1 libglib2.0-0 libxkbcommon0 libdbus-1-3 fonts-dejavu-core
    libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1
    glslc libvulkan-dev spirv-headers mesa-vulkan-drivers)
test_packages=(espeak-ng pulseaudio pulseaudio-utils libasound2-plugins)
bundle_packages=(xvfb desktop-file-utils)
fuzz_packages=(clang-14 libclang-rt-14-dev llvm-14)

case "$purpose" in
    app) wanted=("${app_packages[@]}") ;;
    test) wanted=("${app_packages[@]}" "${test_packages[@]}") ;;
    bundle) wanted=("${app_packages[@]}" "${test_packages[@]}" "${bundle_packages[@]}") ;;
    fuzz) wanted=("${app_packages[@]}" "${test_packages[@]}" "${fuzz_packages[@]}") ;;
    *) echo "usage: $0 app|test|bundle|fuzz" >&2; exit 2 ;;
esac

if [ -n "${VOCABLE_NO_SYSTEM_PACKAGES:-}" ]; then
    exit 0
fi
if ! command -v dpkg-query >/dev/null || ! command -v apt-get >/dev/null; then
    echo "note: not a Debian-like system; Vocable needs the equivalents of: ${wanted[*]}" >&2
    exit 0
fi

missing=()
for package in "${wanted[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep "install ok installed" > /dev/null; then
        missing+=("$package")
    fi
done
if [ "${#missing[@]}" -eq 0 ]; then
    exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
    as_root=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
else
    echo "warning: missing system packages: ${missing[*]}" >&2
    echo "         install them with: sudo apt-get install ${missing[*]}" >&2
    exit 0
fi
echo "installing system packages: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# a fresh machine may never have fetched the package lists
if ! "${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null 2>&1; then
    "${as_root[@]}" apt-get update -qq
    "${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
fi
