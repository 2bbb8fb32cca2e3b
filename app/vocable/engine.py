"""The engine wrapper: loads a converted model and turns reference audio into voices.

No Qt here; the GUI drives this from a worker thread. The native calls release the GIL."""
from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import numpy as np

from . import _engine
from .audio_io import prepare_reference
from .errors import ModelError, VocableError
from .voice import Voice

log = logging.getLogger("vocable.engine")

_LEVELS = {0: logging.DEBUG, 1: logging.INFO, 2: logging.WARNING, 3: logging.ERROR}


def _forward_log(level: int, text: str) -> None:
    log.log(_LEVELS.get(level, logging.INFO), "%s", text)


class Engine:
    """A loaded model. Calls from several threads are serialised (a context computes one
    request at a time); use one Engine per thread for parallel work."""

    def __init__(self, model_path: str | os.PathLike, threads: int | None = None, dump_dir: str | os.PathLike | None = None):
        path = Path(model_path)
        if not path.is_file():
            raise ModelError(f"model file not found: {path}" + (" (it is a folder: convert it first with "
                                                                "`vocable convert`)" if path.is_dir() else ""))
        if threads is not None and threads < 1:
            raise ValueError("threads must be at least 1")
        if dump_dir is not None:
            Path(dump_dir).mkdir(parents=True, exist_ok=True)
        try:
            self._ctx = _engine.Context(str(path), threads or 0, str(dump_dir) if dump_dir else None, _forward_log)
        except _engine.EngineError as e:
            raise ModelError(e.args[0]) from e
        self.model_path = path
        self.info: dict = self._ctx.model_info()
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._ctx.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def sample_rate(self) -> int:
        return int(self.info["sample_rate"])

    def embed_voice(self, samples: np.ndarray, sample_rate: int, ref_text: str | None = None, name: str = "") -> Voice:
        """The voice of a reference clip: any sample rate, mono or multichannel (mixed down),
        1 to 60 s (longer clips keep their first 60 s; see Voice.warnings)."""
        clip = prepare_reference(samples, sample_rate)
        try:
            with self._lock:
                embedding, codes = self._ctx.extract_voice_ref(clip.samples)
        except _engine.EngineError as e:
            raise VocableError(f"cannot embed the reference voice: {e.args[0]}") from e
        text = ref_text.strip() if ref_text and ref_text.strip() else None
        return Voice(embedding, codes, text, name, self.info["variant"], clip.seconds, clip.warnings)
