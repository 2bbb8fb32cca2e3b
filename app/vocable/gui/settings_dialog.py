"""Settings: model, weight type for imports, compute device, threads, input and output device, export
folder, the speech API."""
from __future__ import annotations

import os

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QComboBox, QDialog, QDialogButtonBox, QFileDialog, QFormLayout, QHBoxLayout,
                               QCheckBox, QLabel, QLineEdit, QPushButton, QSpinBox, QWidget)

from .controller import Controller

SYSTEM_DEFAULT = "System default"


class SettingsDialog(QDialog):
    def __init__(self, controller: Controller, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Vocable settings")
        self.c = controller
        s = controller.settings
        self.model = QComboBox()
        self.model.setAccessibleName("Model")
        self.model.setEditable(False)
        for entry in controller.model_entries():
            size = entry.size_bytes / 2**20
            self.model.addItem(f"{entry.name} ({entry.variant}, {entry.weight_type}, {size:.0f} MiB)", str(entry.path))
        if s.model_path and self.model.findData(s.model_path) < 0:
            self.model.addItem(s.model_path, s.model_path)
        self.model.setCurrentIndex(max(self.model.findData(s.model_path), 0))
        model_row = self._with_browse(self.model, "Choose a model file", self._browse_model)

        self.quantization = QComboBox()
        self.quantization.setAccessibleName("Weight type for imports and downloads")
        self.quantization.addItems(["q8_0", "q4_k", "f16", "f32"])
        self.quantization.setCurrentText(s.quantization)
        self.threads = QSpinBox()
        self.threads.setAccessibleName("Threads")
        self.threads.setRange(0, max(os.cpu_count() or 1, 1) * 2)
        self.threads.setSpecialValueText(f"All cores ({os.cpu_count() or 1})")
        self.threads.setValue(s.threads or 0)
        self.compute_device = self._compute_devices(controller.compute_devices(), s.compute_device)
        self.output = self._devices(controller.audio.outputs, s.output_device, "Output device")
        self.input = self._devices(controller.audio.inputs, s.input_device, "Input device")
        if not controller.audio.output:
            self.output.setToolTip(controller.audio.output_reason)
        if not controller.audio.input:
            self.input.setToolTip(controller.audio.input_reason)
        self.export_dir = QLineEdit(s.export_dir or "")
        self.export_dir.setAccessibleName("Export folder")
        self.export_dir.setPlaceholderText(str(controller.default_export_dir()))
        export_row = self._with_browse(self.export_dir, "Choose the export folder", self._browse_export)

        self.check_results = QCheckBox("Transcribe each result and compare it with the text and the voice")
        self.check_results.setAccessibleName("Check each result")
        self.check_results.setToolTip("Speech recognition (Whisper) flags a garbled or runaway passage, and a voice "
                                      "that drifted from the reference")
        self.check_results.setChecked(s.check_results)
        self.api_server = QCheckBox("Serve the OpenAI-compatible speech API on this machine")
        self.api_server.setAccessibleName("Speech API")
        self.api_server.setChecked(s.api_server)
        self.api_port = QSpinBox()
        self.api_port.setAccessibleName("Speech API port")
        self.api_port.setRange(1024, 65535)
        self.api_port.setValue(s.api_port)
        self.api_address = QLabel()
        self.api_address.setTextInteractionFlags(self.api_address.textInteractionFlags() | Qt.TextSelectableByMouse)
        self.api_server.toggled.connect(self._show_api_address)
        self.api_port.valueChanged.connect(self._show_api_address)
        self._show_api_address()
        api_row = QHBoxLayout()
        api_row.addWidget(self.api_server, 1)
        api_row.addWidget(self.api_port)

        form = QFormLayout(self)
        form.addRow("&Model:", model_row)
        form.addRow("&Weight type for imports:", self.quantization)
        form.addRow("&Compute device:", self.compute_device)
        form.addRow("&Threads:", self.threads)
        form.addRow("&Output device:", self.output)
        form.addRow("&Input device:", self.input)
        form.addRow("&Export folder:", export_row)
        form.addRow("C&heck results:", self.check_results)
        form.addRow("Speech &API:", api_row)
        form.addRow("", self.api_address)
        buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)

    @staticmethod
    def _with_browse(field: QWidget, accessible: str, browse) -> QHBoxLayout:
        """`field` with a Browse… button after it that calls `browse`."""
        button = QPushButton("Browse…")
        button.setAccessibleName(accessible)
        button.clicked.connect(browse)
        row = QHBoxLayout()
        row.addWidget(field, 1)
        row.addWidget(button)
        return row

    @staticmethod
    def _devices(names: list[str], current: str | None, accessible: str) -> QComboBox:
        box = QComboBox()
        box.setAccessibleName(accessible)
        box.addItem(SYSTEM_DEFAULT, None)
        for name in names:
            box.addItem(name, name)
        if current and box.findData(current) < 0:
            box.addItem(f"{current} (not present)", current)
        box.setCurrentIndex(max(box.findData(current), 0) if current else 0)
        box.setEnabled(bool(names))
        return box

    @staticmethod
    def _compute_devices(devices: list[dict], current: str) -> QComboBox:
        """Automatic first, then each device with its name and memory (a GPU's)."""
        box = QComboBox()
        box.setAccessibleName("Compute device")
        gpus = [d for d in devices if d["kind"] != "cpu"]
        box.addItem("Automatic: the best GPU, else the CPU" if gpus else "Automatic: the CPU (no GPU found)", "auto")
        for d in devices:
            if d["kind"] == "cpu":
                box.addItem(f"CPU ({d['description']})", "cpu")
            else:
                memory = f", {d['memory_total'] / 2 ** 30:.1f} GiB" if d["memory_total"] else ""
                box.addItem(f"{d['id']}: {d['description']}{memory}", d["id"])
        if box.findData(current) < 0:
            box.addItem(f"{current} (not present: the CPU runs it)", current)
        box.setCurrentIndex(box.findData(current))
        return box

    def _show_api_address(self) -> None:
        """Where programs reach it (the address it will have, or has)."""
        running = self.c.api_address
        address = f"http://127.0.0.1:{self.api_port.value()}/v1"
        if not self.api_server.isChecked():
            self.api_address.setText("Off: only this app speaks." if not running else "Stops when you press OK.")
        elif running == address:
            self.api_address.setText(f"Running at {address} (this machine only)")
        else:
            self.api_address.setText(f"Starts at {address} when you press OK (this machine only)")

    def _browse_model(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose a converted model", "", "Vocable models (*.gguf)")
        if path:
            if self.model.findData(path) < 0:
                self.model.addItem(path, path)
            self.model.setCurrentIndex(self.model.findData(path))

    def _browse_export(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Export folder", self.export_dir.text() or "")
        if path:
            self.export_dir.setText(path)

    def values(self) -> dict:
        return dict(model_path=self.model.currentData(), quantization=self.quantization.currentText(),
                    compute_device=self.compute_device.currentData(),
                    threads=self.threads.value() or None, output_device=self.output.currentData(),
                    input_device=self.input.currentData(), export_dir=self.export_dir.text().strip() or None,
                    check_results=self.check_results.isChecked(), api_server=self.api_server.isChecked(),
                    api_port=self.api_port.value())
