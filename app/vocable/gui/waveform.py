"""Waveform display with a play/pause button, a time readout and seeking (click, drag, arrow
keys); it shows a ClipPlayer and forwards the user's transport actions to it."""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import QLineF, QPointF, QRectF, QSize, Qt, Signal
from PySide6.QtGui import QPainter, QPalette, QPen
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSizePolicy, QToolButton, QWidget, QStyle

from .clip_player import PLAYING, ClipPlayer


def paint_frame(p: QPainter, widget: QWidget, border) -> QRectF:
    """The widget's background (the palette's Base) in a one-pixel `border`; returns the frame's rectangle."""
    r = QRectF(widget.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
    p.fillRect(r, widget.palette().color(QPalette.Base))
    p.setPen(border)
    p.drawRect(r)
    return r


def format_time(seconds: float) -> str:
    seconds = max(0.0, seconds)
    return f"{int(seconds // 60)}:{seconds % 60:04.1f}"


class WaveformView(QWidget):
    """Min/max envelope of the samples, a cursor at the position; click or drag to seek,
    Left/Right (Shift: 5 s) to step, Home/End, Space to play or pause."""

    seek_requested = Signal(float)
    toggle_requested = Signal()

    BINS = 2048

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setFocusPolicy(Qt.StrongFocus)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Preferred)
        self.setMinimumHeight(64)
        self._env = np.zeros((0, 2), dtype=np.float32)
        self._seconds = 0.0
        self._position = 0.0
        self._placeholder = ""

    def sizeHint(self) -> QSize:
        return QSize(480, 80)

    def set_placeholder(self, text: str) -> None:
        self._placeholder = text
        self.update()

    def set_samples(self, samples: np.ndarray, rate: int) -> None:
        self._seconds = samples.size / rate if rate else 0.0
        self._env = envelope(samples, self.BINS)
        self.update()

    def set_position(self, seconds: float) -> None:
        self._position = seconds
        self.update()

    def paintEvent(self, _event) -> None:
        p = QPainter(self)
        pal = self.palette()
        r = paint_frame(p, self, QPen(pal.color(QPalette.Highlight) if self.hasFocus() else pal.color(QPalette.Mid), 1))
        w, h = r.width(), r.height()
        mid = r.top() + h / 2
        if self._env.shape[0] == 0:
            p.setPen(pal.color(QPalette.PlaceholderText))
            p.drawText(r, Qt.AlignCenter | Qt.TextWordWrap, self._placeholder)
            return
        n = self._env.shape[0]
        cols = max(1, int(w))
        # the envelope's bins fill the width in proportion to their share of the clip
        idx = np.minimum((np.arange(cols) * n / cols).astype(int), n - 1)
        env = self._env[idx]
        played_x = r.left() + (self._position / self._seconds * w if self._seconds else 0)
        wave = pal.color(QPalette.Text)
        played = pal.color(QPalette.Highlight)
        scale = h / 2 * 0.95
        top = mid - env[:, 1] * scale
        bottom = np.maximum(mid - env[:, 0] * scale, top + 1)  # at least a pixel where it is silent
        split = int(max(0, min(cols, played_x - r.left() + 1)))
        for color, cols_range in ((played, range(0, split)), (wave, range(split, cols))):
            if not cols_range:
                continue
            p.setPen(color)
            p.drawLines([QLineF(r.left() + x, top[x], r.left() + x, bottom[x]) for x in cols_range])
        p.setPen(QPen(pal.color(QPalette.Highlight), 2))
        p.drawLine(QPointF(played_x, r.top()), QPointF(played_x, r.bottom()))

    def _seek_to_x(self, x: float) -> None:
        if self._seconds and self.width():
            self.seek_requested.emit(min(max(x / self.width(), 0.0), 1.0) * self._seconds)

    def mousePressEvent(self, event) -> None:
        if event.button() == Qt.LeftButton:
            self.setFocus(Qt.MouseFocusReason)
            self._seek_to_x(event.position().x())

    def mouseMoveEvent(self, event) -> None:
        if event.buttons() & Qt.LeftButton:
            self._seek_to_x(event.position().x())

    def keyPressEvent(self, event) -> None:
        step = 5.0 if event.modifiers() & Qt.ShiftModifier else 1.0
        key = event.key()
        if key == Qt.Key_Left:
            self.seek_requested.emit(max(0.0, self._position - step))
        elif key == Qt.Key_Right:
            self.seek_requested.emit(min(self._seconds, self._position + step))
        elif key == Qt.Key_Home:
            self.seek_requested.emit(0.0)
        elif key == Qt.Key_End:
            self.seek_requested.emit(self._seconds)
        elif key == Qt.Key_Space:
            self.toggle_requested.emit()
        else:
            super().keyPressEvent(event)


