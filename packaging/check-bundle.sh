#!/usr/bin/env bash
# Checks a built bundle the way a user's machine would run it: copies it to a fresh temporary
# folder, puts the model in the user's models folder (platformdirs, under a temporary HOME) and
# runs `vocable gui --selftest installed REF` there under `env -i` (only HOME, PATH=/usr/bin:/bin
# and QT_QPA_PLATFORM=offscreen: no virtualenv, no PYTHONPATH, no LD_LIBRARY_PATH) and, where
# Xvfb is installed (required in CI), again on xcb, a desktop's platform, on a virtual X screen;
# checks the audio each run saved and that the app wrote nothing inside itself. Before that,
# `vocable --version` and `vocable about --licenses` (every component has its license text).
#
#   bash packaging/check-bundle.sh dist/vocable
#
# The model is the tiny test model (tests/fixtures/tiny-0.6b/model) converted to q8_0 with a
# development `vocable` (VOCABLE_CLI; default: build/bundle-venv from build.sh, else .venv);
# MODEL=path.gguf skips the conversion. Needs python3 (stdlib only) for packaging/check-wav.py.
set -euo pipefail
if [ $# -ne 1 ] || [ ! -d "$1" ]; then
    echo "usage: $0 BUNDLE_DIR   (the folder build.sh made, e.g. dist/vocable)" >&2
    exit 2
fi
bundle_src="$(cd "$1" && pwd)"
cd "$(dirname "$0")/.."
root="$PWD"
ref="$root/tests/fixtures/tiny-0.6b/reference/ref_24k.wav"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/vocable-check.XXXXXX")"
xvfb=""
trap 'if [ -n "$xvfb" ]; then kill "$xvfb" 2>/dev/null || true; fi; rm -rf "$tmp"' EXIT
fail() { echo "check-bundle: FAIL: $*" >&2; exit 1; }

# the model, converted outside the bundle
model="${MODEL:-}"
converted_here=""
if [ -z "$model" ]; then
    converted_here=1
    cli="${VOCABLE_CLI:-}"
    for c in "$root/build/bundle-venv/bin/vocable" "$root/.venv/bin/vocable"; do
        if [ -z "$cli" ] && [ -x "$c" ]; then cli="$c"; fi
    done
    [ -n "$cli" ] || fail "no development vocable to convert the test model with (set VOCABLE_CLI or MODEL)"
    model="$tmp/tiny-0.6b-q8_0.gguf"
    "$cli" convert "$root/tests/fixtures/tiny-0.6b/model" "$model" --type q8_0 -q
fi
[ -f "$model" ] || fail "model not found: $model"

# the bundle, somewhere else than where it was built
mkdir -p "$tmp/app" "$tmp/home" "$tmp/empty-home" "$tmp/work"
# the user's folders as platformdirs names them on Linux (the app's data, logs)
user_data="$tmp/home/.local/share/Vocable"
user_log="$tmp/home/.local/state/Vocable/log/vocable.log"
cp -a "$bundle_src" "$tmp/app/"
copy="$tmp/app/$(basename "$bundle_src")"
exe=""
for e in "$copy/vocable" "$copy/Contents/MacOS/Vocable" "$copy/vocable-cli.exe"; do
    if [ -z "$exe" ] && [ -f "$e" ]; then exe="$e"; fi
done
[ -n "$exe" ] || fail "no vocable executable in $bundle_src"
(cd "$copy" && find . | sort) > "$tmp/files-before"
echo "bundle copied to $copy ($(du -sh "$copy" | cut -f1))"

version=$(cd "$tmp/work" && env -i HOME="$tmp/home" PATH=/usr/bin:/bin "$exe" --version) \
    || fail "vocable --version failed"
echo "bundle: $version"
case "$version" in
    "vocable "*"; engine "*"(ABI "*"); ggml "*) ;;
    *) fail "vocable --version does not name the app, engine, ABI range and ggml: $version" ;;
esac
# ggml's CPU backend is loaded at run time from the bundle's copies of every variant
echo "$version" | grep -q "^CPU backend: [a-z0-9]\+ (.*); kernels: [a-z0-9]\+; variants: .*x64" \
    || fail "the bundle's engine did not load a ggml CPU variant: $version"
variants=$(find "$copy" -name 'libggml-cpu-*.so' | wc -l)
[ "$variants" -ge 14 ] || fail "the bundle carries $variants ggml CPU variants, not all 14"

# `vocable about`: every component with a license text, the system libraries' copyright files
about="$tmp/about.txt"
(cd "$tmp/work" && env -i HOME="$tmp/home" PATH=/usr/bin:/bin \
    "$exe" about --licenses --model "$model") > "$about" || fail "vocable about failed"
