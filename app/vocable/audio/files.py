"""Reading audio files and preparing reference clips (no Qt, no engine)."""
from __future__ import annotations

import io
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import AudioError

ENGINE_RATE = 24000
MIN_REFERENCE_SECONDS = 1.0
MAX_REFERENCE_SECONDS = 60.0
# A reference keeps its first 60 s after its leading silence is trimmed (reference.py), so a
# longer file is read only that far, allowing this much silence before the speech starts.
REFERENCE_LEAD_SECONDS = 30.0
MIN_RATE, MAX_RATE = 1000, 768000
MAX_CHANNELS = 64
# A compressed file can decode to far more than its size (an hour of FLAC silence is a few KB):
# a read stops short of allocating more float32 samples than this.
MAX_DECODED_BYTES = 1 << 30
# Output files by extension: soundfile format and subtype.
FILE_FORMATS = {".wav": ("WAV", "PCM_16"), ".flac": ("FLAC", "PCM_16"), ".ogg": ("OGG", "VORBIS"),
                ".opus": ("OGG", "OPUS"), ".mp3": ("MP3", "MPEG_LAYER_III")}
# Opus encodes only these rates (libsndfile would fail with "Unspecified internal error")
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)


def check_sample_rate(sample_rate: object, context: str = "") -> int:
    """The rate as an int, or AudioError (prefixed by `context`) for one that is not an integer
    from MIN_RATE to MAX_RATE Hz."""
    if not (isinstance(sample_rate, (int, np.integer)) and MIN_RATE <= int(sample_rate) <= MAX_RATE):
        raise AudioError(f"{context}unsupported sample rate {sample_rate!r} Hz")
    return int(sample_rate)


def read_audio(path: str | Path) -> tuple[np.ndarray, int]:
    """Samples as float32 [frames, channels] and the sample rate of an audio file (WAV, FLAC,
    OGG/Vorbis/Opus, MP3 and whatever libsndfile reads). AudioError for anything that is not a
    readable audio file of 1 to MAX_CHANNELS channels at MIN_RATE to MAX_RATE Hz."""
    samples, rate, _ = _read(Path(path), None)
    return samples, rate


def read_reference(path: str | Path) -> tuple[np.ndarray, int, float]:
    """A reference clip's samples (float32 [frames, channels], at most the first
    MAX_REFERENCE_SECONDS + REFERENCE_LEAD_SECONDS: all a clone can use), its sample rate, and
    the whole file's length in seconds (for reference.check_reference's source_seconds)."""
    return _read(Path(path), MAX_REFERENCE_SECONDS + REFERENCE_LEAD_SECONDS)


def _read(path: Path, max_seconds: float | None) -> tuple[np.ndarray, int, float]:
    """(samples of the whole file or of its first `max_seconds`: nothing past them is decoded,
    rate, the whole file's seconds)."""
    import soundfile as sf

    try:
        if not path.exists():
            raise AudioError(f"audio file not found: {path}")
        if path.is_dir():
            raise AudioError(f"{path} is a folder, not an audio file")
        if not path.is_file():  # a FIFO would block the read for ever
            raise AudioError(f"{path} is not a regular file")
        if path.stat().st_size == 0:
            raise AudioError(f"{path} is empty (0 bytes)")
    except OSError as e:
        raise AudioError(f"cannot read {path}: {e.strerror or e}") from e
    try:
        with sf.SoundFile(str(path)) as f:
            rate, channels, frames = int(f.samplerate), int(f.channels), int(f.frames)
            if not MIN_RATE <= rate <= MAX_RATE:
                raise AudioError(f"{path.name} has an unsupported sample rate of {rate} Hz "
                                 f"({MIN_RATE} to {MAX_RATE} Hz are read)")
            if not 1 <= channels <= MAX_CHANNELS:
                raise AudioError(f"{path.name} has {channels} channels (1 to {MAX_CHANNELS} are read)")
            wanted = frames if max_seconds is None else min(frames, math.ceil(max_seconds * rate))
            if wanted * channels * 4 > MAX_DECODED_BYTES:
                raise AudioError(f"{path.name} holds {frames / rate / 60:.0f} min of audio in {channels} channel(s): "
                                 f"more than Vocable reads at once ({MAX_DECODED_BYTES >> 30} GiB of samples)")
            data = f.read(wanted, dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError, OSError) as e:
        raise AudioError(f"{path.name} is not a readable audio file ({_describe(e)}); "
                         "use WAV, FLAC, OGG or MP3") from e
    if data.shape[0] == 0:
        raise AudioError(f"{path.name} contains no audio samples")
    return data, rate, frames / rate


