#!/usr/bin/env bash
# Checks a built bundle the way a user's machine would run it: copies it to a fresh temporary
# folder, puts the model in the user's models folder (platformdirs, under a temporary HOME) and
# runs `vocable gui --selftest installed REF` there under `env -i` (only HOME, PATH=/usr/bin:/bin
# and QT_QPA_PLATFORM=offscreen: no virtualenv, no PYTHONPATH, no LD_LIBRARY_PATH), then checks the audio it saved and that it wrote nothing inside itself; before
# that, `vocable --version` and `vocable about --licenses` (every component has its license text).
#
#   bash packaging/check-bundle.sh dist/vocable
#
# The model is the tiny test model (tests/fixtures/tiny-0.6b/model) converted to q8_0 with a
# development `vocable` (VOCABLE_CLI; default: build/bundle-venv from build.sh, else .venv);
# MODEL=path.gguf skips the conversion. Needs python3 (stdlib only) to read the WAV header.
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
trap 'rm -rf "$tmp"' EXIT
fail() { echo "check-bundle: FAIL: $*" >&2; exit 1; }

# the model, converted outside the bundle
model="${MODEL:-}"
if [ -z "$model" ]; then
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
mkdir -p "$tmp/app" "$tmp/home" "$tmp/work"
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

out="$tmp/work/selftest.wav"
version=$(cd "$tmp/work" && env -i HOME="$tmp/home" PATH=/usr/bin:/bin "$exe" --version) \
    || fail "vocable --version failed"
echo "bundle: $version"
case "$version" in
    "vocable "*"; engine "*"(ABI "*"); ggml "*) ;;
    *) fail "vocable --version does not name the app, engine, ABI range and ggml: $version" ;;
esac

# `vocable about`: every component with a license text, the system libraries' copyright files
about="$tmp/about.txt"
(cd "$tmp/work" && env -i HOME="$tmp/home" PATH=/usr/bin:/bin \
    "$exe" about --licenses --model "$model") > "$about" || fail "vocable about failed"
if grep -q "no license text found" "$about"; then
    grep "no license text found" "$about" >&2
    fail "components without a license text in the bundle"
fi
expected=(vocable libggml-python PySide6_Essentials Qt libsndfile PortAudio Python)
[ "$(uname -s)" = Linux ] && expected+=("System libraries")
for name in "${expected[@]}"; do
    grep -q "^  $name " "$about" || fail "vocable about does not list $name"
done
grep -q "^Model: .*; license: " "$about" || fail "vocable about does not give the model's license"
echo "about: $(sed '/^==== /,$d' "$about" | grep -c '^  ') components, $(grep -c '^==== ' "$about") license texts"

# the selftest starts as the app does for a user: it has to find the model in its models folder
mkdir -p "$user_data/models"
cp "$model" "$user_data/models/"

start=$(date +%s)
set +e
(cd "$tmp/work" && env -i HOME="$tmp/home" PATH=/usr/bin:/bin QT_QPA_PLATFORM=offscreen \
    timeout 900 "$exe" gui --selftest installed "$ref" --out "$out") \
    2>&1 | tee "$tmp/selftest.log"
rc=${PIPESTATUS[0]}
set -e
echo "selftest exited $rc after $(( $(date +%s) - start )) s"
if [ "$rc" -ne 0 ]; then
    [ -f "$user_log" ] && tail -n 40 "$user_log" >&2
    fail "the selftest exited $rc"
fi

# the audio: a readable WAV, 24 kHz, long enough, not silent
python3 - "$out" <<'EOF' || fail "the selftest's audio is not right"
import array, struct, sys

path = sys.argv[1]
try:
    data = open(path, "rb").read()
except OSError as e:
    sys.exit(f"cannot read {path}: {e}")
if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
    sys.exit(f"{path} is not a WAV file")
pos, fmt, pcm = 12, None, None
while pos + 8 <= len(data):
    cid, size = data[pos:pos + 4], struct.unpack("<I", data[pos + 4:pos + 8])[0]
    body = data[pos + 8:pos + 8 + size]
    if cid == b"fmt ":
        fmt = struct.unpack("<HHIIHH", body[:16])
        if fmt[0] == 0xFFFE and len(body) >= 26:  # WAVE_FORMAT_EXTENSIBLE: the sub-format GUID
            fmt = (struct.unpack("<H", body[24:26])[0],) + fmt[1:]
    elif cid == b"data":
        pcm = body
    pos += 8 + size + (size & 1)
if fmt is None or pcm is None:
    sys.exit(f"{path}: no fmt or data chunk")
tag, channels, rate, _, _, bits = fmt
if (tag, bits) == (1, 16):
    x, scale = array.array("h", pcm[:len(pcm) // 2 * 2]), 32768.0
elif (tag, bits) == (3, 32):
    x, scale = array.array("f", pcm[:len(pcm) // 4 * 4]), 1.0
else:
    sys.exit(f"{path}: unexpected sample format (tag {tag}, {bits} bit)")
if sys.byteorder != "little":
    x.byteswap()
seconds = len(x) / channels / rate
peak = max((abs(v) for v in x), default=0) / scale
rms = (sum(float(v) * v for v in x) / max(len(x), 1)) ** 0.5 / scale
print(f"audio: {path}: {rate} Hz, {channels} channel(s), {bits} bit, {seconds:.2f} s, peak {peak:.3f}, rms {rms:.4f}")
problems = []
if rate != 24000:
    problems.append(f"sample rate {rate}, expected 24000")
if channels != 1:
    problems.append(f"{channels} channels, expected 1")
if seconds < 0.08:
    problems.append(f"only {seconds:.3f} s of audio")
if peak < 1e-3 or rms < 1e-4:
    problems.append("the audio is silent")
if problems:
    sys.exit("; ".join(problems))
EOF

# data, settings and logs went to the user's folders, nothing into the bundle
(cd "$copy" && find . | sort) > "$tmp/files-after"
if ! diff -q "$tmp/files-before" "$tmp/files-after" >/dev/null; then
    diff "$tmp/files-before" "$tmp/files-after" | head -n 20 >&2
    fail "the app wrote into its bundle"
fi
[ -s "$user_log" ] || fail "no log in $user_log"
echo "check-bundle: OK ($bundle_src: selftest audio checked; data and logs stayed in the user's folders)"
