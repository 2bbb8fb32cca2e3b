"""The app's state and actions, without widgets: the main window calls these and redraws on
the signals. Engine work, file reading, conversion and downloads run on workers (workers.py);
the controller only starts them and takes their results on the GUI thread.

Every failure ends up in `error` (a title and a message for a dialog) or `status` (a line for the
status bar); nothing raised by an action escapes to Qt.
"""
from __future__ import annotations

import logging
import os
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np
from PySide6.QtCore import QObject, QTimer, Signal, Slot

from ..engine import runaway
from ..about import model_license
from ..errors import AudioDeviceError, ModelError, VocableError
from ..engine.models import DEFAULT_REPO
from . import workers
from .clip_player import ClipPlayer
from .workers import (EmbedWorker, FunctionWorker, LoadModelWorker, ModelTaskWorker, SynthesisRequest,
                      SynthesisWorker)

log = logging.getLogger("vocable.gui")

AUDIO_FILE_SUFFIXES = (".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aif", ".aiff", ".au", ".caf", ".w64")
EXPORT_FORMATS = ("wav", "flac", "ogg", "mp3")
# Set to 1 to run without audio devices (no recording, no playback), as on a machine without any.
NO_AUDIO_ENV = "VOCABLE_NO_AUDIO"


@dataclass
class AudioAvailability:
    output: bool = False
    input: bool = False
    output_reason: str = ""
    input_reason: str = ""
    outputs: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)


def _device_names(list_devices, what: str) -> tuple[list[str], str]:
    """The names `list_devices()` gives, and in words why there are none ("" when there are)."""
    try:
        names = list_devices()
    except AudioDeviceError as e:
        return [], str(e)
    except Exception as e:  # a broken audio stack must not stop the app
        log.exception("cannot list %s devices", what)
        return [], f"cannot list {what} devices: {e}"
    return names, "" if names else f"no {what} device was found (no sound card, or no sound server running)"


def query_audio_devices() -> AudioAvailability:
    """Which audio devices exist, and in words why there are none (never raises)."""
    a = AudioAvailability()
    if os.environ.get(NO_AUDIO_ENV, "") not in ("", "0"):
        a.output_reason = a.input_reason = f"audio is turned off ({NO_AUDIO_ENV} is set)"
        return a
    from ..audio.playback import output_devices
    from ..audio.recorder import input_devices
    a.outputs, a.output_reason = _device_names(output_devices, "audio output")
    a.inputs, a.input_reason = _device_names(input_devices, "microphone or other audio input")
    a.output, a.input = bool(a.outputs), bool(a.inputs)
    return a


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


