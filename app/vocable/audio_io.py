"""Reading audio files and preparing reference clips (no Qt, no engine)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import AudioError

ENGINE_RATE = 24000
MIN_REFERENCE_SECONDS = 1.0
MAX_REFERENCE_SECONDS = 60.0


def read_audio(path: str | Path) -> tuple[np.ndarray, int]:
    """Samples as float32 [frames, channels] and the sample rate of an audio file
    (WAV, FLAC, OGG/Vorbis/Opus, MP3 and whatever libsndfile reads)."""
    import soundfile as sf

    path = Path(path)
    if not path.exists():
        raise AudioError(f"audio file not found: {path}")
    if path.is_dir():
        raise AudioError(f"{path} is a folder, not an audio file")
    if path.stat().st_size == 0:
        raise AudioError(f"{path} is empty (0 bytes)")
    try:
        data, rate = sf.read(str(path), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as e:
        raise AudioError(f"{path.name} is not a readable audio file ({_describe(e)}); "
                         "use WAV, FLAC, OGG or MP3") from e
    if data.shape[0] == 0:
        raise AudioError(f"{path.name} contains no audio samples")
    return data, int(rate)


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
    if not (isinstance(sample_rate, (int, np.integer)) and 1000 <= int(sample_rate) <= 768000):
        raise AudioError(f"unsupported sample rate {sample_rate!r} Hz")
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
