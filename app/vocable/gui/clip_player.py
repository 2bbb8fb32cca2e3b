"""Playback of a whole clip with play, pause and seek, on top of playback.StreamPlayer.

A ClipPlayer holds the samples shown by a waveform view. Playing from a position writes the
rest of the clip into a StreamPlayer (opened on a short-lived thread: opening a device can take
a moment, and the GUI thread must not wait); pause and seek stop it and remember where it was.
It can also follow a synthesis as it streams in: the synthesis worker plays the chunks, and
the clip grows and its cursor follows what the device has played.

No widgets here; the waveform view draws `samples` and `position`.
"""
from __future__ import annotations

import logging
import threading

import numpy as np
from PySide6.QtCore import QObject, QTimer, Signal, Slot

log = logging.getLogger("vocable.gui")

STOPPED, PLAYING, PAUSED = "stopped", "playing", "paused"


class ClipPlayer(QObject):
    samples_changed = Signal()          # a new clip, or chunks appended to a streaming one
    position_changed = Signal(float)    # seconds
    state_changed = Signal(str)         # STOPPED, PLAYING, PAUSED
    error = Signal(str)
    _opened = Signal(int, object, str)  # from the opening thread: token, player or None, error

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.samples = np.zeros(0, dtype=np.float32)
        self.sample_rate = 24000
        self.device: str | int | None = None
        self.available = True           # an output device exists
        self.unavailable_reason = ""
        self._streaming = False
        self._player = None
        self._start = 0.0               # clip seconds where the current player started
        self._position = 0.0
        self._state = STOPPED
        self._token = 0
        self._timer = QTimer(self)
        self._timer.setInterval(33)
        self._timer.timeout.connect(self._tick)
        self._opened.connect(self._on_opened)

    # -- the clip ---------------------------------------------------------------------------------

    @property
    def seconds(self) -> float:
        return self.samples.size / self.sample_rate if self.sample_rate else 0.0

    @property
    def position(self) -> float:
        return self._position

    @property
    def state(self) -> str:
        return self._state

    @property
    def streaming(self) -> bool:
        return self._streaming

    def set_clip(self, samples: np.ndarray | None, sample_rate: int = 24000) -> None:
        self.stop()
        self._streaming = False
        self.samples = np.zeros(0, dtype=np.float32) if samples is None else \
            np.ascontiguousarray(samples, dtype=np.float32).reshape(-1)
        self.sample_rate = int(sample_rate)
        self._set_position(0.0)
        self.samples_changed.emit()

    def clear(self) -> None:
        self.set_clip(None)

    def begin_stream(self, sample_rate: int) -> None:
        """A synthesis starts: the clip empties and grows with append()."""
        self.set_clip(None, sample_rate)
        self._streaming = True

    @Slot(object)
    def append(self, chunk: np.ndarray) -> None:
        self.samples = np.concatenate([self.samples, np.asarray(chunk, dtype=np.float32).reshape(-1)])
        self.samples_changed.emit()

    def attach_stream_player(self, player) -> None:
        """The synthesis worker's StreamPlayer: the cursor follows it until it has played out."""
        self._stop_player()
        self._player = player
        self._start = 0.0
        self._set_state(PLAYING)
        self._timer.start()

    def end_stream(self, samples: np.ndarray | None = None) -> None:
        """The synthesis ended; `samples` (the whole result) replaces the appended chunks."""
        self._streaming = False
        if samples is not None:
            self.samples = np.ascontiguousarray(samples, dtype=np.float32).reshape(-1)
            self.samples_changed.emit()

    # -- transport ---------------------------------------------------------------------------------

    def play(self) -> None:
        if self._streaming:   # the synthesis' own player plays the stream: it ends with it
            return
        if not self.available:
            self.error.emit(self.unavailable_reason or "no audio output device")
            return
        if self.samples.size == 0 or self._state == PLAYING:
            return
        start = self._position if self._position < self.seconds - 0.01 else 0.0
        self._open(start)

    def pause(self) -> None:
        # a pause of the synthesis' player would end it for good, and the speech still to come
        # with it: while streaming, Stop stops
        if self._state != PLAYING or self._streaming:
            return
        self._token += 1
        position = self._current_position()
        self._stop_player()
        self._set_position(position)
        self._set_state(PAUSED)

    def toggle(self) -> None:
        if self._state == PLAYING:
            self.pause()
        else:
            self.play()

    def seek(self, seconds: float) -> None:
        seconds = float(min(max(seconds, 0.0), self.seconds))
        if self._state == PLAYING and not self._streaming:
            self._token += 1
            self._stop_player()
            self._set_position(seconds)
            self._open(seconds)
        else:
            self._set_position(seconds)

    def stop(self) -> None:
        self._token += 1
        self._stop_player()
        self._timer.stop()
        if self._state != STOPPED:
            self._set_state(STOPPED)

    # -- internals ---------------------------------------------------------------------------------

    def _open(self, start: float) -> None:
        self._token += 1
        token = self._token
        samples = self.samples[int(start * self.sample_rate):]
        rate, device = self.sample_rate, self.device
        self._start = start
        self._set_state(PLAYING)

        def open_player():
            from ..audio.playback import StreamPlayer
            try:
                player = StreamPlayer(rate, device=device)
                player.write(samples)
                player.finish()
            except Exception as e:  # AudioDeviceError and device library surprises alike
                self._opened.emit(token, None, str(e))
                return
            self._opened.emit(token, player, "")

        threading.Thread(target=open_player, name="vocable-open-output", daemon=True).start()

    @Slot(int, object, str)
    def _on_opened(self, token: int, player, message: str) -> None:
        if token != self._token:  # paused, seeked or stopped meanwhile
            if player is not None:
                player.stop()
            return
        if player is None:
            log.warning("playback failed: %s", message)
            self._set_state(STOPPED)
            self.error.emit(message)
            return
        self._player = player
        self._timer.start()

    def _current_position(self) -> float:
        player = self._player
        if player is None:
            return self._position
        return min(self._start + player.played_seconds, self.seconds)  # played_seconds: seconds of the clip

    def _tick(self) -> None:
        player = self._player
        if player is None:
            return
        self._set_position(self._current_position())
        if player.finished and not self._streaming:
            self._player = None
            self._timer.stop()
            player.stop()
            self._set_position(0.0)
            self._set_state(STOPPED)

    def _stop_player(self) -> None:
        player, self._player = self._player, None
        if player is not None:
            player.stop()

    def _set_position(self, seconds: float) -> None:
        if seconds != self._position:
            self._position = seconds
            self.position_changed.emit(seconds)

    def _set_state(self, state: str) -> None:
        if state != self._state:
            self._state = state
            self.state_changed.emit(state)