# the devices: the CPU always; the Vulkan backend, where the wheel carried it, loads or says why not
grep -q "^Devices found: cpu (" "$about" || fail "vocable about lists no devices: $(grep '^Devices' "$about")"
if [ -n "$(find "$copy" -name 'libggml-vulkan.so')" ]; then
    echo "bundle: carries ggml's Vulkan backend; $(grep '^Devices found' "$about")"
fi
if grep -q "no license text found" "$about"; then
    grep "no license text found" "$about" >&2
    fail "components without a license text in the bundle"
fi
expected=(vocable ggml PySide6_Essentials Qt libsndfile PortAudio Python)
[ "$(uname -s)" = Linux ] && expected+=("System libraries")
for name in "${expected[@]}"; do
    grep -q "^  $name " "$about" || fail "vocable about does not list $name"
done
grep -q "^Model: .*; license: " "$about" || fail "vocable about does not give the model's license"
echo "about: $(sed '/^==== /,$d' "$about" | grep -c '^  ') components, $(grep -c '^==== ' "$about") license texts"

# the bundle converts a model folder itself (gguf, the engine's quantizer): the same bytes
if [ -n "$converted_here" ]; then
    (cd "$tmp/work" && env -i HOME="$tmp/home" PATH=/usr/bin:/bin "$exe" convert -q \
        "$root/tests/fixtures/tiny-0.6b/model" "$tmp/work/bundled.gguf" --type q8_0) \
        || fail "the bundle's vocable convert failed"
    cmp -s "$model" "$tmp/work/bundled.gguf" || fail "the bundle's conversion differs from the development one"
    echo "convert: the bundle's q8_0 conversion of the test model is the development one, byte for byte"
fi

# Linux desktop integration: the entry and icons go to XDG_DATA_HOME, Exec runs this copy
if [ -x "$copy/install-desktop.sh" ]; then
    xdg="$tmp/xdg-data"
    env -i HOME="$tmp/home" PATH=/usr/bin:/bin XDG_DATA_HOME="$xdg" "$copy/install-desktop.sh" >/dev/null \
        || fail "install-desktop.sh failed"
    entry="$xdg/applications/vocable.desktop"
    [ -f "$entry" ] && [ -f "$xdg/icons/hicolor/256x256/apps/vocable.png" ] \
        && [ -f "$xdg/icons/hicolor/scalable/apps/vocable.svg" ] || fail "install-desktop.sh left no entry or icons"
    if command -v desktop-file-validate >/dev/null; then
        problems=$(desktop-file-validate "$entry" 2>&1) || true
        [ -z "$problems" ] || fail "the installed desktop entry is not valid: $problems"
    elif [ -n "${CI:-}" ]; then
        fail "desktop-file-validate is not installed (apt install desktop-file-utils)"
    fi
    exec_line=$(sed -n 's/^Exec=//p' "$entry")
    [ "$exec_line" = "\"$copy/vocable\"" ] || fail "the desktop entry runs $exec_line, not this bundle"
    launched=$(cd "$tmp/work" && env -i HOME="$tmp/home" PATH=/usr/bin:/bin sh -c "$exec_line --version") \
        || fail "the desktop entry's command does not run"
    [ "$launched" = "$version" ] || fail "the desktop entry's command printed $launched"
    env -i HOME="$tmp/home" PATH=/usr/bin:/bin XDG_DATA_HOME="$xdg" "$copy/install-desktop.sh" --uninstall \
        >/dev/null || fail "install-desktop.sh --uninstall failed"
    [ ! -e "$entry" ] || fail "install-desktop.sh --uninstall left $entry"
    echo "desktop entry: installed, ran $exec_line --version, removed"
fi

# without a model, the app starts and asks for one (the setup screen) instead of failing
set +e
none=$(cd "$tmp/work" && env -i HOME="$tmp/empty-home" PATH=/usr/bin:/bin QT_QPA_PLATFORM=offscreen \
    timeout 300 "$exe" gui --selftest installed "$ref" --out "$tmp/work/none.wav" 2>&1)
rc=$?
set -e
[ "$rc" -eq 1 ] && grep -q "selftest: error: no model installed" <<<"$none" \
    || { echo "$none" >&2; fail "without a model the selftest exited $rc instead of saying it has none"; }
echo "no model: the app says so ($(grep -o 'no model installed[^;]*' <<<"$none"))"

# the selftest starts as the app does for a user: it has to find the model in its models folder
mkdir -p "$user_data/models"
cp "$model" "$user_data/models/"

