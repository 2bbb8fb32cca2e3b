"""The main window: the setup screen until a model is loaded, then the reference, speak and
result panels with the voice library and history beside them. It owns the dialogs (file
choosers, name prompts, confirmations) and shows every error in its message bar; the work
itself is the controller's."""
from __future__ import annotations

import logging
from pathlib import Path

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QAction, QDesktopServices, QKeySequence, QShortcut
from PySide6.QtWidgets import (QFileDialog, QHBoxLayout, QInputDialog, QLabel, QMainWindow, QMessageBox,
                               QScrollArea, QSplitter, QStackedWidget, QStyle, QTabWidget, QToolButton, QVBoxLayout,
                               QWidget)

from .controller import EXPORT_FORMATS, Controller
from .panels import ReferencePanel, ResultPanel, SpeakPanel
from .setup_screen import SetupScreen
from .sidebar import HistoryPanel, LibraryPanel

log = logging.getLogger("vocable.gui")

AUDIO_FILTER = "Audio files (*.wav *.flac *.ogg *.oga *.opus *.mp3 *.aif *.aiff);;All files (*)"
_FILTERS = {"wav": "WAV audio (*.wav)", "flac": "FLAC audio (*.flac)", "ogg": "Ogg Vorbis audio (*.ogg)",
            "opus": "Opus audio (*.opus)", "mp3": "MP3 audio (*.mp3)",
            "m4b": "M4B audiobook, chapters marked (*.m4b)"}
SAVE_FILTERS = {ext: text for ext, text in _FILTERS.items() if ext in EXPORT_FORMATS}
CHAPTER_FILTERS = {ext: text for ext, text in SAVE_FILTERS.items() if ext != "m4b"}
VOICE_FILTER = "Vocable voices (*.safetensors);;All files (*)"