class Controller(QObject):
    # model
    model_state = Signal(str, str)          # "none" | "loading" | "ready" | "error", and a description
    languages_changed = Signal(list)
    model_task = Signal(str, float, str)    # "running" | "finished" | "failed" | "cancelled", fraction, text
    # reference and mode
    reference_changed = Signal()
    mode_changed = Signal(str, str)         # mode ("in-context" | "x-vector" | ""), explanation
    # generation
    generating = Signal(bool)
    progress_text = Signal(str)
    result_ready = Signal(object)           # SynthesisResult (or None when cleared)
    # recording
    recording = Signal(bool)
    record_level = Signal(float, float)     # dBFS, elapsed seconds
    # stores
    library_changed = Signal()
    history_changed = Signal()
    settings_changed = Signal()
    audio_changed = Signal()
    # reporting
    status = Signal(str)
    error = Signal(str, str)                # title, message

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        from ..library.history import History
        from ..library.voices import VoiceLibrary
        from ..engine.models import ModelStore
        from ..library.settings import Settings

        self.settings = Settings.load()
        self.models = ModelStore()
        self.library = VoiceLibrary()
        self.history = History()
        self.audio = AudioAvailability(output_reason="looking for audio devices...",
                                       input_reason="looking for audio devices...")
        self.audio_known = False
        self.engine = None
        self.model_path: Path | None = None
        self.model_description = ""
        self.model_status = "none"
        self.languages: list[str] = []
        self.reference: Reference | None = None
        self.transcript = ""
        self.result = None                          # SynthesisResult of the last generation
        self.result_text = ""
        self.result_history_id: str | None = None   # set when the result view shows a history entry
        self.reference_player = ClipPlayer(self)
        self.result_player = ClipPlayer(self)
        self._synthesis: SynthesisWorker | None = None
        self._synthesis_reference: Reference | None = None
        self._model_worker: workers.Worker | None = None
        self._model_task: ModelTaskWorker | None = None
        self._recorder = None
        self._record_timer = QTimer(self)
        self._record_timer.setInterval(50)
        self._record_timer.timeout.connect(self._record_tick)
        self._record_stop_reason: str | None = None
        self._record_starting = False
        self._closed = False
        self.persist_settings = True               # False for --selftest: the user's settings stay as they are
        self._stats_timer = QTimer(self)
        self._stats_timer.setInterval(200)
        self._stats_timer.timeout.connect(self._stats_tick)
        for player in (self.reference_player, self.result_player):
            player.error.connect(self._on_player_error)

    @Slot(str)
    def _on_player_error(self, message: str) -> None:
        self.error.emit("Cannot play audio", message)

    # -- start and end -------------------------------------------------------------------------------

    def start(self) -> None:
        """Finds the audio devices and loads the model from the settings (if any)."""
        self.refresh_audio()
        path = self.settings.model_path
        if path and Path(path).is_file():
            self.load_model(Path(path))
        else:
            if path:
                self.status.emit(f"the model in the settings is gone: {path}")
            entries = self._model_entries()
            if entries:
                self.load_model(entries[0].path)
            else:
                self._set_model_state("none", "no model yet")

    def shutdown(self) -> None:
        """Stops everything running (at window close)."""
        self._closed = True
        self.stop()
        self.cancel_model_task()
        if self._recorder is not None:
            try:
                self._recorder.stop()
            except Exception:
                pass
            self._recorder = None
        self.reference_player.stop()
        self.result_player.stop()
        workers.wait_all(15.0)
        if self.engine is not None:
            try:
                self.engine.close()
            except Exception:
                log.exception("closing the engine")
            self.engine = None

    def refresh_audio(self, wait: bool = False) -> None:
        """Looks for audio devices on a worker (PortAudio's first look can take a moment);
        `audio_changed` tells when the answer is in. `wait`: here and now."""
        if wait:
            self._apply_audio(query_audio_devices())
            return
        workers.start(FunctionWorker(lambda _w: query_audio_devices(), "listing the audio devices"),
                      finished=self._apply_audio,
                      failed=lambda message: self._apply_audio(AudioAvailability(
                          output_reason=message, input_reason=message)))

    def _apply_audio(self, audio: AudioAvailability) -> None:
        self.audio = audio
        self.audio_known = True
        for player in (self.reference_player, self.result_player):
            player.available = self.audio.output
            player.unavailable_reason = self.audio.output_reason
            player.device = self._device(self.settings.output_device)
        if not self.audio.output:
            log.info("playback disabled: %s", self.audio.output_reason)
        if not self.audio.input:
            log.info("recording disabled: %s", self.audio.input_reason)
        self.audio_changed.emit()

    @staticmethod
    def _device(name: str | None):
        return int(name) if name and name.isdigit() else (name or None)

    # -- models -----------------------------------------------------------------------------------

    def _model_entries(self):
        try:
            return self.models.entries()
        except Exception as e:
            log.warning("cannot list the models: %s", e)
            return []

    def model_entries(self):
        return self._model_entries()

    def load_model(self, path: Path) -> None:
        """Loads a converted model (a .gguf anywhere, or one in the model store) on a worker."""
        path = Path(path)
        if self.is_generating:
            self.error.emit("Busy", "stop the generation before changing the model")
            return
        self._set_model_state("loading", f"loading {path.name}...")
        worker = LoadModelWorker(path, self.settings.threads)
        self._model_worker = worker
        workers.start(worker, finished=lambda result: self._model_loaded(path, *result),
                      failed=lambda message: self._model_failed(path, message))

    def _model_loaded(self, path: Path, engine, languages) -> None:
        old, self.engine = self.engine, engine
        if old is not None:
            old.close()
        self.model_path = path
        info = engine.info
        size = info.get("variant") or "?"
        self.model_description = f"{path.name} ({size})"
        self.languages = list(languages)
        self.settings.model_path = str(path)
        self._save_settings()
        if self.reference is not None and self.reference.library_id is None:
            self.reference.voice = None  # embeddings belong to a model
            self._embed_in_background(self.reference)
        self._set_model_state("ready", self.model_description)
        self.languages_changed.emit(self.languages)
        self._update_mode()
        self.status.emit(f"model ready: {self.model_description}")

    def _model_failed(self, path: Path, message: str) -> None:
        self._set_model_state("error" if self.engine is None else "ready",
                              self.model_description if self.engine is not None else message)
        self.error.emit("Cannot load the model", message)

    def _set_model_state(self, state: str, text: str) -> None:
        self.model_status = state
        self.model_state.emit(state, text)

    @property
    def has_model(self) -> bool:
        return self.engine is not None

    def model_license(self) -> tuple[str, str] | None:
        """(the model in use, what is known of its license) for the about dialog; None without one."""
        if self.model_path is None:
            return None
        try:
            entry = self.models.describe(self.model_path)
        except ModelError as e:
            return self.model_path.name, f"unknown ({e})"
        return entry.name, model_license(entry.license)

    def import_hf_folder(self, folder: Path, weight_type: str | None = None) -> None:
        weight_type = weight_type or self.settings.quantization
        self._run_model_task(lambda progress, cancel: self.models.import_hf_folder(
            Path(folder), weight_type, progress=progress, cancel=cancel), f"converting {Path(folder).name}")

    def download_model(self, repo_id: str = DEFAULT_REPO, weight_type: str | None = None) -> None:
        weight_type = weight_type or self.settings.quantization
        self._run_model_task(lambda progress, cancel: self.models.download(
            repo_id, weight_type, progress=progress, cancel=cancel), f"downloading {repo_id}")

    def add_converted_model(self, path: Path) -> None:
        """A converted .gguf picked by the user: checked, then used where it is."""
        def check(_worker):
            return self.models.describe(Path(path))
        workers.start(FunctionWorker(check, "reading the model"), finished=lambda entry: self.load_model(entry.path),
                      failed=lambda message: self.error.emit("Not a Vocable model", message))

    def _run_model_task(self, action, description: str) -> None:
        if self._model_task is not None:
            self.error.emit("Busy", "a model is already being imported or downloaded")
            return
        worker = ModelTaskWorker(action, description)
        self._model_task = worker
        self.model_task.emit("running", -1.0, description + "...")
        workers.start(worker, finished=self._model_task_finished,
                      failed=lambda message: self._model_task_ended("failed", message),
                      cancelled=lambda: self._model_task_ended("cancelled", "cancelled; nothing was kept"),
                      progress=lambda fraction, text: self.model_task.emit("running", fraction, text))

    def _model_task_finished(self, entry) -> None:
        self._model_task = None
        self.model_task.emit("finished", 1.0, f"{entry.name} is ready")
        self.load_model(entry.path)

    def _model_task_ended(self, state: str, message: str) -> None:
        self._model_task = None
        self.model_task.emit(state, 0.0, message)
        if state == "failed":
            self.status.emit(message)

    def cancel_model_task(self) -> None:
        if self._model_task is not None:
            self._model_task.cancel()

    @property
    def model_task_running(self) -> bool:
        return self._model_task is not None

    # -- the reference ---------------------------------------------------------------------------------

    @staticmethod
    def is_audio_file(path: Path) -> bool:
        return Path(path).suffix.lower() in AUDIO_FILE_SUFFIXES

    def load_reference_file(self, path: Path) -> None:
        """Reads and checks an audio file on a worker; it becomes the reference."""
        path = Path(path)
        from ..audio.files import read_reference
        from ..audio.reference import check_reference

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
        from ..audio.reference import check_reference
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
        from ..engine import IN_CONTEXT, X_VECTOR
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

    # -- generation --------------------------------------------------------------------------------------

    @property
    def is_generating(self) -> bool:
        return self._synthesis is not None

    def can_generate(self) -> tuple[bool, str]:
        if self.engine is None:
            return False, "no model is loaded"
        if self.reference is None:
            return False, "choose a reference voice first"
        if self.is_generating:
            return False, "already generating"
        return True, ""

    def generate(self, text: str, language: str = "auto", temperature: float = 0.9, top_k: int = 50,
                 seed: int | None = None, greedy: bool = False, max_frames: int | None = None,
                 to_file: Path | None = None) -> bool:
        """Starts speaking `text` (embedding the reference first if needed); False, with the
        reason in `error`, when it cannot start. `to_file`: speak into that audio file instead of
        playing it, a long text FILE_BATCH segments at a time (faster in all; the audio shows as
        each segment completes)."""
        ok, why = self.can_generate()
        if not ok:
            self.error.emit("Cannot generate", why[0].upper() + why[1:] + ".")
            return False
        if not text.strip():
            self.error.emit("Cannot generate", "The text is empty: type something to say.")
            return False
        from ..engine import FILE_BATCH
        if to_file is not None:
            from ..audio.files import _file_format
            try:
                _file_format(Path(to_file))
            except VocableError as e:
                self.error.emit("Cannot speak into that file", str(e))
                return False
        ref = self.reference
        transcript = self.transcript.strip() or None
        mode, _ = self.clone_mode()
        settings = dict(language=language, temperature=temperature, top_k=top_k, seed=seed, greedy=greedy,
                        mode=mode, model=self.model_path.name if self.model_path else "")
        request = SynthesisRequest(text=text, language=language, transcript=transcript, temperature=temperature,
                                   top_k=top_k, seed=seed, greedy=greedy, voice=ref.voice,
                                   pending_voice=ref.pending_voice if ref.voice is None else None,
                                   reference=ref.samples, reference_rate=ref.sample_rate, voice_name=ref.name,
                                   play=self.audio.output and to_file is None,
                                   output_device=self._device(self.settings.output_device),
                                   max_frames=max_frames, settings=settings,
                                   out_path=Path(to_file) if to_file is not None else None,
                                   batch=FILE_BATCH if to_file is not None else 1)
        if language != self.settings.language:
            self.settings.language = language
            self._save_settings()
        self.reference_player.stop()
        self.result = None
        self.result_text = text
        self.result_history_id = None
        self.result_player.begin_stream(self.engine.sample_rate)
        self.result_ready.emit(None)
        worker = SynthesisWorker(self.engine, request)
        # the worker's own signals go to slots of objects on this thread (queued to it)
        worker.voice_ready.connect(self._on_voice_ready)
        worker.player_ready.connect(self._player_ready)
        worker.chunk.connect(self.result_player.append)
        worker.stats.connect(self._on_stats)
        self._synthesis = worker
        self._synthesis_reference = ref
        self.generating.emit(True)
        self.progress_text.emit("starting...")
        self._stats_timer.start()
        workers.start(worker, finished=lambda result: self._synthesis_finished(worker, result),
                      failed=lambda message: self._synthesis_ended(worker, "failed", message),
                      cancelled=lambda: self._synthesis_ended(worker, "cancelled", ""))
        log.info("generate: %d characters, %s, %s", len(text), mode, settings)
        return True

    def stop(self) -> None:
        """Stops the generation and its playback at once."""
        worker = self._synthesis
        if worker is not None:
            worker.cancel()
            self.result_player.stop()

    def _voice_embedded(self, ref: Reference, voice) -> None:
        if self.reference is ref:
            ref.voice = voice

    @Slot(object)
    def _on_voice_ready(self, voice) -> None:
        if self._synthesis_reference is not None:
            self._voice_embedded(self._synthesis_reference, voice)

    @Slot(object)
    def _on_stats(self, stats) -> None:
        if self._synthesis is not None:
            self.progress_text.emit(stats.describe())

    @Slot(object, str)
    def _player_ready(self, player, reason: str) -> None:
        if player is None:
            if reason:
                self.status.emit(f"playing is off: {reason}; the audio is still generated")
            return
        if self._synthesis is not None:
            self.result_player.attach_stream_player(player)
        else:
            player.stop()

    def _stats_tick(self) -> None:
        worker = self._synthesis
        if worker is not None:
            stats = worker.live_stats()
            if stats is not None:
                self.progress_text.emit(stats.describe())

    def _synthesis_finished(self, worker: SynthesisWorker, result) -> None:
        self._stats_timer.stop()
        self._synthesis = None
        self.result = result
        self.result_player.end_stream(result.audio)
        summary = (f"{result.seconds:.1f} s of audio in {result.wall_time:.1f} s: first audio after "
                   f"{result.time_to_first_audio:.2f} s, real-time factor {result.real_time_factor:.2f}; "
                   f"{result.mode}, seed {result.seed}"
                   + ("" if result.reached_eos or result.runaway else "; stopped at the length cap")
                   + (f"; {runaway.summary(result.runaway)}" if result.runaway else ""))
        self.progress_text.emit(summary)
        settings = dict(worker.request.settings, seed=result.seed, mode=result.mode, mode_reason=result.mode_reason)
        voice_name = worker.request.voice_name
        try:
            entry = self.history.add(worker.request.text, voice_name, settings, result.audio, result.sample_rate)
            self.result_history_id = entry.id
            self.history_changed.emit()
        except Exception as e:
            log.exception("cannot add to the history")
            self.error.emit("Cannot save to the history", str(e))
        self.generating.emit(False)
        self.result_ready.emit(result)
        out = worker.request.out_path
        if out is not None:
            self.settings.export_dir = str(out.parent)
            self._save_settings()
        self.status.emit(("done: " if out is None else f"saved {out}: ") + summary)

    def _synthesis_ended(self, worker: SynthesisWorker, how: str, message: str) -> None:
        self._stats_timer.stop()
        if self._synthesis is worker:
            self._synthesis = None
        self.result_player.stop()
        self.result_player.end_stream()
        self.generating.emit(False)
        if how == "cancelled":
            text = f"stopped after {self.result_player.seconds:.1f} s of audio"
            self.progress_text.emit(text)
            self.status.emit(text)
        else:
            self.progress_text.emit("failed: " + message)
            self.error.emit("Generation failed", message)

    def save_result(self, path: Path) -> Path | None:
        """Writes the shown result (WAV, FLAC, OGG or MP3 by the extension)."""
        from ..audio.files import write_audio
        samples, rate = self.result_player.samples, self.result_player.sample_rate
        if samples.size == 0 or self.result_player.streaming:
            self.error.emit("Nothing to save", "Generate something first.")
            return None
        try:
            out = write_audio(Path(path), samples, rate)
        except VocableError as e:
            self.error.emit("Cannot save the audio", str(e))
            return None
        self.settings.export_dir = str(Path(path).parent)
        self._save_settings()
        self.status.emit(f"saved {out}")
        return Path(out)

    def default_export_dir(self) -> Path:
        d = self.settings.export_dir
        return Path(d) if d and Path(d).is_dir() else Path.home()

    # -- voice library -----------------------------------------------------------------------------------

    def _listed(self, entries, what: str) -> list:
        """A store's entries for a panel; an unreadable store is reported and lists nothing."""
        try:
            return entries()
        except Exception as e:
            log.exception("cannot list %s", what)
            self.error.emit(f"Cannot read {what}", str(e))
            return []

    def voice_entries(self):
        return self._listed(self.library.entries, "the voice library")

    def save_voice(self, name: str) -> None:
        """Saves the current reference's voice (embedding it first if needed) under `name`."""
        name = name.strip()
        ref = self.reference
        if not name:
            self.error.emit("Cannot save the voice", "Give the voice a name.")
            return
        if ref is None:
            self.error.emit("Cannot save the voice", "Choose a reference voice first.")
            return
        transcript = self.transcript.strip() or None
        if ref.voice is not None:
            self._store_voice(ref, ref.voice, name, transcript)
            return
        if self.engine is None:
            self.error.emit("Cannot save the voice", "A model is needed to make the voice: load one first.")
            return
        if self.is_generating:
            self.error.emit("Busy", "Wait for the generation to end (or stop it), then save the voice.")
            return
        def embedded(voice) -> None:
            self._voice_embedded(ref, voice)
            self._store_voice(ref, voice, name, transcript)

        self.status.emit("embedding the reference voice...")
        workers.start(EmbedWorker(self.engine, ref.samples, ref.sample_rate, transcript, name), finished=embedded,
                      failed=lambda message: self.error.emit("Cannot make the voice", message))

    def _store_voice(self, ref: Reference, voice, name: str, transcript: str | None) -> None:
        import copy
        voice = copy.copy(voice)
        voice.name = name
        if transcript is not None or ref.library_id is None:
            voice.ref_text = transcript
        try:
            entry = self.library.save(voice, name)
        except VocableError as e:
            self.error.emit("Cannot save the voice", str(e))
            return
        except Exception as e:
            log.exception("saving a voice")
            self.error.emit("Cannot save the voice", str(e))
            return
        self.library_changed.emit()
        self.status.emit(f"saved the voice '{entry.name}'")

    def use_voice(self, voice_id: str) -> None:
        """A saved voice becomes the reference (no audio: the embedding and codes are kept)."""
        try:
            voice = self.library.load(voice_id)
        except VocableError as e:
            self.error.emit("Cannot load the voice", str(e))
            return
        name = voice.name or voice_id
        if self.engine is not None and voice.model_variant and voice.model_variant != self.engine.info.get("variant"):
            self.status.emit(f"'{name}' was made with the {voice.model_variant} model; it may not fit this one")
        self.reference = Reference(name, None, 24000, None, None, voice, voice_id)
        self.reference_player.clear()
        self.transcript = voice.ref_text or ""
        self.reference_changed.emit()
        self._update_mode()
        self.status.emit(f"voice: {name}")

    def rename_voice(self, voice_id: str, name: str) -> None:
        self._library_op(lambda: self.library.rename(voice_id, name.strip()), "Cannot rename the voice")

    def delete_voice(self, voice_id: str) -> None:
        self._library_op(lambda: self.library.delete(voice_id), "Cannot delete the voice")

    def export_voice(self, voice_id: str, dest: Path) -> None:
        if self._library_op(lambda: self.library.export(voice_id, Path(dest)), "Cannot export the voice", False):
            self.status.emit(f"exported the voice to {dest}")

    def import_voice(self, src: Path) -> None:
        if self._library_op(lambda: self.library.import_file(Path(src)), "Cannot import the voice"):
            self.status.emit(f"imported {Path(src).name}")

    def _library_op(self, op, title: str, changes: bool = True) -> bool:
        try:
            op()
        except VocableError as e:
            self.error.emit(title, str(e))
            return False
        except Exception as e:
            log.exception(title)
            self.error.emit(title, f"{type(e).__name__}: {e}")
            return False
        if changes:
            self.library_changed.emit()
        return True

    # -- history --------------------------------------------------------------------------------------------

    def history_entries(self):
        return self._listed(self.history.entries, "the history")

    def show_history(self, entry_id: str, play: bool = True) -> None:
        """Shows a past generation in the result view (and plays it)."""
        if self.is_generating:
            self.error.emit("Busy", "Stop the generation first.")
            return
        try:
            samples, rate = self.history.load_audio(entry_id)
        except VocableError as e:
            self.error.emit("Cannot replay", str(e))
            return
        entry = next((e for e in self.history_entries() if e.id == entry_id), None)
        self.result = None
        self.result_history_id = entry_id
        self.result_text = entry.text if entry else ""
        self.result_player.set_clip(samples, rate)
        self.result_ready.emit(None)
        if entry is not None:
            created = entry.created.astimezone()
            self.progress_text.emit(f"from the history: {entry.voice_name}, {created:%Y-%m-%d %H:%M}, "
                                    f"{entry.seconds:.1f} s")
        if play and self.audio.output:
            self.result_player.play()

    def export_history(self, entry_id: str, dest: Path) -> None:
        try:
            out = self.history.export(entry_id, Path(dest))
        except VocableError as e:
            self.error.emit("Cannot export", str(e))
            return
        self.settings.export_dir = str(Path(dest).parent)
        self._save_settings()
        self.status.emit(f"exported {out}")

    def delete_history(self, entry_id: str) -> None:
        try:
            self.history.delete(entry_id)
        except VocableError as e:
            self.error.emit("Cannot delete", str(e))
            return
        if self.result_history_id == entry_id and not self.is_generating:
            self.result_history_id = None
        self.history_changed.emit()

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
        from ..audio import recorder as recorder_module
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
        if reason.startswith("device error"):
            self.error.emit("Recording failed", reason)
            return
        if samples.size == 0:
            self.error.emit("Recording failed", "nothing was recorded")
            return
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

    # -- settings -----------------------------------------------------------------------------------------------

    def update_settings(self, **changes) -> None:
        model_before = self.settings.model_path
        threads_before = self.settings.threads
        for key, value in changes.items():
            setattr(self.settings, key, value)
        self._save_settings()
        self.refresh_audio()
        self.settings_changed.emit()
        if (self.settings.model_path and self.settings.model_path != model_before) or \
                (self.settings.threads != threads_before and self.model_path is not None):
            self.load_model(Path(self.settings.model_path))

    def _save_settings(self) -> None:
        if not self.persist_settings:
            return
        try:
            self.settings.save()
        except Exception as e:
            log.exception("cannot save the settings")
            self.status.emit(f"cannot save the settings: {e}")


def recorder_max_seconds() -> float:
    try:
        from ..audio.recorder import MAX_RECORD_SECONDS
        return float(MAX_RECORD_SECONDS)
    except Exception:
        return 30.0