def envelope(samples: np.ndarray, bins: int) -> np.ndarray:
    """[min(bins, n), 2] (min, max) of consecutive blocks of the samples."""
    x = np.asarray(samples, dtype=np.float32).reshape(-1)
    if x.size == 0:
        return np.zeros((0, 2), dtype=np.float32)
    bins = min(bins, x.size)
    edges = np.linspace(0, x.size, bins + 1).astype(int)
    lo = np.minimum.reduceat(x, edges[:-1])
    hi = np.maximum.reduceat(x, edges[:-1])
    peak = max(float(np.max(np.abs(x))), 1e-6)
    gain = 1.0 / peak if peak < 0.5 else 1.0  # quiet clips drawn larger, loud ones as they are
    return np.clip(np.stack([lo, hi], axis=1) * gain, -1, 1)


class WaveformPlayer(QWidget):
    """A waveform with a play/pause button and "position / length", bound to a ClipPlayer."""

    def __init__(self, player: ClipPlayer, name: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.player = player
        self.view = WaveformView(self)
        self.view.setAccessibleName(f"{name} waveform")
        self.view.setAccessibleDescription("Click or use the arrow keys to seek; Space plays or pauses.")
        self.button = QToolButton(self)
        self.button.setAccessibleName(f"Play {name.lower()}")
        self.button.setToolButtonStyle(Qt.ToolButtonIconOnly)
        self.button.setAutoRaise(False)
        self.button.setFocusPolicy(Qt.StrongFocus)
        self.time = QLabel(format_time(0) + " / " + format_time(0), self)
        self.time.setAccessibleName(f"{name} position")
        self.time.setMinimumWidth(self.time.fontMetrics().horizontalAdvance("00:00.0 / 00:00.0"))
        self._name = name
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.button, 0, Qt.AlignVCenter)
        row.addWidget(self.view, 1)
        row.addWidget(self.time, 0, Qt.AlignVCenter)

        self.button.clicked.connect(player.toggle)
        self.view.toggle_requested.connect(player.toggle)
        self.view.seek_requested.connect(player.seek)
        player.samples_changed.connect(self._samples)
        player.position_changed.connect(self._position)
        player.state_changed.connect(self._state)
        self._samples()
        self._state(player.state)

    def set_placeholder(self, text: str) -> None:
        self.view.set_placeholder(text)

    def _samples(self) -> None:
        self.view.set_samples(self.player.samples, self.player.sample_rate)
        self._position(self.player.position)
        self._update_enabled()

    def _position(self, seconds: float) -> None:
        self.view.set_position(seconds)
        self.time.setText(f"{format_time(seconds)} / {format_time(self.player.seconds)}")

    def _state(self, state: str) -> None:
        playing = state == PLAYING
        icon = QStyle.SP_MediaPause if playing else QStyle.SP_MediaPlay
        self.button.setIcon(self.style().standardIcon(icon))
        self.button.setText("Pause" if playing else "Play")
        self.button.setAccessibleName(f"{'Pause' if playing else 'Play'} {self._name.lower()}")
        self._update_enabled()

    def _update_enabled(self) -> None:
        has_audio = self.player.samples.size > 0
        self.button.setEnabled(has_audio and self.player.available and not self.player.streaming)
        self.view.setEnabled(has_audio)
        if not self.player.available:
            self.button.setToolTip("Playback is off: " + (self.player.unavailable_reason or "no output device"))
        else:
            self.button.setToolTip("Play or pause (Space in the waveform)")

    def refresh(self) -> None:
        self._update_enabled()
