#!/usr/bin/env bash
# Builds the Vocable desktop bundle (one folder, PyInstaller) from this checkout:
#   1. a wheel of the checkout (pip wheel, built by scikit-build-core; not an editable install)
#   2. a clean virtual environment, build/bundle-venv, with that wheel, its dependencies and
#      PyInstaller
#   3. PyInstaller with packaging/vocable.spec into dist/vocable/ (Windows: dist/Vocable/,
#      macOS: dist/Vocable.app)
#
#   bash packaging/build.sh              # PYTHON=python3.11 to choose the interpreter
#
# Then `bash packaging/check-bundle.sh dist/vocable` runs the bundle's selftest in a clean
# environment. Written for bash on Linux and macOS (and Git Bash on Windows); checked on Linux.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
python="${PYTHON:-python3}"
venv="$root/build/bundle-venv"
wheels="$root/build/bundle-wheel"
work="$root/build/pyinstaller"
dist="$root/dist"

case "$(uname -s)" in
    Linux*) platform=linux; bin=bin; bundle="$dist/vocable" ;;
    Darwin*) platform=macos; bin=bin; bundle="$dist/Vocable.app" ;;
    MINGW* | MSYS* | CYGWIN*) platform=windows; bin=Scripts; bundle="$dist/Vocable" ;;
    *) echo "build.sh: unsupported platform $(uname -s)" >&2; exit 1 ;;
esac

step() { printf '\n== %s\n' "$*"; }

if [ ! -f assets/icons/vocable.png ]; then
    echo "build.sh: assets/icons/vocable.png is missing (packaging/render-icon.py makes it)" >&2
    exit 1
fi

step "wheel of this checkout"
rm -rf "$wheels"
"$python" -m pip wheel --no-deps -q -w "$wheels" .
wheel=$(ls "$wheels"/vocable-*.whl)
echo "$wheel"

step "clean virtual environment: $venv"
rm -rf "$venv"
"$python" -m venv "$venv"
vpy="$venv/$bin/python"
"$vpy" -m pip install -q --upgrade pip
extra=()
[ "$platform" = linux ] || extra+=(pillow)  # PyInstaller turns the PNG icon into .ico / .icns
"$vpy" -m pip install -q "$wheel" pyinstaller "${extra[@]}"
# the venv must hold the wheel's compiled engine, not a checkout
"$vpy" - <<'EOF'
import pathlib, vocable, vocable._engine as e
here = pathlib.Path(vocable.__file__).parent
assert "site-packages" in here.parts, f"vocable comes from {here}, not the venv"
print(f"vocable {vocable.__version__} from {here} (engine {pathlib.Path(e.__file__).name})")
EOF
"$vpy" -m pip list --format=freeze > "$root/build/bundle-requirements.txt"

step "PyInstaller"
rm -rf "$bundle" "$work"
"$venv/$bin/pyinstaller" --noconfirm --clean --log-level WARN \
    --distpath "$dist" --workpath "$work" packaging/vocable.spec

if [ "$platform" = linux ]; then
    cp packaging/install-desktop.sh "$bundle/install-desktop.sh"
    chmod +x "$bundle/install-desktop.sh"
    # PortAudio: the Linux sounddevice wheel carries none (_sounddevice_data is in the Windows and
    # macOS wheels); PyInstaller's sounddevice hook copies the build machine's libportaudio.so.2
    # (Debian: libportaudio2) when it finds one. Without it the bundle needs the user's, and
    # without that the app runs with playback and recording disabled.
    if [ -e "$bundle/_internal/libportaudio.so.2" ]; then
        echo "PortAudio: bundled from this machine's libportaudio.so.2"
    else
        echo "note: PortAudio is not bundled (install libportaudio2 here to bundle it); the bundle" \
             "will use the user's system libportaudio2" >&2
    fi
fi

step "bundle"
du -sh "$bundle"
echo "built $bundle (check it: bash packaging/check-bundle.sh ${bundle#"$root"/})"
