"""Whisper through faster-whisper (CTranslate2, int8 on the CPU): audio in, text and language out.

    transcriber = Transcriber(find_whisper_model())
    transcript = transcriber.transcribe(samples, sample_rate)   # Transcript(text, language, ...)
"""
from __future__ import annotations

import logging
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ModelError, VocableError
from ..library import paths

log = logging.getLogger("vocable.asr")

WHISPER_RATE = 16000
# Audio goes to Whisper in windows of this length: its features for the whole input are made at
# once, about 40 MB per minute (an hour's result, checked, would take gigabytes).
WINDOW_SEC = 300.0
WHISPER_ENV = "VOCABLE_WHISPER_MODEL"    # a model folder, before the store's
MODEL_FILES = ("model.bin", "config.json")
# Whisper's language codes, for the languages the TTS model knows by name
TTS_LANGUAGES = {"en": "english", "de": "german", "es": "spanish", "zh": "chinese", "ja": "japanese",
                 "fr": "french", "ko": "korean", "ru": "russian", "it": "italian", "pt": "portuguese"}
INSTALL_HINT = "speech recognition needs faster-whisper: pip install 'vocable[asr]'"
BUNDLE_HINT = ("speech recognition is not part of this bundle (faster-whisper needs PyAV, whose FFmpeg carries GPL "
               "code); install Vocable with pip to use it: pip install 'vocable[asr]'")


def is_whisper_folder(folder: Path) -> bool:
    return folder.is_dir() and all((folder / name).is_file() for name in MODEL_FILES)


def installed_whisper_models() -> list[Path]:
    """The Whisper models the store holds, by name."""
    root = paths.whisper_dir()
    try:
        return sorted(p for p in root.iterdir() if is_whisper_folder(p))
    except OSError:
        return []


def find_whisper_model(wanted: str | os.PathLike | None = None) -> Path:
    """The model folder to use: `wanted` (a folder, or a name in the store), else
    $VOCABLE_WHISPER_MODEL, else the first in the store. ModelError saying how to get one."""
    if wanted:
        folder = Path(wanted)
        if is_whisper_folder(folder):
            return folder
        named = paths.whisper_dir() / str(wanted)
        if is_whisper_folder(named):
            return named
        raise ModelError(f"no Whisper model '{wanted}' (neither a folder with {' and '.join(MODEL_FILES)} nor one "
                         f"in {paths.whisper_dir()}); get one with `vocable whisper-download {wanted}`")
    env = os.environ.get(WHISPER_ENV)
    if env:
        if is_whisper_folder(Path(env)):
            return Path(env)
        raise ModelError(f"{WHISPER_ENV}={env} is not a Whisper model folder (it needs {' and '.join(MODEL_FILES)})")
    installed = installed_whisper_models()
    if installed:
        return installed[0]
    raise ModelError("no speech recognition model yet: download one (about 75 MB for 'tiny', 145 MB for 'base') "
                     "with `vocable whisper-download` or in the app (Model > Download speech recognition)")


@dataclass(frozen=True)
class Transcript:
    text: str
    language: str              # Whisper's code: "en"
    language_probability: float
    seconds: float             # audio length

    @property
    def tts_language(self) -> str:
        """The language as the TTS model names it ("english"), or "auto" for one it does not know."""
        return TTS_LANGUAGES.get(self.language, "auto")


class Transcriber:
    """A loaded Whisper model. transcribe() may be called from any thread, one call at a time."""

    def __init__(self, model_dir: str | os.PathLike, threads: int | None = None):
        try:
            from faster_whisper import WhisperModel
        except ImportError:
            raise VocableError(BUNDLE_HINT if getattr(sys, "frozen", False) else INSTALL_HINT) from None
        self.model_dir = Path(model_dir)
        try:
            self._model = WhisperModel(str(self.model_dir), device="cpu", compute_type="int8",
                                       cpu_threads=threads or 0)
        except Exception as e:  # CTranslate2 says what is wrong with the folder in its own words
            raise ModelError(f"cannot load the Whisper model in {self.model_dir}: {e}") from e
        self.english_only = not self._model.model.is_multilingual
        self._lock = threading.Lock()

    def transcribe(self, samples: np.ndarray, sample_rate: int, language: str | None = None) -> Transcript:
        """The speech in mono or multichannel audio at any rate. `language`: Whisper's code, or
        None to detect it."""
        import soxr

        if self.english_only and language not in (None, "en"):
            raise VocableError(f"the Whisper model in {self.model_dir} knows English only, not '{language}': "
                               "use a multilingual one (tiny, base, small: `vocable whisper-download base`)")
        x = np.asarray(samples, dtype=np.float32)
        if x.ndim == 2:
            x = x.mean(axis=1)
        if x.size == 0:
            raise VocableError("there is no audio to transcribe")
        if int(sample_rate) != WHISPER_RATE:
            x = soxr.resample(x, int(sample_rate), WHISPER_RATE, quality="HQ").astype(np.float32)
        window = int(WINDOW_SEC * WHISPER_RATE)
        texts, info = [], None
        with self._lock:
            for start in range(0, x.size, window):   # the first window's language holds for the rest
                wanted = "en" if self.english_only else (language or (info.language if info else None))
                segments, heard = self._model.transcribe(x[start:start + window], language=wanted, beam_size=5,
                                                         condition_on_previous_text=False)
                texts.append(" ".join(s.text.strip() for s in segments).strip())
                info = info or heard
        text = " ".join(t for t in texts if t)
        log.info("transcribed %.1f s of audio (%s, p=%.2f)", x.size / WHISPER_RATE, info.language,
                 info.language_probability)
        return Transcript(text, info.language, float(info.language_probability), x.size / WHISPER_RATE)