# selftest PLATFORM OUT [VAR=VALUE...]: the app's selftest under env -i with those variables more,
# then checks it ran on that Qt platform and the audio it saved
selftest() {
    local platform="$1" out="$2" start rc
    shift 2
    start=$(date +%s)
    set +e
    (cd "$tmp/work" && env -i HOME="$tmp/home" PATH=/usr/bin:/bin "$@" \
        timeout 900 "$exe" gui --selftest installed "$ref" --out "$out") 2>&1 | tee "$tmp/selftest.log"
    rc=${PIPESTATUS[0]}
    set -e
    echo "selftest ($platform) exited $rc after $(( $(date +%s) - start )) s"
    if [ "$rc" -ne 0 ]; then
        [ -f "$user_log" ] && tail -n 40 "$user_log" >&2
        fail "the selftest ($platform) exited $rc"
    fi
    grep -q "^selftest: Qt platform: $platform\$" "$tmp/selftest.log" || fail "the selftest did not run on Qt's $platform"
    python3 "$root/packaging/check-wav.py" "$out" || fail "the selftest's audio ($platform) is not right"
}

selftest offscreen "$tmp/work/selftest.wav" QT_QPA_PLATFORM=offscreen

# a desktop's platform (xcb, as on X11 and through XWayland) on a virtual X screen
if [ "$(uname -s)" = Linux ]; then
    if command -v Xvfb >/dev/null; then
        Xvfb -displayfd 3 -screen 0 1280x800x24 -nolisten tcp 3>"$tmp/display" 2>"$tmp/xvfb.log" &
        xvfb=$!
        for _ in $(seq 100); do [ -s "$tmp/display" ] && break; sleep 0.1; done
        [ -s "$tmp/display" ] || { cat "$tmp/xvfb.log" >&2; fail "Xvfb did not start"; }
        selftest xcb "$tmp/work/selftest-xcb.wav" DISPLAY=":$(cat "$tmp/display")"
        kill "$xvfb"
        wait "$xvfb" 2>/dev/null || true
        xvfb=""
    elif [ -n "${CI:-}" ]; then
        fail "Xvfb is not installed, so the xcb platform cannot be checked (apt install xvfb)"
    else
        echo "check-bundle: Xvfb is not installed: the xcb platform is not checked"
    fi
fi

# the speech API from the bundle: a voice made by its CLI, served on loopback, one request spoken
voices="$tmp/voices"
mkdir -p "$voices"
(cd "$tmp/work" && env -i HOME="$tmp/home" PATH=/usr/bin:/bin \
    "$exe" embed --model "$model" --ref "$ref" --name Ref --out "$voices/ref.safetensors") \
    || fail "vocable embed failed"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
(cd "$tmp/work" && exec env -i HOME="$tmp/home" PATH=/usr/bin:/bin \
    "$exe" serve --model "$model" --voices "$voices" --port "$port") > "$tmp/serve.log" 2>&1 &
serve_pid=$!
python3 - "$port" "$tmp/work/api.wav" <<'PY' || { cat "$tmp/serve.log" >&2; kill "$serve_pid"; fail "the speech API did not answer"; }
import json, sys, time, urllib.request
port, out = sys.argv[1], sys.argv[2]
for _ in range(300):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2)
        break
    except OSError:
        time.sleep(0.2)
request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/audio/speech", method="POST",
                                 headers={"Content-Type": "application/json"},
                                 data=json.dumps({"model": "tts-1", "voice": "Ref", "input": "Hello from the API.",
                                                  "response_format": "wav"}).encode())
with urllib.request.urlopen(request, timeout=300) as response, open(out, "wb") as f:
    f.write(response.read())
PY
kill -INT "$serve_pid"
wait "$serve_pid" || fail "vocable serve did not stop cleanly on Ctrl-C: $(tail -n 5 "$tmp/serve.log")"
python3 "$root/packaging/check-wav.py" "$tmp/work/api.wav" || fail "the speech API's audio is not right"
echo "check-bundle: the speech API answered from the bundle"

# data, settings and logs went to the user's folders, nothing into the bundle
(cd "$copy" && find . | sort) > "$tmp/files-after"
if ! diff -q "$tmp/files-before" "$tmp/files-after" >/dev/null; then
    diff "$tmp/files-before" "$tmp/files-after" | head -n 20 >&2
    fail "the app wrote into its bundle"
fi
[ -s "$user_log" ] || fail "no log in $user_log"
echo "check-bundle: OK ($bundle_src: selftest audio checked; data and logs stayed in the user's folders)"
