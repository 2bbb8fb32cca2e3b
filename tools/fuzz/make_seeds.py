"""Writes the fuzz targets' seed corpora into SEEDS/<target>/ from the converted tiny model MODEL
and the test fixtures: valid inputs of each kind and a few crafted ones. Prints the size of
MODEL's header (metadata and tensor table, up to its tensor data), which fuzz-model needs.

    python tools/fuzz/make_seeds.py MODEL SEEDS"""
from __future__ import annotations

import io
import struct
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "tiny-0.6b"


def write(folder: Path, name: str, data: bytes) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)


def model_seeds(model: Path, seeds: Path) -> int:
    from gguf import GGUFReader
    header_bytes = min(int(t.data_offset) for t in GGUFReader(str(model)).tensors)
    header = model.read_bytes()[:header_bytes]
    write(seeds / "fuzz-model", "header", header)
    write(seeds / "fuzz-model", "header-cut", header[: header_bytes // 2])
    write(seeds / "fuzz-model", "no-tensors", header[:8] + struct.pack("<Q", 0) + header[16:header_bytes // 4])
    write(seeds / "gguf_header", "header", header)
    write(seeds / "gguf_header", "empty-gguf", b"GGUF" + struct.pack("<IQQ", 3, 0, 0))
    return header_bytes


def synthesize_seeds(seeds: Path) -> None:
    rng = np.random.default_rng(1)
    write(seeds / "fuzz-synthesize", "zeros", bytes(512))
    # a plausible request: widths as the model's, 8 frames, 6 text ids, small embedding values
    head = bytes([1, 8, 1, 6, 4, 0])
    write(seeds / "fuzz-synthesize", "plausible", head + rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())
    write(seeds / "fuzz-synthesize", "wild", bytes([0, 200, 0, 15, 15, 7]) + bytes([255]) * 600)


def reference_seeds(seeds: Path) -> None:
    import soundfile as sf
    clip, rate = sf.read(str(FIXTURE / "reference" / "ref_24k.wav"), dtype="int16")
    clip = clip if clip.ndim == 1 else clip[:, 0]
    write(seeds / "fuzz-reference", "speech", bytes([2]) + struct.pack("<H", 12000) + clip[:48000].tobytes())
    write(seeds / "fuzz-reference", "nan", bytes([0x22]) + struct.pack("<H", 6000) + clip[:24000].tobytes())
    write(seeds / "fuzz-reference", "silence", bytes([4]) + struct.pack("<H", 8000))


def voice_seeds(seeds: Path) -> None:
    from vocable.library.voice import Voice
    embedding = np.load(FIXTURE / "reference" / "speaker_embedding.npy")
    codes = np.load(FIXTURE / "reference" / "ref_codes.npy").astype(np.int32)
    path = seeds / "voice_file" / "valid.voice"
    path.parent.mkdir(parents=True, exist_ok=True)
    Voice(embedding, codes, "Okay. Yeah.", name="seed", reference_seconds=3.0).save(path)
    valid = path.read_bytes()
    write(seeds / "voice_file", "x-vector-only", valid)
    write(seeds / "voice_file", "huge-header", struct.pack("<Q", 1 << 62) + valid[8:])
    write(seeds / "voice_file", "cut", valid[: len(valid) // 3])


def audio_seeds(seeds: Path) -> None:
    import soundfile as sf
    t = np.arange(2400) / 24000.0
    tone = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    for index, (fmt, subtype) in enumerate((("WAV", "PCM_16"), ("FLAC", "PCM_16"), ("OGG", "VORBIS"))):
        buffer = io.BytesIO()
        sf.write(buffer, tone, 24000, format=fmt, subtype=subtype)
        write(seeds / "audio_file", fmt.lower(), bytes([index]) + buffer.getvalue())
    buffer = io.BytesIO()
    sf.write(buffer, np.stack([tone, tone], axis=1), 48000, format="WAV", subtype="FLOAT")
    write(seeds / "audio_file", "stereo-float", bytes([0]) + buffer.getvalue())


def text_seeds(seeds: Path) -> None:
    texts = {"plain": "Hello there. How are you today?", "cjk": "你好，世界。今天天气很好！",
             "invisible": "\u200b" * 50 + "hi", "punctuation": "... --- !!! ???",
             "long": " ".join(["A sentence that goes on, and on; with clauses."] * 40),
             "mixed": "Dr. Smith paid $3.50 on 3/4/2025 at 10:30 a.m. — 50% off! 🎉\n\nNew paragraph."}
    for name, text in texts.items():
        write(seeds / "text", name, text.encode("utf-8"))


def main() -> None:
    model, seeds = Path(sys.argv[1]), Path(sys.argv[2])
    header_bytes = model_seeds(model, seeds)
    synthesize_seeds(seeds)
    reference_seeds(seeds)
    voice_seeds(seeds)
    audio_seeds(seeds)
    text_seeds(seeds)
    print(header_bytes)


if __name__ == "__main__":
    main()
