"""The voice library and the history, as lists with their actions. The file dialogs and name
prompts are asked for through signals, so the main window owns every dialog."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QAbstractItemView, QGridLayout, QLabel, QListWidget, QListWidgetItem, QPushButton,
                               QVBoxLayout, QWidget)

from .controller import Controller

ID_ROLE = Qt.UserRole


class _ListPanel(QWidget):
    def __init__(self, name: str, empty: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.list = QListWidget()
        self.list.setAccessibleName(name)
        self.list.setSelectionMode(QAbstractItemView.SingleSelection)
        self.list.setAlternatingRowColors(True)
        self.list.setWordWrap(True)
        self.empty = QLabel(empty)
        self.empty.setWordWrap(True)
        self.empty.setAlignment(Qt.AlignCenter)
        self.buttons = QGridLayout()
        layout = QVBoxLayout(self)
        layout.addWidget(self.list, 1)
        layout.addWidget(self.empty)
        layout.addLayout(self.buttons)
        self.list.itemSelectionChanged.connect(self._selection)

    def _button(self, text: str, accessible: str, row: int, col: int, needs_selection: bool = True) -> QPushButton:
        b = QPushButton(text)
        b.setAccessibleName(accessible)
        b.setProperty("needs_selection", needs_selection)
        self.buttons.addWidget(b, row, col)
        return b

    def selected_id(self) -> str | None:
        items = self.list.selectedItems()
        return items[0].data(ID_ROLE) if items else None

    def select(self, entry_id: str) -> None:
        for i in range(self.list.count()):
            if self.list.item(i).data(ID_ROLE) == entry_id:
                self.list.setCurrentRow(i)
                return

    def _fill(self, rows: list[tuple[str, str, str]]) -> None:
        keep = self.selected_id()
        self.list.clear()
        for entry_id, text, tip in rows:
            item = QListWidgetItem(text)
            item.setData(ID_ROLE, entry_id)
            item.setToolTip(tip)
            self.list.addItem(item)
        self.empty.setVisible(not rows)
        if keep:
            self.select(keep)
        self._selection()

    def _selection(self) -> None:
        has = self.selected_id() is not None
        for i in range(self.buttons.count()):
            w = self.buttons.itemAt(i).widget()
            if w is not None and w.property("needs_selection"):
                w.setEnabled(has)


class LibraryPanel(_ListPanel):
    """Saved voices: use, save the current one, rename, delete, export, import."""

    save_requested = Signal()
    rename_requested = Signal(str)
    delete_requested = Signal(str)
    export_requested = Signal(str)
    import_requested = Signal()
    add_clip_requested = Signal(str)

    def __init__(self, controller: Controller, parent: QWidget | None = None):
        super().__init__("Saved voices", "No saved voices yet. Choose a reference, then “Save voice…”.", parent)
        self.c = controller
        self.use_button = self._button("&Use", "Use the selected voice", 0, 0)
        self.save_button = self._button("Save current…", "Save the current voice", 0, 1, needs_selection=False)
        self.rename_button = self._button("Rena&me…", "Rename the selected voice", 1, 0)
        self.delete_button = self._button("Delete", "Delete the selected voice", 1, 1)
        self.export_button = self._button("Export…", "Export the selected voice to a file", 2, 0)
        self.import_button = self._button("&Import…", "Import a voice file", 2, 1, needs_selection=False)
        self.add_clip_button = self._button("Add a c&lip…", "Add another recording of this speaker to the "
                                            "selected voice", 3, 0)
        self.add_clip_button.setToolTip("Another clip of the same speaker, averaged into the voice's speaker "
                                        "embedding: a steadier voice from several recordings")
        self.use_button.clicked.connect(lambda: self._with_id(controller.use_voice))
        self.list.itemActivated.connect(lambda item: controller.use_voice(item.data(ID_ROLE)))
        self.save_button.clicked.connect(self.save_requested)
        self.rename_button.clicked.connect(lambda: self._with_id(self.rename_requested.emit))
        self.delete_button.clicked.connect(lambda: self._with_id(self.delete_requested.emit))
        self.export_button.clicked.connect(lambda: self._with_id(self.export_requested.emit))
        self.import_button.clicked.connect(self.import_requested)
        self.add_clip_button.clicked.connect(lambda: self._with_id(self.add_clip_requested.emit))
        controller.library_changed.connect(self.refresh)
        controller.reference_changed.connect(self._selection)
        self.refresh()

    def _with_id(self, fn) -> None:
        entry_id = self.selected_id()
        if entry_id is not None:
            fn(entry_id)

    def _selection(self) -> None:
        super()._selection()
        self.save_button.setEnabled(self.c.reference is not None)

    def refresh(self) -> None:
        rows = []
        for e in self.c.voice_entries():
            mode = "in-context ready" if e.has_codes and e.ref_text else "x-vector"
            clips = f" · {e.clips} clips" if e.clips > 1 else ""
            created = e.created.astimezone()
            rows.append((e.id, f"{e.name}\n{e.seconds:.1f} s · {e.model_variant or '?'} · {mode}{clips}",
                         f"{e.name}\nsaved {created:%Y-%m-%d %H:%M}\ntranscript: {e.ref_text or '(none)'}"))
        self._fill(rows)

    def entry_name(self, entry_id: str) -> str:
        for e in self.c.voice_entries():
            if e.id == entry_id:
                return e.name
        return ""


class HistoryPanel(_ListPanel):
    """Past generations: replay, export, delete."""

    export_requested = Signal(str)
    delete_requested = Signal(str)

    def __init__(self, controller: Controller, parent: QWidget | None = None):
        super().__init__("History", "Nothing generated yet.", parent)
        self.c = controller
        self.replay_button = self._button("&Replay", "Replay the selected generation", 0, 0)
        self.export_button = self._button("E&xport…", "Export the selected generation", 0, 1)
        self.delete_button = self._button("Delete", "Delete the selected generation", 0, 2)
        self.replay_button.clicked.connect(lambda: self._with_id(controller.show_history))
        self.list.itemActivated.connect(lambda item: controller.show_history(item.data(ID_ROLE)))
        self.export_button.clicked.connect(lambda: self._with_id(self.export_requested.emit))
        self.delete_button.clicked.connect(lambda: self._with_id(self.delete_requested.emit))
        controller.history_changed.connect(self.refresh)
        controller.generating.connect(
            lambda on: self.replay_button.setEnabled(not on and self.selected_id() is not None))
        self.refresh()

    def _with_id(self, fn) -> None:
        entry_id = self.selected_id()
        if entry_id is not None:
            fn(entry_id)

    def refresh(self) -> None:
        rows = []
        for e in self.c.history_entries():
            text = " ".join(e.text.split())
            short = text if len(text) <= 70 else text[:67] + "…"
            settings = e.settings or {}
            created = e.created.astimezone()
            rows.append((e.id, f"{short}\n{e.voice_name} · {e.seconds:.1f} s · {created:%Y-%m-%d %H:%M}",
                         f"{text}\n\nvoice: {e.voice_name}\nmode: {settings.get('mode', '?')}, "
                         f"language: {settings.get('language', 'auto')}, seed: {settings.get('seed', '?')}\n"
                         f"{created:%Y-%m-%d %H:%M:%S}"))
        self._fill(rows)
