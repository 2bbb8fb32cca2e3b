"""A cloned voice: the speaker embedding and reference codes of a clip, and its file format.

A voice file is safetensors: a JSON header and raw numbers, nothing executable. Its metadata
(strings) says it is a Vocable voice and holds the name, the transcript, the model and the
reference length; its tensors are "speaker_embedding" (F32 [D]) and, optionally, "codes" (I32
[frames, 16], the reference's codec codes).

Files are never trusted: read_voice_file bounds the size before anything is parsed, and checks the
metadata, the tensors' names, types and shapes, that the embedding is finite and that every code
lies in its codebook. A file that fails any check raises VoiceError saying what is wrong.

    voice.save("grandma.safetensors")
    voice = Voice.load("grandma.safetensors")
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import VoiceError

VOICE_FORMAT = "vocable-voice"
VOICE_FORMAT_VERSION = 1

# The 12 Hz speech tokenizer of every Qwen3-TTS Base model: 16 codebooks of 2048 codes (the
# engine's model_info "n_codebooks" and "codebook_size").
N_CODEBOOKS = 16
CODEBOOK_SIZE = 2048

MAX_FILE_BYTES = 8 << 20          # a voice is ~10 KB (embedding) + 64 B per second of codes
MAX_REF_TEXT_CHARS = 20000
MAX_MODEL_NAME_CHARS = 64
MAX_EMBEDDING = 16384             # speaker embedding length (the models use 1024 and 2048)
MAX_CODE_FRAMES = 4096            # 5.5 min at 12.5 frames/s (references are capped at 60 s)
MAX_REFERENCE_SECONDS = 24 * 3600
MAX_METADATA_CHARS = 4 * MAX_REF_TEXT_CHARS
MAX_CLIPS = 100                   # reference clips averaged into one speaker embedding
_TENSORS = {"speaker_embedding": ("F32", 1), "codes": ("I32", 2)}   # name: (dtype, dimensions)


@dataclass
class Voice:
    speaker_embedding: np.ndarray           # float32 [D]
    codes: np.ndarray | None = None         # int32 [frames, codebooks]: the reference codes
    ref_text: str | None = None             # transcript of the reference (in-context cloning)
    name: str = ""
    model_variant: str = ""                 # the model the voice was made with ("0.6B", ...)
    reference_seconds: float = 0.0          # of the clip in-context cloning continues
    warnings: list[str] = field(default_factory=list)
    clips: int = 1                          # reference clips the speaker embedding averages

    def __post_init__(self):
        self.speaker_embedding = np.ascontiguousarray(self.speaker_embedding, dtype=np.float32)
        if self.speaker_embedding.ndim != 1 or self.speaker_embedding.size == 0:
            raise VoiceError(f"speaker embedding must be a non-empty vector, got shape {list(self.speaker_embedding.shape)}")
        if self.codes is not None:
            self.codes = np.ascontiguousarray(self.codes, dtype=np.int32)
            if self.codes.ndim != 2:
                raise VoiceError(f"reference codes must be [frames, codebooks], got shape {list(self.codes.shape)}")

    def save(self, path: str | Path) -> Path:
        """Writes the voice file atomically (VoiceError naming the file and the cause)."""
        path = Path(path)
        write_voice_file(path, self)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Voice":
        """The voice in a file, checked (VoiceError saying what is wrong with it)."""
        return read_voice_file(Path(path))[0]


def check_voice(voice: Voice, what: str) -> None:
    """The limits every voice file meets: checked before a file is written and after it is read.
    `what` begins the message (the file name, or what was being done)."""
    emb = voice.speaker_embedding
    if not 1 <= emb.size <= MAX_EMBEDDING:
        raise VoiceError(f"{what}: the speaker embedding has {emb.size} values (1 to {MAX_EMBEDDING} expected)")
    if not np.all(np.isfinite(emb)):
        raise VoiceError(f"{what}: the speaker embedding has NaN or infinite values")
    if voice.codes is not None:
        c = voice.codes
        if not (1 <= c.shape[0] <= MAX_CODE_FRAMES and c.shape[1] == N_CODEBOOKS):
            raise VoiceError(f"{what}: reference codes of shape {list(c.shape)} (expected 1 to {MAX_CODE_FRAMES} "
                             f"frames of {N_CODEBOOKS} codebooks)")
        low, high = int(c.min()), int(c.max())
        if low < 0 or high >= CODEBOOK_SIZE:
            raise VoiceError(f"{what}: reference codes out of range ({low} to {high}; a codebook has codes 0 to "
                             f"{CODEBOOK_SIZE - 1})")
    if voice.ref_text is not None and len(voice.ref_text) > MAX_REF_TEXT_CHARS:
        raise VoiceError(f"{what}: the reference transcript is longer than {MAX_REF_TEXT_CHARS} characters")
    if len(voice.model_variant) > MAX_MODEL_NAME_CHARS:
        raise VoiceError(f"{what}: the model name is too long")
    if not (isinstance(voice.clips, int) and 1 <= voice.clips <= MAX_CLIPS):
        raise VoiceError(f"{what}: invalid number of reference clips {voice.clips!r} (1 to {MAX_CLIPS})")
    if not (math.isfinite(voice.reference_seconds) and 0 <= voice.reference_seconds <= MAX_REFERENCE_SECONDS):
        raise VoiceError(f"{what}: invalid reference length {voice.reference_seconds!r}")


def read_voice_file(path: Path) -> tuple[Voice, dict[str, str]]:
    """Reads and checks an untrusted voice file: (the voice, its metadata). VoiceError with the
    reason when it is not a well-formed Vocable voice."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    what = path.name
    try:
        if not path.exists():
            raise VoiceError(f"voice file not found: {path}")
        if not path.is_file():
            raise VoiceError(f"{path} is not a file")
        size = path.stat().st_size
    except OSError as e:
        raise VoiceError(f"cannot read {path}: {e.strerror or e}") from e
    if size > MAX_FILE_BYTES:
        raise VoiceError(f"{what} is {size / 2**20:.1f} MiB; a voice file is far smaller "
                         f"(at most {MAX_FILE_BYTES >> 20} MiB): it is not a Vocable voice")
    if size < 16:
        raise VoiceError(f"{what} is not a Vocable voice file (only {size} bytes)")
    try:
        with open(path, "rb") as f:
            head = f.read(9)
        header_len = int.from_bytes(head[:8], "little")
        if header_len > size - 8 or head[8:9] != b"{":
            raise VoiceError(f"{what} is not a Vocable voice file (not a safetensors file)")
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            if meta.get("format") != VOICE_FORMAT:
                raise VoiceError(f"{what} is not a Vocable voice file (no Vocable voice metadata)")
            if sum(len(k) + len(v) for k, v in meta.items()) > MAX_METADATA_CHARS:
                raise VoiceError(f"{what} has oversized metadata: it is not a Vocable voice")
            version = meta.get("version", "")
            if not (version.isascii() and version.isdigit() and len(version) <= 9):
                raise VoiceError(f"{what} has an invalid voice format version {version[:20]!r}")
            if int(version) > VOICE_FORMAT_VERSION:
                raise VoiceError(f"{what} was written by a newer Vocable (voice format {version}); update Vocable")
            keys = set(f.keys())
            if "speaker_embedding" not in keys:
                raise VoiceError(f"{what} has no speaker embedding")
            unexpected = keys - _TENSORS.keys()
            if unexpected:
                raise VoiceError(f"{what} has unexpected tensors ({', '.join(sorted(unexpected))[:200]})")
            for key in keys:
                sl = f.get_slice(key)
                dtype, shape = sl.get_dtype(), sl.get_shape()
                if (dtype, len(shape)) != _TENSORS[key]:
                    raise VoiceError(f"{what}: {key} is {dtype} {list(shape)}, expected {_TENSORS[key][0]} with "
                                     f"{_TENSORS[key][1]} dimension(s)")
            embedding = f.get_tensor("speaker_embedding")
            codes = f.get_tensor("codes") if "codes" in keys else None
    except (SafetensorError, OSError, ValueError, TypeError, KeyError, OverflowError) as e:
        raise VoiceError(f"{what} is not a readable voice file ({e})") from e
    try:
        seconds = float(meta.get("reference_seconds", "0") or 0)
    except ValueError:
        raise VoiceError(f"{what} has an invalid reference length") from None
    ref_text = meta.get("ref_text", "") if meta.get("has_ref_text") == "true" else None
    clips = meta.get("clips", "1")
    if not (clips.isdigit() and len(clips) <= 3):
        raise VoiceError(f"{what} has an invalid number of reference clips")
    try:
        voice = Voice(embedding, codes, ref_text, meta.get("name", ""), meta.get("model_variant", ""), seconds,
                      clips=int(clips))
    except VoiceError as e:
        raise VoiceError(f"{what}: {e}") from None
    check_voice(voice, what)
    return voice, meta


def write_voice_file(path: Path, voice: Voice, metadata: dict[str, str] | None = None) -> None:
    """Writes the voice atomically, after check_voice; `metadata` adds keys or replaces the
    voice's own (the library's name and "created"). VoiceError naming the file and the cause."""
    from safetensors import SafetensorError
    from safetensors.numpy import save

    from ..store import atomic_write_bytes

    check_voice(voice, f"cannot write the voice file {path}")
    tensors = {"speaker_embedding": voice.speaker_embedding}
    if voice.codes is not None:
        tensors["codes"] = voice.codes
    meta = {"format": VOICE_FORMAT, "version": str(VOICE_FORMAT_VERSION), "name": voice.name,
            "ref_text": voice.ref_text or "", "has_ref_text": "true" if voice.ref_text is not None else "false",
            "model_variant": voice.model_variant, "reference_seconds": repr(float(voice.reference_seconds)),
            "clips": str(voice.clips), **(metadata or {})}
    try:
        data = save(tensors, metadata=meta)
    except SafetensorError as e:
        raise VoiceError(f"cannot write the voice file {path}: {e}") from e
    try:
        atomic_write_bytes(path, data)
    except OSError as e:
        raise VoiceError(f"cannot write the voice file {path}: {e.strerror or e}") from e