class MessageBar(QWidget):
    """A dismissable line at the top of the window for errors (instead of modal dialogs, which
    would stop the user, and the tests, until they are closed)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.label = QLabel("")
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.label.setAccessibleName("Error message")
        close = QToolButton()
        close.setIcon(self.style().standardIcon(QStyle.SP_DialogCloseButton))
        close.setAccessibleName("Dismiss the message")
        close.clicked.connect(self.hide)
        row = QHBoxLayout(self)
        row.setContentsMargins(8, 4, 8, 4)
        icon = QLabel()
        icon.setPixmap(self.style().standardIcon(QStyle.SP_MessageBoxWarning).pixmap(20, 20))
        row.addWidget(icon)
        row.addWidget(self.label, 1)
        row.addWidget(close)
        self.setAutoFillBackground(True)
        self.setBackgroundRole(self.backgroundRole().ToolTipBase)
        self.setForegroundRole(self.foregroundRole().ToolTipText)
        self.hide()

    def show_message(self, title: str, message: str) -> None:
        self.label.setText(f"<b>{_esc(title)}</b>: {_esc(message)}")
        self.show()

    def text(self) -> str:
        return self.label.text() if self.isVisible() else ""


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class MainWindow(QMainWindow):
    def __init__(self, controller: Controller | None = None):
        super().__init__()
        self.c = controller or Controller(self)
        if self.c.parent() is None:
            self.c.setParent(self)
        self.setWindowTitle("Vocable")
        self.setAcceptDrops(True)
        self.resize(1100, 760)
        self.last_error: tuple[str, str] | None = None

        from ..library.paths import models_dir
        self.setup = SetupScreen(self.c, str(models_dir()))
        self.reference = ReferencePanel(self.c)
        self.speak = SpeakPanel(self.c)
        self.result = ResultPanel(self.c)
        self.library = LibraryPanel(self.c)
        self.history = HistoryPanel(self.c)

        left = QWidget()
        column = QVBoxLayout(left)
        column.setContentsMargins(0, 0, 0, 0)
        column.addWidget(self.reference)
        column.addWidget(self.speak)
        column.addWidget(self.result)
        column.addStretch(1)
        self.tabs = QTabWidget()
        self.tabs.setAccessibleName("Voices and history")
        self.tabs.addTab(self.library, "&Voices")
        self.tabs.addTab(self.history, "&History")
        scroll = QScrollArea()  # a small window scrolls instead of squeezing the controls
        scroll.setWidget(left)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.NoFrame)
        splitter = QSplitter(Qt.Horizontal)
        splitter.addWidget(scroll)
        splitter.addWidget(self.tabs)
        splitter.setStretchFactor(0, 3)
        splitter.setStretchFactor(1, 1)
        splitter.setChildrenCollapsible(False)
        main_page = QWidget()
        page_layout = QVBoxLayout(main_page)
        page_layout.setContentsMargins(8, 8, 8, 8)
        page_layout.addWidget(splitter)
        self.main_page = main_page

        self.stack = QStackedWidget()
        self.stack.addWidget(self.setup)
        self.stack.addWidget(main_page)
        self.messages = MessageBar()
        central = QWidget()
        outer = QVBoxLayout(central)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.setSpacing(0)
        outer.addWidget(self.messages)
        outer.addWidget(self.stack, 1)
        self.setCentralWidget(central)
        self.model_label = QLabel("")
        self.model_label.setAccessibleName("Model")
        self.statusBar().addPermanentWidget(self.model_label)
        self.api_label = QLabel("")
        self.api_label.setAccessibleName("Speech API")
        self.api_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.api_label.hide()
        self.statusBar().addPermanentWidget(self.api_label)

        self._build_menus()
        for keys in ("Ctrl+Return", "Ctrl+Enter"):
            shortcut = QShortcut(QKeySequence(keys), self)
            shortcut.setContext(Qt.WindowShortcut)
            shortcut.activated.connect(self.generate)
        escape = QShortcut(QKeySequence(Qt.Key_Escape), self)
        escape.activated.connect(self.c.stop)

        c = self.c
        c.error.connect(self.show_error)
        c.status.connect(lambda text: self.statusBar().showMessage(text, 10000))
        c.model_state.connect(self._model_state)
        c.api_server_changed.connect(self._api_server_changed)
        c.model_task.connect(self._model_task)
        c.generating.connect(self._generating)
        c.saving.connect(lambda _: self._generating(self.c.is_generating))
        self.speak.generate_requested.connect(self.generate)
        self.reference.open_requested.connect(self.open_reference)
        self.reference.save_voice_requested.connect(self.save_voice)
        self.result.save_requested.connect(self.save_result)
        self.result.save_chapters_requested.connect(self.save_chapters)
        self.c.result_ready.connect(lambda _: self._generating(self.c.is_generating))
        self.library.save_requested.connect(self.save_voice)
        self.library.rename_requested.connect(self.rename_voice)
        self.library.delete_requested.connect(self.delete_voice)
        self.library.export_requested.connect(self.export_voice)
        self.library.import_requested.connect(self.import_voice)
        self.library.add_clip_requested.connect(self.add_clip_to_voice)
        self.history.export_requested.connect(self.export_history)
        self.history.delete_requested.connect(self.delete_history)
        self.setup.pick_requested.connect(self.pick_model)
        self.setup.import_requested.connect(self.import_model)
        self.setup.download_requested.connect(self.download_model)
        self._model_state(c.model_status, c.model_description)

    # -- menus ----------------------------------------------------------------------------------------------

    def _build_menus(self) -> None:
        def action(menu, text, slot, shortcut=None):
            a = QAction(text, self)
            if shortcut:
                a.setShortcut(QKeySequence(shortcut))
            a.triggered.connect(slot)
            menu.addAction(a)
            return a

        m = self.menuBar().addMenu("&File")
        action(m, "&Open reference audio…", self.open_reference, QKeySequence.Open)
        self.save_action = action(m, "&Save result as…", self.save_result, QKeySequence.Save)
        self.save_chapters_action = action(m, "Save c&hapters as files…", self.save_chapters)
        self.speak_to_file_action = action(m, "Speak into a &file…", self.speak_to_file, "Ctrl+Shift+S")
        m.addSeparator()
        action(m, "&Import voice…", self.import_voice)
        m.addSeparator()
        action(m, "&Quit", self.close, QKeySequence.Quit)
        m = self.menuBar().addMenu("&Model")
        action(m, "&Use a converted model…", self.pick_model)
        action(m, "&Import a Hugging Face folder…", lambda: self.import_model(None))
        action(m, "&Download Qwen3-TTS 0.6B", lambda: self.download_model(None))
        m.addSeparator()
        action(m, "Download &speech recognition (Whisper base, 145 MB)", lambda: self.c.download_whisper())
        self.cancel_download_action = action(m, "&Cancel the download", self.c.cancel_model_task)
        self.cancel_download_action.setEnabled(False)
        m = self.menuBar().addMenu("&Settings")
        action(m, "&Preferences…", self.open_settings, QKeySequence.Preferences)
        m = self.menuBar().addMenu("&Help")
        action(m, "Open the &log folder", self.open_log_folder)
        action(m, "&About Vocable", self.about)

    # -- state ------------------------------------------------------------------------------------------------

    def _model_state(self, state: str, text: str) -> None:
        needs_setup = state == "none" or (state == "error" and not self.c.has_model)
        if state == "loading" and not self.c.has_model and self.stack.currentWidget() is self.setup:
            needs_setup = True  # stay on the setup screen (it says "loading") until the model is ready
        self.stack.setCurrentWidget(self.setup if needs_setup else self.main_page)
        self.model_label.setText({"ready": f"Model: {text}", "loading": text, "none": "No model",
                                  "error": "No model" if not self.c.has_model else f"Model: {text}"}[state])
        self.speak.generate_button.setEnabled(state == "ready" and not self.c.is_generating)

    def _generating(self, on: bool) -> None:
        self.speak.generate_button.setEnabled(not on and self.c.model_status == "ready")
        self.save_action.setEnabled(not on and not self.c.is_saving)
        self.save_chapters_action.setEnabled(not on and not self.c.is_saving and len(self.c.result_chapters) > 1)
        self.speak_to_file_action.setEnabled(not on)

    def show_error(self, title: str, message: str) -> None:
        self.last_error = (title, message)
        log.info("shown to the user: %s: %s", title, message)
        self.messages.show_message(title, message)
        self.statusBar().showMessage(f"{title}: {message}", 15000)

    # -- actions ------------------------------------------------------------------------------------------------

    def generate(self) -> None:
        if self.c.is_generating or self.stack.currentWidget() is not self.main_page:
            return
        self.messages.hide()
        self.c.generate(**self.speak.parameters())

    def speak_to_file(self) -> None:
        """Speaks the text straight into an audio file (a long text generates faster so)."""
        if self.c.is_generating or self.stack.currentWidget() is not self.main_page:
            return
        params = self.speak.parameters()
        start = str(self.c.default_export_dir() / f"{_file_stem(params['text'])}.wav")
        path, chosen = QFileDialog.getSaveFileName(self, "Speak into a file", start, ";;".join(SAVE_FILTERS.values()))
        if path:
            self.messages.hide()
            self.c.generate(**params, to_file=Path(_with_suffix(path, chosen)))

    def open_reference(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open reference audio", str(self.c.default_export_dir()),
                                              AUDIO_FILTER)
        if path:
            self.c.load_reference_file(Path(path))

    def save_result(self) -> None:
        if self.c.result_player.samples.size == 0 or self.c.is_generating:
            return
        start = str(self.c.default_export_dir() / f"{_file_stem(self.c.result_text)}.wav")
        path, chosen = QFileDialog.getSaveFileName(self, "Save the speech", start, ";;".join(SAVE_FILTERS.values()))
        if path:
            path = _with_suffix(path, chosen)
            self.c.save_result(Path(path))

    def save_chapters(self) -> None:
        """Each chapter into its own file: the name chosen is the folder's, its type the files'."""
        if self.c.result_player.samples.size == 0 or self.c.is_generating:
            return
        start = str(self.c.default_export_dir() / f"{_file_stem(self.c.result_text)}.mp3")
        path, chosen = QFileDialog.getSaveFileName(self, "Save each chapter (into a folder of this name)", start,
                                                   ";;".join(CHAPTER_FILTERS.values()))
        if path:
            self.c.save_chapters(Path(_with_suffix(path, chosen, CHAPTER_FILTERS)))

    def save_voice(self) -> None:
        if self.c.reference is None:
            self.show_error("Cannot save the voice", "Choose a reference voice first.")
            return
        name, ok = QInputDialog.getText(self, "Save voice", "Name of the voice:", text=self.c.reference.name)
        if ok and name.strip():
            self.c.save_voice(name)

    def rename_voice(self, voice_id: str) -> None:
        name, ok = QInputDialog.getText(self, "Rename voice", "New name:", text=self.library.entry_name(voice_id))
        if ok and name.strip():
            self.c.rename_voice(voice_id, name)

    def delete_voice(self, voice_id: str) -> None:
        name = self.library.entry_name(voice_id)
        if QMessageBox.question(self, "Delete voice", f"Delete the voice “{name}”?") == QMessageBox.Yes:
            self.c.delete_voice(voice_id)

    def export_voice(self, voice_id: str) -> None:
        name = self.library.entry_name(voice_id) or "voice"
        safe = "".join(ch for ch in name if ch.isalnum() or ch in " _-").strip() or "voice"
        start = str(self.c.default_export_dir() / f"{safe}.safetensors")
        path, _ = QFileDialog.getSaveFileName(self, "Export voice", start, VOICE_FILTER)
        if path:
            if not path.lower().endswith(".safetensors"):
                path += ".safetensors"  # what the library reads back
            self.c.export_voice(voice_id, Path(path))

    def import_voice(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import voice", str(self.c.default_export_dir()), VOICE_FILTER)
        if path:
            self.c.import_voice(Path(path))

    def add_clip_to_voice(self, voice_id: str) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Another clip of the same speaker", str(self.c.default_export_dir()),
                                              AUDIO_FILTER)
        if path:
            self.c.add_clip_to_voice(voice_id, Path(path))

    def export_history(self, entry_id: str) -> None:
        start = str(self.c.default_export_dir() / "speech.wav")
        path, chosen = QFileDialog.getSaveFileName(self, "Export speech", start, ";;".join(SAVE_FILTERS.values()))
        if path:
            self.c.export_history(entry_id, Path(_with_suffix(path, chosen)))

    def delete_history(self, entry_id: str) -> None:
        if QMessageBox.question(self, "Delete", "Delete this generation from the history?") == QMessageBox.Yes:
            self.c.delete_history(entry_id)

    def pick_model(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Use a converted model", "",
                                              "Vocable models (*.gguf);;All files (*)")
        if path:
            self.c.add_converted_model(Path(path))

    def import_model(self, weight_type: str | None) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Hugging Face model folder (Qwen3-TTS-12Hz-*-Base)")
        if folder:
            if not self.c.has_model:
                self.stack.setCurrentWidget(self.setup)
            self.c.import_hf_folder(Path(folder), weight_type)

    def download_model(self, weight_type: str | None) -> None:
        if not self.c.has_model:
            self.stack.setCurrentWidget(self.setup)
        self.c.download_model(weight_type=weight_type)

    def _model_task(self, state: str, fraction: float, text: str) -> None:
        """Downloads and imports also report in the status bar (the setup screen shows them before a
        model is loaded), and can be cancelled from the Model menu."""
        self.cancel_download_action.setEnabled(state == "running")
        percent = f"{100 * fraction:.0f} %: " if state == "running" and fraction >= 0 else ""
        self.statusBar().showMessage(percent + text, 0 if state == "running" else 10000)

    def _api_server_changed(self, address: str) -> None:
        self.api_label.setText(f"API: {address}" if address else "")
        self.api_label.setVisible(bool(address))

    def open_settings(self) -> None:
        from .settings_dialog import SettingsDialog
        dialog = SettingsDialog(self.c, self)
        if dialog.exec():
            self.c.update_settings(**dialog.values())

    def open_log_folder(self) -> None:
        from ..library.paths import log_dir
        QDesktopServices.openUrl(QUrl.fromLocalFile(str(log_dir())))

    def about(self) -> None:
        from .about_dialog import AboutDialog
        AboutDialog(self.c.model_license(), self).exec()

    # -- drag and drop anywhere on the window ---------------------------------------------------------------

    @staticmethod
    def _dropped_files(mime) -> list[Path]:
        if not mime.hasUrls():
            return []
        return [Path(u.toLocalFile()) for u in mime.urls() if u.isLocalFile()]

    def dragEnterEvent(self, event) -> None:
        if self._dropped_files(event.mimeData()):
            event.acceptProposedAction()
        else:
            event.ignore()

    def dragMoveEvent(self, event) -> None:
        if self._dropped_files(event.mimeData()):
            event.acceptProposedAction()
        else:
            event.ignore()

    def dropEvent(self, event) -> None:
        files = self._dropped_files(event.mimeData())
        if not files:
            event.ignore()
            return
        event.acceptProposedAction()
        audio = [f for f in files if self.c.is_audio_file(f)] or files  # soundfile may read others too
        if len(files) > 1:
            self.statusBar().showMessage(f"{len(files)} files dropped; using {audio[0].name}", 10000)
        self.messages.hide()
        self.c.load_reference_file(audio[0])

    def closeEvent(self, event) -> None:
        self.hide()   # gone at once for the user, while the jobs that cannot be cancelled end
        self.c.shutdown()
        super().closeEvent(event)


def _file_stem(text: str) -> str:
    """A file name from the first words of a text."""
    name = "_".join(text.split()[:6]) or "speech"
    return "".join(ch for ch in name if ch.isalnum() or ch in "_-")[:60] or "speech"


def _with_suffix(path: str, chosen_filter: str, filters: dict[str, str] = SAVE_FILTERS) -> str:
    """Adds the chosen filter's extension when the name has none of the formats offered."""
    if Path(path).suffix.lower().lstrip(".") in filters:
        return path
    for ext, text in filters.items():
        if text == chosen_filter:
            return path + "." + ext
    return path + ".wav"
