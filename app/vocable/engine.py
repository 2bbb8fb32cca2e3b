"""The engine wrapper: loads a converted model and turns reference audio into voices.

No Qt here; the GUI drives this from a worker thread. The native calls release the GIL."""
from __future__ import annotations

import logging
import os
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import _engine
from .audio_io import prepare_reference
from .errors import ModelError, SynthesisCancelled, VocableError
from .voice import Voice

X_VECTOR = "x-vector"
IN_CONTEXT = "in-context"


@dataclass
class SynthesisResult:
    """The codec codes of a synthesized text (audio decoding comes with the codec decoder)."""
    codes: np.ndarray     # int32 [frames, 16], 12.5 frames per second of audio
    mode: str             # X_VECTOR or IN_CONTEXT
    mode_reason: str      # why that mode ran, in words
    reached_eos: bool     # False: the frame cap stopped generation
    seed: int             # the seed used (pass it back to reproduce the run)

    @property
    def seconds(self) -> float:
        return self.codes.shape[0] / 12.5

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
        self._tokenizer = None

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

    @property
    def tokenizer(self):
        """The model's text tokenizer (read from the model file on first use)."""
        if self._tokenizer is None:
            from .text import TextTokenizer
            self._tokenizer = TextTokenizer.from_gguf(self.model_path)
        return self._tokenizer

    def synthesize(self, text: str, voice: Voice, language: str = "auto", ref_text: str | None = None, *,
                   temperature: float = 0.9, top_k: int = 50, top_p: float = 1.0, repetition_penalty: float = 1.05,
                   seed: int | None = None, max_frames: int | None = None, greedy: bool = False,
                   on_frame=None) -> SynthesisResult:
        """Generates the codec codes of `text` in `voice`.

        In-context cloning runs when the voice carries reference codes and a transcript is known
        (`ref_text`, or the one saved with the voice); otherwise the speaker embedding alone is
        used (x-vector). `greedy` (or temperature 0) picks the most likely codes; a seed makes a
        sampled run reproducible (a random one is drawn and reported when None). The default
        frame cap is _engine.default_max_frames(number of text tokens). `on_frame(index, codes)`
        is called from the engine as each frame is generated (codes int32 [1, 16]); returning
        False stops the synthesis (SynthesisCancelled)."""
        prompt = self.tokenizer.target_prompt(text)
        transcript = ref_text if ref_text is not None and ref_text.strip() else voice.ref_text
        ref_codes = ref_ids = None
        if voice.codes is not None and transcript:
            mode, reason = IN_CONTEXT, "the voice has reference codes and a transcript"
            ref_codes = voice.codes
            ref_ids = np.asarray(self.tokenizer.ref_prompt(transcript).ids, dtype=np.int32)
        elif voice.codes is None:
            mode, reason = X_VECTOR, "the voice has no reference codes"
        else:
            mode, reason = X_VECTOR, "no transcript of the reference was given"
        if seed is None:
            seed = secrets.randbits(63)
        if greedy:
            temperature = 0.0
        talker = dict(temperature=temperature, top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty)
        predictor = dict(temperature=temperature, top_k=top_k, top_p=top_p)
        if max_frames is not None and max_frames < 1:
            raise ValueError("max_frames must be at least 1")
        try:
            with self._lock:
                codes, eos = self._ctx.synthesize(
                    np.asarray(prompt.ids, dtype=np.int32), voice.speaker_embedding, ref_codes, ref_ids,
                    language.lower(), talker, predictor, int(seed), int(max_frames or 0), on_frame)
        except _engine.EngineError as e:
            if e.args[1] == _engine.STATUS_CANCELLED:
                raise SynthesisCancelled("synthesis cancelled") from e
            raise VocableError(f"cannot synthesize: {e.args[0]}") from e
        return SynthesisResult(codes, mode, reason, bool(eos), int(seed))

    def cancel(self) -> None:
        """Stops a synthesize() running on another thread (it raises SynthesisCancelled)."""
        self._ctx.cancel()
