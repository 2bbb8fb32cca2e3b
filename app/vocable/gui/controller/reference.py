"""The reference clip: a file, a recording or a saved voice becomes the voice to clone, embedded in
the background while the user types; the clone mode it allows, said before Generate runs."""
from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from ...errors import VocableError
from .. import workers
from ..workers import FunctionWorker

log = logging.getLogger("vocable.gui")

AUDIO_FILE_SUFFIXES = (".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aif", ".aiff", ".au", ".caf", ".w64")


@dataclass
class Reference:
    """The reference clip in use: checked (trimmed, 24 kHz mono) and its voice once embedded."""
    name: str
    samples: np.ndarray | None = None     # float32 mono, checked
    sample_rate: int = 24000
    check: object = None                  # reference.ReferenceCheck
    source: Path | None = None
    voice: object = None                  # vocable.Voice once embedded (or from the library)
    library_id: str | None = None         # set when the voice comes from the library
    # The embedding started in the background as soon as the clip was chosen, so that Generate
    # does not wait for it (a Generate clicked before it ends waits for it instead of redoing it).
    pending_voice: Future | None = None

    @property
    def seconds(self) -> float:
        if self.samples is not None and self.sample_rate:
            return self.samples.size / self.sample_rate
        return float(getattr(self.voice, "reference_seconds", 0.0) or 0.0)

    @property
    def warnings(self) -> list[str]:
        return list(getattr(self.check, "warnings", []) or [])


def recorder_max_seconds() -> float:
    try:
        from ...audio.recorder import MAX_RECORD_SECONDS
        return float(MAX_RECORD_SECONDS)
    except Exception:
        return 30.0


