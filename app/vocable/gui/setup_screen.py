"""First launch without a model: how to get one, and the import or download running."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QComboBox, QFrame, QHBoxLayout, QLabel, QProgressBar, QPushButton, QVBoxLayout,
                               QWidget)

from .controller import Controller

INTRO = """<h2>Vocable needs a model</h2>
<p>Vocable speaks with Qwen3-TTS 12 Hz <i>Base</i> (0.6B or 1.7B), converted for its engine. Models are
kept in <code>{models}</code>. There are three ways to get one:</p>"""

CHOICES = [
    ("pick", "Use a converted model…",
     "A <code>.gguf</code> file made by <code>vocable convert</code> (or by this app on another machine)."),
    ("import", "Import a Hugging Face folder…",
     "A folder downloaded from Hugging Face (<code>Qwen/Qwen3-TTS-12Hz-0.6B-Base</code> or <code>-1.7B-Base</code>); "
     "it is converted here, which takes a minute or two."),
    ("download", "Download Qwen3-TTS 0.6B",
     "Fetches <code>Qwen/Qwen3-TTS-12Hz-0.6B-Base</code> (about 2.5 GB) from huggingface.co and converts it; "
     "needs a network connection."),
]


class SetupScreen(QWidget):
    pick_requested = Signal()
    import_requested = Signal(str)      # weight type
    download_requested = Signal(str)    # weight type

    def __init__(self, controller: Controller, models_dir: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.c = controller
        intro = QLabel(INTRO.format(models=models_dir))
        intro.setWordWrap(True)
        intro.setTextFormat(Qt.RichText)
        intro.setTextInteractionFlags(Qt.TextSelectableByMouse)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(32, 24, 32, 24)
        layout.addWidget(intro)
        self.buttons: dict[str, QPushButton] = {}
        for key, title, text in CHOICES:
            row = QHBoxLayout()
            b = QPushButton(title)
            b.setAccessibleName(title.rstrip("…"))
            b.setMinimumWidth(260)
            label = QLabel(text)
            label.setWordWrap(True)
            label.setTextFormat(Qt.RichText)
            row.addWidget(b, 0, Qt.AlignTop)
            row.addWidget(label, 1)
            layout.addLayout(row)
            self.buttons[key] = b
        self.weight_type = QComboBox()
        self.weight_type.setAccessibleName("Weight type for imports and downloads")
        for value, text in (("q8_0", "q8_0 — small and fast (recommended)"), ("q4_k", "q4_k — smallest"),
                            ("f16", "f16 — larger"), ("f32", "f32 — largest, exact")):
            self.weight_type.addItem(text, value)
        index = self.weight_type.findData(controller.settings.quantization)
        self.weight_type.setCurrentIndex(max(index, 0))
        wt_label = QLabel("&Weight type for imports and downloads:")
        wt_label.setBuddy(self.weight_type)
        row = QHBoxLayout()
        row.addWidget(wt_label)
        row.addWidget(self.weight_type)
        row.addStretch(1)
        layout.addLayout(row)

        line = QFrame()
        line.setFrameShape(QFrame.HLine)
        layout.addWidget(line)
        self.task = QLabel("")
        self.task.setWordWrap(True)
        self.task.setAccessibleName("Model task status")
        self.bar = QProgressBar()
        self.bar.setAccessibleName("Model task progress")
        self.bar.setVisible(False)
        self.cancel_button = QPushButton("&Cancel")
        self.cancel_button.setAccessibleName("Cancel the import or download")
        self.cancel_button.setVisible(False)
        task_row = QHBoxLayout()
        task_row.addWidget(self.bar, 1)
        task_row.addWidget(self.cancel_button)
        layout.addWidget(self.task)
        layout.addLayout(task_row)
        layout.addStretch(1)

        self.buttons["pick"].clicked.connect(self.pick_requested)
        self.buttons["import"].clicked.connect(lambda: self.import_requested.emit(self.weight_type.currentData()))
        self.buttons["download"].clicked.connect(lambda: self.download_requested.emit(self.weight_type.currentData()))
        self.cancel_button.clicked.connect(controller.cancel_model_task)
        controller.model_task.connect(self.show_task)
        controller.model_state.connect(self._model_state)

    def show_task(self, state: str, fraction: float, text: str) -> None:
        running = state == "running"
        self.bar.setVisible(running)
        self.cancel_button.setVisible(running)
        for b in self.buttons.values():
            b.setEnabled(not running)
        if running:
            if fraction < 0:
                self.bar.setRange(0, 0)
            else:
                self.bar.setRange(0, 1000)
                self.bar.setValue(int(1000 * fraction))
        prefix = {"failed": "Failed: ", "cancelled": "Cancelled: "}.get(state, "")
        self.task.setText(prefix + text)

    def _model_state(self, state: str, text: str) -> None:
        if state == "loading":
            self.task.setText(text)
        elif state == "error":
            self.task.setText("Cannot load the model: " + text)