def write_audio(path: str | os.PathLike, samples: np.ndarray, sample_rate: int, subtype: str | None = None) -> Path:
    """Writes audio (float [n] mono or [n, channels], in -1..1) as WAV or FLAC (16 bit), OGG
    Vorbis, Opus (in Ogg) or MP3, by the file extension; atomically (a temporary file renamed into place).
    `subtype` overrides the format's default sample encoding (say "PCM_24" for FLAC).
    MP3 needs libsndfile 1.1 or newer; without it this raises an AudioError that says so."""
    import soundfile as sf

    from ..store import atomic_write_bytes

    path = Path(path)
    fmt, default_subtype = _file_format(path)
    x = np.asarray(samples)
    if x.ndim not in (1, 2) or x.size == 0:
        raise AudioError(f"cannot write {path.name}: no audio (shape {list(x.shape)})")
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise AudioError(f"cannot write {path.name}: audio samples must be numbers, got {x.dtype}")
    x = x.astype(np.float32, copy=False)
    if not np.all(np.isfinite(x)):
        raise AudioError(f"cannot write {path.name}: the audio has NaN or infinite samples")
    check_sample_rate(sample_rate, f"cannot write {path.name}: ")
    subtype = subtype or default_subtype
    if fmt not in sf.available_formats() or subtype not in sf.available_subtypes(fmt):
        raise AudioError(f"cannot write {path.name}: this libsndfile ({sf.__libsndfile_version__}) cannot write "
                         f"{path.suffix.lstrip('.').upper()} files (MP3 needs libsndfile 1.1 or newer, Opus 1.0.29); "
                         "save as WAV, FLAC or OGG instead")
    if subtype == "OPUS" and int(sample_rate) not in OPUS_RATES:
        raise AudioError(f"cannot write {path.name}: Opus takes {', '.join(map(str, OPUS_RATES))} Hz audio, "
                         f"not {int(sample_rate)} Hz")
    x = np.clip(x, -1.0, 1.0)  # integer and lossy encoders would wrap or distort beyond full scale
    # Encoded in memory, then written by Python: libsndfile reports a failed write as "System
    # error." without its cause, and its OGG writer ignores one (a full disk gave a cut file).
    encoded = io.BytesIO()
    try:
        sf.write(encoded, x, int(sample_rate), format=fmt, subtype=subtype)
    except (sf.LibsndfileError, RuntimeError, ValueError, TypeError) as e:
        raise AudioError(f"cannot write {path}: {_describe(e)}") from e
    try:
        atomic_write_bytes(path, encoded.getbuffer())
    except OSError as e:
        raise AudioError(f"cannot write {path}: {e.strerror or e}") from e
    return path


def _file_format(path: Path) -> tuple[str, str]:
    """(soundfile format, default subtype) for an output file name; AudioError for an unknown
    extension or a missing folder."""
    fmt = FILE_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise AudioError(f"cannot write {path.name}: unknown audio file type '{path.suffix}' "
                         f"(use {', '.join(FILE_FORMATS)})")
    if not path.parent.is_dir():
        raise AudioError(f"cannot write {path}: the folder {path.parent} does not exist")
    return fmt


def _describe(e: Exception) -> str:
    text = str(e).strip()
    return text.split(": ", 1)[-1] if text else type(e).__name__


@dataclass
class ReferenceClip:
    """A mono 24 kHz clip ready for the engine, and what was done to get it."""
    samples: np.ndarray  # float32 [n]
    sample_rate: int = ENGINE_RATE
    warnings: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.sample_rate


def prepare_reference(samples: np.ndarray, sample_rate: int) -> ReferenceClip:
    """Mixes down to mono, resamples to 24 kHz (soxr, high quality) and checks the clip.

    Refuses empty, non-finite or sub-second audio; keeps the first 60 s of a longer clip and
    says so in `warnings`."""
    import soxr

    x = np.asarray(samples)
    if x.ndim not in (1, 2):
        raise AudioError(f"audio must be [samples] or [samples, channels], got shape {list(x.shape)}")
    if not np.issubdtype(x.dtype, np.floating) and not np.issubdtype(x.dtype, np.integer):
        raise AudioError(f"audio samples must be numbers, got {x.dtype}")
    if np.issubdtype(x.dtype, np.integer):
        x = x.astype(np.float32) / float(np.iinfo(x.dtype).max)
    x = x.astype(np.float32, copy=False)
    if x.size == 0:
        raise AudioError("the reference audio is empty")
    check_sample_rate(sample_rate)
    if not np.all(np.isfinite(x)):
        bad = int(np.count_nonzero(~np.isfinite(x)))
        raise AudioError(f"the reference audio has {bad} NaN or infinite sample(s); it is damaged")
    mono = x.mean(axis=1) if x.ndim == 2 else x
    warnings: list[str] = []
    if x.ndim == 2 and x.shape[1] > 1:
        warnings.append(f"mixed {x.shape[1]} channels down to mono")
    if int(sample_rate) != ENGINE_RATE:
        mono = soxr.resample(mono, int(sample_rate), ENGINE_RATE, quality="HQ").astype(np.float32)
    seconds = len(mono) / ENGINE_RATE
    if seconds < MIN_REFERENCE_SECONDS:
        raise AudioError(f"the reference is {seconds:.2f} s long; at least {MIN_REFERENCE_SECONDS:.0f} s of speech "
                         "is needed (3 to 10 s works best)")
    if seconds > MAX_REFERENCE_SECONDS:
        mono = mono[: int(MAX_REFERENCE_SECONDS * ENGINE_RATE)]
        warnings.append(f"the reference is {seconds:.1f} s long; only the first {MAX_REFERENCE_SECONDS:.0f} s are used")
    return ReferenceClip(np.ascontiguousarray(mono, dtype=np.float32), ENGINE_RATE, warnings)
