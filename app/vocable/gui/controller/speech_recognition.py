"""Speech recognition in the app: the reference's transcript filled in (the user may edit it),
with its language, so in-context cloning runs without typing; the optional check of each result
(word error rate against the text, speaker similarity to the voice); the Whisper model's download
through the same model task as the TTS model's (progress, cancel, a clear offline message)."""
from __future__ import annotations

import logging
import threading

from .. import workers
from ..workers import FunctionWorker

log = logging.getLogger("vocable.gui")


class SpeechRecognitionActions:
    """The controller's Whisper model (loaded once, on a worker) and what it is used for."""

    _transcriber = None
    _transcriber_lock = threading.Lock()   # a transcription and a check may ask for it at once

    def _load_transcriber(self):
        """The Whisper model, loaded at first use (on a worker thread)."""
        from ...asr.transcriber import Transcriber, find_whisper_model
        path = find_whisper_model(self.settings.whisper_model)
        with self._transcriber_lock:
            if self._transcriber is None or self._transcriber.model_dir != path:
                self._transcriber = Transcriber(path, self.settings.threads)
            return self._transcriber

    def transcribe_reference(self) -> None:
        """Fills in the transcript of the reference clip (and says its language)."""
        ref = self.reference
        if ref is None or ref.samples is None:
            self.error.emit("Nothing to transcribe", "Choose a reference clip first (a saved voice keeps no audio).")
            return
        samples, rate = ref.samples, ref.sample_rate

        def work(_worker):
            return self._load_transcriber().transcribe(samples, rate)

        def done(heard) -> None:
            if self.reference is not ref:
                return   # another clip came meanwhile
            if not heard.text:
                self.error.emit("No words heard", "Speech recognition heard no words in the reference.")
                return
            self.set_transcript(heard.text)
            self.reference_changed.emit()
            if heard.tts_language in self.languages:
                self.language_heard.emit(heard.tts_language)
            self.status.emit(f"transcribed the reference ({heard.tts_language if heard.tts_language != 'auto' else heard.language}): "
                             "check the words, then generate")

        self.status.emit("transcribing the reference...")
        workers.start(FunctionWorker(work, "transcribing the reference"), finished=done,
                      failed=lambda message: self.error.emit("Cannot transcribe the reference", message))

    def check_result(self, result, text: str, voice) -> None:
        """Transcribes a result and compares it with its text and voice; says so in `result_checked`."""
        engine = self.engine

        def work(_worker):
            from ...asr import check_output
            return check_output(self._load_transcriber(), text, result.audio, result.sample_rate, engine, voice)

        def done(checked) -> None:
            if self.result is result:
                self.result_checked.emit(checked)
            if not checked.ok:
                self.status.emit("the check flagged the result: " + "; ".join(checked.flags))

        workers.start(FunctionWorker(work, "checking the result"), finished=done,
                      failed=lambda message: self.error.emit("Cannot check the result", message))

    def download_whisper(self, name: str | None = None) -> None:
        from ...engine.models import DEFAULT_WHISPER
        name = name or DEFAULT_WHISPER

        def finished(folder) -> None:
            self.settings.whisper_model = folder.name
            self._save_settings()
            self.status.emit(f"speech recognition model {folder.name} is ready")

        self._run_model_task(lambda progress, cancel: self.models.download_whisper(name, progress, cancel),
                             f"downloading the speech recognition model {name}", finished)
