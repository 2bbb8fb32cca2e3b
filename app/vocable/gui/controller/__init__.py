"""The app's state and actions, without widgets: the main window calls these and redraws on
the signals. Engine work, file reading, conversion and downloads run on workers (workers.py);
the controller only starts them and takes their results on the GUI thread.

One `Controller` for the widgets, its actions grouped by concern, one module each:
- reference.py: the clip to clone (file, recording, saved voice), its embedding, the clone mode;
- synthesis.py: Generate, its streaming playback and result, saving it;
- library.py: the saved voices and the history;
- models.py: the model in use, importing and downloading models, the settings;
- devices.py: the audio devices, and why Play or Record is off;
- server.py: the speech API while the app runs;
- speech_recognition.py: the reference's transcript, the check of a result, the Whisper model.
They share the state set up here and report through the signals below.

Every failure ends up in `error` (a title and a message for a dialog) or `status` (a line for the
status bar); nothing raised by an action escapes to Qt.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal, Slot

from .. import workers
from ..clip_player import ClipPlayer
from ..workers import ModelTaskWorker, SynthesisWorker
from .devices import AudioAvailability, AudioDevices, query_audio_devices
from .library import LibraryActions
from .models import ModelActions
from .reference import AUDIO_FILE_SUFFIXES, Reference, ReferenceActions, recorder_max_seconds
from .server import ServerActions
from .speech_recognition import SpeechRecognitionActions
from .synthesis import EXPORT_FORMATS, SynthesisActions

SHUTDOWN_WAIT_SEC = 15.0   # at window close, for the jobs still running

__all__ = ["AUDIO_FILE_SUFFIXES", "EXPORT_FORMATS", "AudioAvailability", "Controller", "Reference",
           "query_audio_devices", "recorder_max_seconds"]

log = logging.getLogger("vocable.gui")


class Controller(ReferenceActions, SynthesisActions, LibraryActions, ModelActions, AudioDevices, ServerActions,
                 SpeechRecognitionActions, QObject):
    # model
    model_state = Signal(str, str)          # "none" | "loading" | "ready" | "error", and a description
    languages_changed = Signal(list)
    model_task = Signal(str, float, str)    # "running" | "finished" | "failed" | "cancelled", fraction, text
    # reference and mode
    reference_changed = Signal()
    mode_changed = Signal(str, str)         # mode ("in-context" | "x-vector" | ""), explanation
    # generation
    generating = Signal(bool)
    saving = Signal(bool)                   # a result or its chapters being written (on a worker)
    saved = Signal(list)                    # the files a save wrote
    progress_text = Signal(str)
    result_ready = Signal(object)           # SynthesisResult (or None when cleared)
    result_checked = Signal(object)         # asr.OutputCheck of the result shown
    language_heard = Signal(str)            # the reference's language, by speech recognition
    # recording
    recording = Signal(bool)
    record_level = Signal(float, float)     # dBFS, elapsed seconds
    # stores
    library_changed = Signal()
    history_changed = Signal()
    settings_changed = Signal()
    audio_changed = Signal()
    api_server_changed = Signal(str)        # the speech API's address, "" when it is off
    # reporting
    status = Signal(str)
    error = Signal(str, str)                # title, message

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        from ...library.history import History
        from ...library.voices import VoiceLibrary
        from ...engine.models import ModelStore
        from ...library.settings import Settings

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
        self.result_chapters = ()                   # ChapterSpan of the shown result, when its text had headings
        self.result_history_id: str | None = None   # set when the result view shows a history entry
        self.reference_player = ClipPlayer(self)
        self.result_player = ClipPlayer(self)
        self._synthesis: SynthesisWorker | None = None
        self._saving: workers.Worker | None = None
        self._synthesis_reference: Reference | None = None
        self._model_worker: workers.Worker | None = None
        self._reload_after_generation = False   # settings changed mid-generation (update_settings)
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
        self.apply_api_setting()
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
        self.stop_api_server()
        self.cancel_model_task()
        if self._recorder is not None:
            try:
                self._recorder.stop()
            except Exception:
                pass
            self._recorder = None
        self.reference_player.stop()
        self.result_player.stop()
        saving = self._saving
        if saving is not None and saving.thread_ is not None:
            saving.thread_.wait()   # a save the user asked for ends whole, however long it takes
        if not workers.wait_all(SHUTDOWN_WAIT_SEC):
            # A job that cannot be cancelled (a model load, a long MP3 encode) outlived the wait:
            # Qt would abort the process when its thread object goes while it runs. What the user
            # made is saved already (atomic writes), so leave now, with the log complete.
            log.warning("exiting while still running: %s", ", ".join(w.description for w in workers.running()))
            logging.shutdown()
            os._exit(0)
        if self.engine is not None:
            try:
                self.engine.close()
            except Exception:
                log.exception("closing the engine")
            self.engine = None
