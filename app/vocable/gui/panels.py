"""The main page's panels: the reference voice, the text to speak, and the result. Each shows
the controller's state and calls its actions; none of them calls the engine."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtCore import QRegularExpression
from PySide6.QtGui import QRegularExpressionValidator
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDoubleSpinBox, QFormLayout, QGroupBox, QHBoxLayout, QLabel,
                               QLineEdit, QPlainTextEdit, QPushButton, QSizePolicy, QSpinBox, QVBoxLayout, QWidget)

from .controller import EXPORT_FORMATS, Controller
from .level_meter import LevelMeter
from .waveform import WaveformPlayer, format_time


class TextBox(QPlainTextEdit):
    """Plain text input that lets file drops through to the window (which takes audio files as
    the reference) instead of pasting their paths."""

    def canInsertFromMimeData(self, source) -> bool:
        if source.hasUrls() and any(u.isLocalFile() for u in source.urls()):
            return False
        return super().canInsertFromMimeData(source)

    def dragEnterEvent(self, event) -> None:
        if event.mimeData().hasUrls():
            event.ignore()
            return
        super().dragEnterEvent(event)

    def dragMoveEvent(self, event) -> None:
        if event.mimeData().hasUrls():
            event.ignore()
            return
        super().dragMoveEvent(event)

    def dropEvent(self, event) -> None:
        if event.mimeData().hasUrls():
            event.ignore()
            return
        super().dropEvent(event)


def _heading(text: str) -> QLabel:
    label = QLabel(f"<b>{text}</b>")
    label.setTextFormat(Qt.RichText)
    return label


class ReferencePanel(QGroupBox):
    """Open, drop or record a reference; its waveform and checks; the transcript and the mode."""

    open_requested = Signal()
    save_voice_requested = Signal()

    def __init__(self, controller: Controller, parent: QWidget | None = None):
        super().__init__("Reference voice", parent)
        self.c = controller
        self.open_button = QPushButton("&Open audio file…")
        self.open_button.setAccessibleName("Open a reference audio file")
        self.record_button = QPushButton("&Record")
        self.record_button.setAccessibleName("Record a reference from the microphone")
        self.record_button.setCheckable(True)
        self.meter = LevelMeter()
        self.meter.setVisible(False)
        self.elapsed = QLabel("")
        self.elapsed.setAccessibleName("Recording time")
        self.save_button = QPushButton("Save &voice…")
        self.save_button.setAccessibleName("Save this voice to the library")
        buttons = QHBoxLayout()
        buttons.addWidget(self.open_button)
        buttons.addWidget(self.record_button)
        buttons.addWidget(self.meter, 1)
        buttons.addWidget(self.elapsed)
        buttons.addStretch(0)
        buttons.addWidget(self.save_button)

        self.name = QLabel("")
        self.name.setAccessibleName("Reference")
        self.name.setWordWrap(True)
        self.device_note = QLabel("")
        self.device_note.setWordWrap(True)
        self.device_note.setAccessibleName("Audio device note")
        self.wave = WaveformPlayer(controller.reference_player, "Reference")
        self.wave.set_placeholder("Drop an audio file anywhere on this window (WAV, FLAC, OGG, MP3), open one, "
                                  "or record. 3 to 10 s of clear speech works best.")
        self.warnings = QLabel("")
        self.warnings.setWordWrap(True)
        self.warnings.setTextFormat(Qt.RichText)
        self.warnings.setAccessibleName("Reference warnings")
        self.transcript = QLineEdit()
        self.transcript.setPlaceholderText("What the reference says (optional: enables in-context cloning)")
        self.transcript.setAccessibleName("Transcript of the reference")
        self.transcript.setClearButtonEnabled(True)
        self.mode = QLabel("")
        self.mode.setWordWrap(True)
        self.mode.setAccessibleName("Clone mode")
        transcript_label = QLabel("&Transcript:")
        transcript_label.setBuddy(self.transcript)
        self.transcribe_button = QPushButton("Tran&scribe")
        self.transcribe_button.setAccessibleName("Transcribe the reference")
        self.transcribe_button.setToolTip("Fill in what the reference says by speech recognition (Whisper); "
                                          "check the words before you generate")
        row = QHBoxLayout()
        row.addWidget(transcript_label)
        row.addWidget(self.transcript, 1)
        row.addWidget(self.transcribe_button)

        layout = QVBoxLayout(self)
        layout.addLayout(buttons)
        layout.addWidget(self.name)
        layout.addWidget(self.wave)
        layout.addWidget(self.warnings)
        layout.addWidget(self.device_note)
        layout.addLayout(row)
        layout.addWidget(self.mode)

        self.open_button.clicked.connect(self.open_requested)
        self.save_button.clicked.connect(self.save_voice_requested)
        self.record_button.clicked.connect(self._record_clicked)
        self.transcript.textChanged.connect(controller.set_transcript)
        self.transcribe_button.clicked.connect(controller.transcribe_reference)
        controller.reference_changed.connect(self.refresh)
        controller.mode_changed.connect(self._mode)
        controller.recording.connect(self._recording)
        controller.record_level.connect(self._level)
        controller.audio_changed.connect(self._audio)
        self.refresh()
        self._mode(*controller.clone_mode())
        self._audio()

    def _record_clicked(self) -> None:
        if self.c.is_recording:
            self.c.stop_recording()
        else:
            self.c.start_recording()
        self.record_button.setChecked(self.c.is_recording)

    def _recording(self, on: bool) -> None:
        self.record_button.setChecked(on)
        self.record_button.setText("Stop &recording" if on else "&Record")
        self.record_button.setAccessibleName("Stop recording" if on else "Record a reference from the microphone")
        self.meter.setVisible(on)
        self.open_button.setEnabled(not on)
        if on:
            self.meter.reset()
            self.elapsed.setText("0:00.0")
        else:
            self.elapsed.setText("")

    def _level(self, db: float, elapsed: float) -> None:
        from .controller import recorder_max_seconds
        self.meter.set_level(db)
        self.elapsed.setText(f"{format_time(elapsed)} / {format_time(recorder_max_seconds())}")

    def _audio(self) -> None:
        a = self.c.audio
        self.record_button.setEnabled(a.input)
        self.record_button.setToolTip("" if a.input else "Recording is off: " + a.input_reason)
        notes = []
        if not a.input:
            notes.append(f"Recording is off: {a.input_reason}.")
        if not a.output:
            notes.append(f"Playback is off: {a.output_reason}. Generating and saving still work.")
        self.device_note.setText(" ".join(notes))
        self.device_note.setVisible(bool(notes))
        self.wave.refresh()

    def refresh(self) -> None:
        ref = self.c.reference
        if ref is None:
            self.name.setText("No reference yet.")
            self.warnings.setText("")
            self.warnings.setVisible(False)
            self.save_button.setEnabled(False)
            return
        self.save_button.setEnabled(True)
        if ref.library_id is not None:
            self.name.setText(f"Saved voice <b>{_esc(ref.name)}</b>: {ref.seconds:.1f} s reference "
                              f"({getattr(ref.voice, 'model_variant', '') or 'unknown'} model)")
            self.wave.set_placeholder("A saved voice keeps its embedding, not its audio.")
        else:
            check = ref.check
            trimmed = ""
            if check is not None and (check.trimmed_start > 0.05 or check.trimmed_end > 0.05):
                trimmed = (f", silence trimmed: {check.trimmed_start:.1f} s at the start, "
                           f"{check.trimmed_end:.1f} s at the end")
            self.name.setText(f"<b>{_esc(ref.name)}</b>: {ref.seconds:.1f} s{trimmed}")
        if self.transcript.text() != self.c.transcript:
            self.transcript.setText(self.c.transcript)
        warnings = ref.warnings
        self.warnings.setText("".join(f"<div>⚠ {_esc(w)}</div>" for w in warnings))
        self.warnings.setVisible(bool(warnings))

    def _mode(self, mode: str, why: str) -> None:
        self.mode.setText(why)


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class SpeakPanel(QGroupBox):
    """The text, its language, the advanced sampling settings, Generate and Stop, progress."""

    generate_requested = Signal()

    def __init__(self, controller: Controller, parent: QWidget | None = None):
        super().__init__("Speak", parent)
        self.c = controller
        self.text = TextBox()
        self.text.setPlaceholderText("Type what the voice should say. Ctrl+Enter generates.")
        self.text.setAccessibleName("Text to speak")
        self.text.setTabChangesFocus(True)
        lines = self.text.fontMetrics().lineSpacing()
        self.text.setMinimumHeight(lines * 4 + 12)
        self.text.setMaximumHeight(lines * 7 + 12)  # longer texts scroll; the result stays in view
        self.language = QComboBox()
        self.language.setAccessibleName("Language")
        self.language.addItem("auto")
        language_label = QLabel("&Language:")
        language_label.setBuddy(self.language)

        self.advanced = QGroupBox("&Advanced")
        self.advanced.setCheckable(True)
        self.advanced.setChecked(False)
        self.advanced.setAccessibleName("Advanced sampling settings")
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(0.05, 2.0)
        self.temperature.setSingleStep(0.05)
        self.temperature.setValue(0.9)
        self.temperature.setAccessibleName("Temperature")
        self.top_k = QSpinBox()
        self.top_k.setRange(1, 4096)
        self.top_k.setValue(50)
        self.top_k.setAccessibleName("Top-k")
        self.seed = QLineEdit()
        self.seed.setPlaceholderText("random")
        self.seed.setValidator(QRegularExpressionValidator(QRegularExpression(r"\d{0,19}")))
        self.seed.setAccessibleName("Seed")
        self.greedy = QCheckBox("&Greedy (most likely codes, no sampling)")
        self.greedy.setAccessibleName("Greedy decoding")
        self._advanced_body = QWidget()
        box = QVBoxLayout(self.advanced)
        box.setContentsMargins(0, 0, 0, 0)
        box.addWidget(self._advanced_body)
        form = QFormLayout(self._advanced_body)
        form.addRow("&Temperature:", self.temperature)
        form.addRow("Top-&k:", self.top_k)
        form.addRow("S&eed:", self.seed)
        form.addRow("", self.greedy)
        self._advanced_widgets = [self.temperature, self.top_k, self.seed, self.greedy]
        for w in (self.temperature, self.top_k, self.seed):
            w.setMaximumWidth(w.fontMetrics().horizontalAdvance("0" * 22))
        self.advanced.toggled.connect(self._advanced_toggled)
        self._advanced_toggled(False)
        self.greedy.toggled.connect(lambda on: (self.temperature.setEnabled(not on and self.advanced.isChecked()),
                                                self.top_k.setEnabled(not on and self.advanced.isChecked())))

        self.generate_button = QPushButton("&Generate")
        self.generate_button.setAccessibleName("Generate speech")
        self.generate_button.setToolTip("Generate (Ctrl+Enter)")
        self.generate_button.setDefault(True)
        self.stop_button = QPushButton("&Stop")
        self.stop_button.setAccessibleName("Stop generating")
        self.stop_button.setEnabled(False)
        self.progress = QLabel("")
        self.progress.setAccessibleName("Progress")
        self.progress.setWordWrap(True)
        self.progress.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Preferred)

        top = QHBoxLayout()
        top.addWidget(language_label)
        top.addWidget(self.language)
        top.addStretch(1)
        actions = QHBoxLayout()
        actions.addWidget(self.generate_button)
        actions.addWidget(self.stop_button)
        actions.addWidget(self.progress, 1)
        layout = QVBoxLayout(self)
        layout.addWidget(self.text)
        layout.addLayout(top)
        layout.addWidget(self.advanced)
        layout.addLayout(actions)

        self.generate_button.clicked.connect(self.generate_requested)
        self.stop_button.clicked.connect(controller.stop)
        controller.languages_changed.connect(self.set_languages)
        controller.language_heard.connect(self._language_heard)
        controller.generating.connect(self._generating)
        # the speech plays on after a fast generation ends: Stop stays for it
        controller.result_player.state_changed.connect(
            lambda state: self.stop_button.setEnabled(controller.is_generating or state == "playing"))
        controller.progress_text.connect(self.progress.setText)
        self.set_languages(controller.languages)

    def _advanced_toggled(self, on: bool) -> None:
        self._advanced_body.setVisible(on)
        for w in self._advanced_widgets:
            w.setEnabled(on)
        if on and self.greedy.isChecked():
            self.temperature.setEnabled(False)
            self.top_k.setEnabled(False)

    def set_languages(self, languages: list[str]) -> None:
        current = self.language.currentText() or self.c.settings.language
        self.language.clear()
        self.language.addItems(["auto", *languages])
        index = self.language.findText(current)
        self.language.setCurrentIndex(max(index, 0))

    def _language_heard(self, language: str) -> None:
        index = self.language.findText(language)
        if index >= 0:
            self.language.setCurrentIndex(index)

    def _generating(self, on: bool) -> None:
        self.generate_button.setEnabled(not on)
        self.stop_button.setEnabled(on or self.c.result_player.state == "playing")
        if on:
            if self.generate_button.hasFocus():
                self.stop_button.setFocus(Qt.OtherFocusReason)
        elif self.stop_button.hasFocus():
            self.generate_button.setFocus(Qt.OtherFocusReason)

    def parameters(self) -> dict:
        """The generate() arguments the panel shows (advanced values only when it is open)."""
        params = dict(text=self.text.toPlainText(), language=self.language.currentText() or "auto")
        if self.advanced.isChecked():
            seed = self.seed.text().strip()
            params.update(temperature=self.temperature.value(), top_k=self.top_k.value(),
                          seed=int(seed) if seed else None, greedy=self.greedy.isChecked())
        return params


class ResultPanel(QGroupBox):
    """The generated (or replayed) audio: waveform, play/pause/seek, save."""

    save_requested = Signal()
    save_chapters_requested = Signal()

    def __init__(self, controller: Controller, parent: QWidget | None = None):
        super().__init__("Result", parent)
        self.c = controller
        self.wave = WaveformPlayer(controller.result_player, "Result")
        self.wave.set_placeholder("The speech appears here as it is generated.")
        self.save_button = QPushButton("Sa&ve as…")
        self.save_button.setAccessibleName("Save the result as an audio file")
        self.save_button.setToolTip("Save as " + ", ".join(f.upper() for f in EXPORT_FORMATS) + " (Ctrl+S)")
        self.save_button.setEnabled(False)
        self.chapters_button = QPushButton("C&hapters…")
        self.chapters_button.setAccessibleName("Save each chapter of the result as its own audio file")
        self.chapters_button.setToolTip("The text's headings (“# Title”) start chapters: save one file per chapter")
        self.chapters_button.hide()
        self.info = QLabel("")
        self.info.setWordWrap(True)
        self.info.setAccessibleName("Result details")
        self.check = QLabel("")
        self.check.setWordWrap(True)
        self.check.setAccessibleName("Result check")
        self.check.hide()
        row = QHBoxLayout()
        row.addWidget(self.info, 1)
        row.addWidget(self.chapters_button)
        row.addWidget(self.save_button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.wave)
        layout.addLayout(row)
        layout.addWidget(self.check)
        self.save_button.clicked.connect(self.save_requested)
        self.chapters_button.clicked.connect(self.save_chapters_requested)
        controller.result_ready.connect(self._result)
        controller.result_checked.connect(self._checked)
        controller.generating.connect(lambda on: self._result(controller.result))
        controller.saving.connect(lambda on: self._result(controller.result))
        controller.result_player.samples_changed.connect(lambda: self._result(controller.result))
        controller.audio_changed.connect(self.wave.refresh)

    def _checked(self, checked) -> None:
        """What speech recognition heard, and whether it matches: flagged results stand out."""
        verdict = "Check: " + checked.describe()
        self.check.setText(verdict + f" — heard: “{checked.transcript[:200]}”")
        self.check.setStyleSheet("" if checked.ok else "color: #b3261e; font-weight: bold;")
        self.check.show()

    def _result(self, result) -> None:
        if result is None or self.c.is_generating:
            self.check.hide()
        player = self.c.result_player
        saveable = player.samples.size > 0 and not player.streaming and not self.c.is_generating
        self.save_button.setEnabled(saveable and not self.c.is_saving)
        chapters = len(self.c.result_chapters)
        self.chapters_button.setVisible(saveable and chapters > 1)
        self.chapters_button.setEnabled(not self.c.is_saving)
        if result is not None:
            self.info.setText(f"{result.seconds:.1f} s, {result.mode} ({result.mode_reason}), seed {result.seed}"
                              + (f", {chapters} chapters" if chapters > 1 else ""))
        elif self.c.result_history_id is not None and not self.c.is_generating:
            self.info.setText(f"From the history: “{self.c.result_text[:80]}”")
        else:
            self.info.setText("")
