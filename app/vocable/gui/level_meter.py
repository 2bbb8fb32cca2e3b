"""A horizontal input level meter in dBFS (-60 to 0), with a peak marker that falls back slowly."""
from __future__ import annotations

from PySide6.QtCore import QRectF, QSize
from PySide6.QtGui import QColor, QPainter, QPalette
from PySide6.QtWidgets import QSizePolicy, QWidget

from .waveform import paint_frame

FLOOR_DB = -60.0


class LevelMeter(QWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)
        self.setAccessibleName("Input level")
        self._db = FLOOR_DB
        self._peak = FLOOR_DB

    def sizeHint(self) -> QSize:
        return QSize(200, 14)

    @property
    def level_db(self) -> float:
        return self._db

    def set_level(self, db: float) -> None:
        db = max(FLOOR_DB, min(0.0, float(db))) if db == db else FLOOR_DB  # NaN: silence
        self._db = db
        self._peak = max(db, self._peak - 0.6)
        self.setAccessibleDescription(f"{db:.0f} dBFS")
        self.update()

    def reset(self) -> None:
        self._db = self._peak = FLOOR_DB
        self.update()

    def paintEvent(self, _event) -> None:
        p = QPainter(self)
        pal = self.palette()
        r = paint_frame(p, self, pal.color(QPalette.Mid))
        frac = (self._db - FLOOR_DB) / -FLOOR_DB
        color = QColor("#2e9d4a") if self._db < -12 else QColor("#d9a400") if self._db < -3 else QColor("#d23c2c")
        p.fillRect(QRectF(r.left() + 1, r.top() + 1, max(0.0, (r.width() - 2) * frac), r.height() - 2), color)
        px = r.left() + (r.width() - 2) * (self._peak - FLOOR_DB) / -FLOOR_DB
        p.setPen(pal.color(QPalette.Text))
        p.drawLine(int(px), int(r.top()) + 1, int(px), int(r.bottom()) - 1)
