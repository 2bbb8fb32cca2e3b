"""Help > About: the versions (app, engine and its ABI range, ggml, Qt, Python), the model in use
and its license, and every component Vocable carries with its license; choosing a component
shows its license texts."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (QAbstractItemView, QApplication, QDialog, QDialogButtonBox, QFormLayout, QHBoxLayout,
                               QHeaderView, QLabel, QPlainTextEdit, QSplitter, QTableWidget, QTableWidgetItem,
                               QVBoxLayout, QWidget)

from .. import about

DESCRIPTION = ("Clones a voice from a few seconds of audio and speaks any text in it, locally, with "
               "Qwen3-TTS 12 Hz Base on a native ggml engine.")


class AboutDialog(QDialog):
    def __init__(self, model: tuple[str, str] | None, parent: QWidget | None = None):
        """`model`: (the model in use, what is known of its license), or None without one."""
        super().__init__(parent)
        self.setWindowTitle("About Vocable")
        self.components = about.components()

        icon = QLabel()
        icon.setPixmap(QApplication.windowIcon().pixmap(64, 64))
        versions = dict(about.versions())
        title = QLabel(f"<h2>Vocable {versions['Vocable']}</h2><p>{DESCRIPTION}</p>")
        title.setWordWrap(True)
        header = QHBoxLayout()
        header.addWidget(icon, 0, Qt.AlignTop)
        header.addWidget(title, 1)

        facts = QFormLayout()
        for name, value in versions.items():
            if name != "Vocable":
                facts.addRow(f"{name}:", self._selectable(value))
        facts.addRow("Model:", self._selectable(f"{model[0]} (license: {model[1]})" if model else "none loaded"))

        self.table = QTableWidget(len(self.components), 3)
        self.table.setAccessibleName("Components and their licenses")
        self.table.setHorizontalHeaderLabels(["Component", "Version", "License"])
        self.table.verticalHeader().hide()
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        for row, component in enumerate(self.components):
            for column, text in enumerate((component.name, component.version, component.license)):
                item = QTableWidgetItem(text)
                item.setToolTip(component.role)
                self.table.setItem(row, column, item)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.license_text = QPlainTextEdit()
        self.license_text.setAccessibleName("License text")
        self.license_text.setReadOnly(True)
        self.license_text.setFont(QFontDatabase.systemFont(QFontDatabase.FixedFont))
        self.table.currentCellChanged.connect(lambda row, *_: self.show_component(row))
        split = QSplitter(Qt.Vertical)
        split.addWidget(self.table)
        split.addWidget(self.license_text)

        buttons = QDialogButtonBox(QDialogButtonBox.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(header)
        layout.addLayout(facts)
        layout.addWidget(QLabel("Components and their licenses (choose one to read its license):"))
        layout.addWidget(split, 1)
        layout.addWidget(buttons)
        self.resize(760, 640)
        self.table.selectRow(0)

    @staticmethod
    def _selectable(text: str) -> QLabel:
        label = QLabel(text)
        label.setWordWrap(True)
        label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        return label

    def show_component(self, row: int) -> None:
        if not 0 <= row < len(self.components):
            return
        component = self.components[row]
        parts = [f"{component.name} {component.version}: {component.role}\nLicense: {component.license}"]
        parts += [f"==== {text.title} ====\n\n{text.text.rstrip()}" for text in component.texts]
        if not component.texts:
            parts.append("No license text was found for this component.")
        self.license_text.setPlainText("\n\n".join(parts))
