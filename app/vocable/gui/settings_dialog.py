"""Settings: model, weight type for imports, compute device, threads, input and output device, export
folder."""
from __future__ import annotations

import os

from PySide6.QtWidgets import (QComboBox, QDialog, QDialogButtonBox, QFileDialog, QFormLayout, QHBoxLayout,
                               QLineEdit, QPushButton, QSpinBox, QWidget)

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

        form = QFormLayout(self)
        form.addRow("&Model:", model_row)
        form.addRow("&Weight type for imports:", self.quantization)
        form.addRow("&Compute device:", self.compute_device)
        form.addRow("&Threads:", self.threads)
        form.addRow("&Output device:", self.output)
        form.addRow("&Input device:", self.input)
        form.addRow("&Export folder:", export_row)
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
                    input_device=self.input.currentData(), export_dir=self.export_dir.text().strip() or None)