class ReferenceActions:
    """The controller's reference: `reference`, `transcript`, the reference player and the recorder."""

    @staticmethod
    def is_audio_file(path: Path) -> bool:
        return Path(path).suffix.lower() in AUDIO_FILE_SUFFIXES

    def load_reference_file(self, path: Path) -> None:
        """Reads and checks an audio file on a worker; it becomes the reference."""
        path = Path(path)
        from ...audio.files import read_reference
        from ...audio.reference import check_reference

        def load(_worker):
            samples, rate, seconds = read_reference(path)
            return check_reference(samples, rate, trim=True, source_seconds=seconds)

        self.status.emit(f"reading {path.name}...")
        workers.start(FunctionWorker(load, f"reading {path.name}"),
                      finished=lambda check: self._set_reference(Reference(path.stem, check.samples,
                                                                           check.sample_rate, check, path)),
                      failed=lambda message: self.error.emit("Cannot use this reference", message))

    def set_reference_samples(self, samples: np.ndarray, rate: int, name: str) -> None:
        """A recording becomes the reference (checked on a worker)."""
        from ...audio.reference import check_reference
        workers.start(FunctionWorker(lambda _w: check_reference(samples, rate, trim=True), "checking the recording"),
                      finished=lambda check: self._set_reference(Reference(name, check.samples, check.sample_rate,
                                                                           check)),
                      failed=lambda message: self.error.emit("Cannot use this recording", message))

    def _set_reference(self, reference: Reference) -> None:
        self.reference = reference
        self._embed_in_background(reference)
        self.reference_player.set_clip(reference.samples, reference.sample_rate)
        self.reference_changed.emit()
        self._update_mode()
        warn = f" ({len(reference.warnings)} warning(s))" if reference.warnings else ""
        self.status.emit(f"reference: {reference.name}, {reference.seconds:.1f} s{warn}")

    def _embed_in_background(self, ref: Reference) -> None:
        """Starts embedding a new clip with the model in use, while the user types."""
        engine = self.engine
        if engine is None or ref.voice is not None or ref.samples is None:
            ref.pending_voice = None
            return
        pending = ref.pending_voice = Future()
        samples, rate, name = ref.samples, ref.sample_rate, ref.name

        def embed(_worker):  # the future is settled here, so a waiting Generate need not wait for this thread's events
            try:
                voice = engine.embed_voice(samples, rate, name=name)
            except BaseException as e:
                pending.set_exception(e)
                raise
            pending.set_result(voice)
            return voice

        def embedded(voice) -> None:
            if engine is self.engine and ref.pending_voice is pending:
                self._voice_embedded(ref, voice)

        workers.start(FunctionWorker(embed, f"embedding {name}"), finished=embedded,
                      failed=lambda message: log.warning("embedding %s in the background failed (Generate tries "
                                                         "again and says why): %s", name, message))

    def clear_reference(self) -> None:
        self.reference = None
        self.reference_player.clear()
        self.reference_changed.emit()
        self._update_mode()

    def set_transcript(self, text: str) -> None:
        self.transcript = text
        self._update_mode()

    def clone_mode(self) -> tuple[str, str]:
        """The mode Generate will run, and why (the engine's rule, said before it runs)."""
        from ...engine import IN_CONTEXT, X_VECTOR
        if self.reference is None:
            return "", "Choose a reference voice: drop an audio file here, open one, record, or pick a saved voice."
        voice = self.reference.voice
        has_codes = voice is None or getattr(voice, "codes", None) is not None
        if not has_codes:
            return X_VECTOR, ("x-vector cloning: this saved voice has no reference codes, so the speaker embedding "
                              "alone is used.")
        if self.transcript.strip():
            return IN_CONTEXT, ("In-context cloning: with the transcript the model continues the reference speech "
                                "itself, which follows the voice most closely. The transcript must match what is said.")
        return X_VECTOR, ("x-vector cloning: no transcript, so only the speaker embedding is used. Type what the "
                          "reference says for in-context cloning, which follows the voice more closely.")

    def _update_mode(self) -> None:
        self.mode_changed.emit(*self.clone_mode())

    # -- recording -------------------------------------------------------------------------------------------

    @property
    def is_recording(self) -> bool:
        return self._recorder is not None

    def start_recording(self) -> None:
        if not self.audio.input:
            self.error.emit("Cannot record", self.audio.input_reason or "no audio input device")
            return
        if self._recorder is not None or self._record_starting:
            return
        from ...audio import recorder as recorder_module
        self._record_stop_reason = None
        device = self._device(self.settings.input_device)

        def stopped(reason: str) -> None:  # the audio thread: only note it, the timer acts
            self._record_stop_reason = reason

        def open_input(_worker):  # opening a device can take a moment: off the GUI thread
            recorder = recorder_module.Recorder(device, on_stopped=stopped)
            recorder.start()
            return recorder

        def failed(message: str) -> None:
            self._record_starting = False
            self.error.emit("Cannot record", message)

        self._record_starting = True
        self.reference_player.stop()
        workers.start(FunctionWorker(open_input, "opening the microphone"), finished=self._recording_started,
                      failed=failed)

    def _recording_started(self, recorder) -> None:
        self._record_starting = False
        if self._closed:
            recorder.stop()
            return
        self._recorder = recorder
        self._record_timer.start()
        self.recording.emit(True)
        self.status.emit(f"recording from '{getattr(recorder, 'device_name', '')}' "
                         f"(stops by itself after {recorder_max_seconds():.0f} s)")

    def stop_recording(self, reason: str = "stopped") -> None:
        recorder, self._recorder = self._recorder, None
        self._record_timer.stop()
        if recorder is None:
            return
        self.recording.emit(False)
        try:
            samples, rate = recorder.stop()
        except VocableError as e:
            self.error.emit("Recording failed", str(e))
            return
        if samples.size == 0:
            self.error.emit("Recording failed", reason if reason.startswith("device error") else "nothing was recorded")
            return
        if reason.startswith("device error"):  # what came before the failure is the user's take: kept
            self.error.emit("Recording cut short", f"{reason}; the {samples.size / rate:.1f} s recorded before it are "
                                                   "kept as the reference")
        note = " (reached the maximum length)" if reason == "max length" else ""
        self.status.emit(f"recorded {samples.size / rate:.1f} s{note}")
        self.set_reference_samples(samples, rate, f"recording {datetime.now():%Y-%m-%d %H:%M}")

    def _record_tick(self) -> None:
        recorder = self._recorder
        if recorder is None:
            return
        self.record_level.emit(float(recorder.level_db), float(recorder.elapsed))
        if self._record_stop_reason is not None or not recorder.running:
            # the recorder sets its reason before it stops running, so a tick that runs before
            # on_stopped still reports a device error or the length limit as such
            self.stop_recording(self._record_stop_reason or recorder.stop_reason or "stopped")
