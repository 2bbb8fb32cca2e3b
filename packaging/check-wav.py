"""Checks the WAV a selftest wrote: readable, 24 kHz mono, long enough, not silent. Standard
library only, so it runs with any python3 beside a bundle.

    python3 packaging/check-wav.py FILE.wav      # exit 0 and a summary line, or exit 1 and why
"""
import array
import struct
import sys

if len(sys.argv) != 2:
    sys.exit("usage: check-wav.py FILE.wav")
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
