#!/usr/bin/env bash
# Installs the system packages Vocable needs that this machine lacks, for one purpose:
#   app    build and run the app (a compiler, Python's venv, PortAudio, libsndfile, what the
#          PySide6 wheels' Qt loads from the system, a font, the xcb plugin's extra libraries;
#          for ggml's Vulkan backend glslc, the Vulkan and SPIR-V headers, and Mesa's Vulkan
#          drivers: those of AMD and Intel GPUs, and lavapipe, the software one the tests use)
#   test   the above, and what the tests drive: espeak-ng (speech-like clips), a PulseAudio
#          server with a null sink (the playback and recording tests) and its ALSA plugin; on
#          Debian 12, Mesa's Vulkan drivers from bookworm-backports (below)
#   bundle the above, and what the bundle's check runs: Xvfb and desktop-file-validate
#   fuzz   the above, and clang 14 with its libFuzzer and sanitizer runtimes (tools/fuzz.sh)
# On Debian or Ubuntu it installs the missing ones with apt-get, as root or through sudo
# without a password prompt; where it cannot, it prints the command to run and goes on (the
# parts that need a missing package then say so or skip with the reason). Elsewhere it lists
# what to install. VOCABLE_NO_SYSTEM_PACKAGES=1 skips it all. VOCABLE_OS_RELEASE and
# VOCABLE_APT_DIR stand in for /etc/os-release and /etc/apt (for its tests).
set -euo pipefail
purpose="${1:-app}"

app_packages=(g++ python3 python3-venv python3-dev libsndfile1 libportaudio2
    libegl1 libgl1 libfontconfig1 libglib2.0-0 libxkbcommon0 libdbus-1-3 fonts-dejavu-core
    libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1
    glslc libvulkan-dev spirv-headers mesa-vulkan-drivers)
# Without these the app still builds and runs, on the CPU: where the release has no such package
# (Ubuntu 22.04 has no glslc) they are left out, not made to fail the whole install.
optional_packages=(glslc libvulkan-dev spirv-headers mesa-vulkan-drivers)
# Ubuntu 24.04 and Debian 13 renamed it for 64-bit time; the old name only points at the new
declare -A renamed=([libglib2.0-0]=libglib2.0-0t64)
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

installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep "install ok installed" > /dev/null
}
missing=()
for package in "${wanted[@]}"; do
    if ! installed "$package" && ! { [ -n "${renamed[$package]:-}" ] && installed "${renamed[$package]}"; }; then
        missing+=("$package")
    fi
done

# Debian 12's Mesa 22.3 has a lavapipe that frees buffers its queue thread still uses: under
# ggml's Vulkan backend, a heap corruption in about half the runs that free a state's buffers
# (measured; Mesa 25.0 from bookworm-backports runs them clean). The device tests need Mesa >= 25.
os_release="${VOCABLE_OS_RELEASE:-/etc/os-release}"
apt_dir="${VOCABLE_APT_DIR:-/etc/apt}"
old_mesa=""
if [ "$purpose" != app ] && grep -qs '^VERSION_CODENAME=bookworm$' "$os_release"; then
    mesa_version="$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true)"
    if [ -z "$mesa_version" ] || dpkg --compare-versions "$mesa_version" lt 25; then
        old_mesa=1
    fi
fi
if [ "${#missing[@]}" -eq 0 ] && [ -z "$old_mesa" ]; then
    exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
    as_root=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    as_root=(sudo -n env DEBIAN_FRONTEND=noninteractive)   # sudo drops the environment
else
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "warning: missing system packages: ${missing[*]}" >&2
        echo "         install them with: sudo apt-get install ${missing[*]}" >&2
    fi
    if [ -n "$old_mesa" ]; then
        echo "warning: the Vulkan device tests need Mesa >= 25 (bookworm-backports); they skip with the reason" >&2
    fi
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# a first boot's unattended upgrades hold apt's lock for minutes: wait for it, not fail
apt=("${as_root[@]}" apt-get -o DPkg::Lock::Timeout=600)
if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing system packages: ${missing[*]}" >&2
    # a fresh machine may never have fetched the package lists
    if ! "${apt[@]}" install -y -qq --no-install-recommends "${missing[@]}" > /dev/null 2>&1; then
        "${apt[@]}" update -qq
        if ! "${apt[@]}" install -y -qq --no-install-recommends "${missing[@]}" > /dev/null; then
            # one optional package the release lacks refuses the whole list: the rest without them
            required=()
            for package in "${missing[@]}"; do
                [[ " ${optional_packages[*]} " == *" $package "* ]] || required+=("$package")
            done
            echo "warning: installing without the Vulkan build tools (${optional_packages[*]}); the app runs on" \
                 "the CPU" >&2
            if [ "${#required[@]}" -gt 0 ]; then
                "${apt[@]}" install -y -qq --no-install-recommends "${required[@]}" > /dev/null
            fi
        fi
    fi
fi
if [ -n "$old_mesa" ]; then
    # backports are pinned below the release (priority 100): only what is named here comes from them
    if ! grep -rqsE '^[^#]*bookworm-backports' "$apt_dir/sources.list" "$apt_dir/sources.list.d/"; then
        echo "adding Debian's bookworm-backports to apt's sources ($apt_dir/sources.list.d/vocable-backports.list)" >&2
        echo "deb http://deb.debian.org/debian bookworm-backports main" |
            "${as_root[@]}" tee "$apt_dir/sources.list.d/vocable-backports.list" > /dev/null
    fi
    echo "installing Mesa's Vulkan drivers from bookworm-backports (lavapipe, for the device tests)" >&2
    if ! "${apt[@]}" update -qq || ! "${apt[@]}" install -y -qq --no-install-recommends -t bookworm-backports \
            mesa-vulkan-drivers > /dev/null; then
        echo "warning: Mesa from bookworm-backports could not be installed; the Vulkan device tests skip" \
             "with the reason" >&2
    fi
fi
