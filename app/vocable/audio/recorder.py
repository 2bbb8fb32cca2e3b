"""Recording a reference from the microphone, through PortAudio (sounddevice).

No Qt and no engine here; the GUI shows the level and the elapsed time and stops it:

    rec = Recorder(on_level=meter.set_db, on_stopped=lambda reason: ...)   # nothing opened yet
    rec.start()                   # AudioDeviceError: no PortAudio, no input device, device busy
    ...                           # rec.elapsed, rec.level_db while it runs
    samples, rate = rec.stop()    # float32 mono at the device's own rate

The device records at its own default sample rate (no resampling in the driver; the reference
check resamples to 24 kHz with soxr) and with the fewest channels it takes, mixed down to mono
by averaging. Recording stops by itself after `max_seconds` (MAX_RECORD_SECONDS by default),
keeping exactly that much audio, and when the device stops delivering audio (unplugged, taken
away by the system): `on_stopped` then says why.

Threads: `on_level` runs on PortAudio's audio thread, once per block, and must return quickly
(the GUI forwards it through a queued signal). `on_stopped` runs once per recording: in the
thread that called stop(), or on a short-lived thread of its own when the recording ended by
itself, never on the audio thread, so it may call stop().
"""
from __future__ import annotations

import logging
import math
import threading
import time
from typing import Callable

import numpy as np

from . import devices as audio_devices
from ..errors import AudioDeviceError

log = logging.getLogger(__name__)

# The automatic stop. The engine uses at most 60 s of a reference and 3 to 10 s clone best, so
# 30 s leaves room for a slow start and long pauses and still ends a recording that was
# forgotten before it grows useless (30 s of 48 kHz float32 is under 6 MB).
MAX_RECORD_SECONDS = 30.0
# Level reported for digital silence (and the floor of every level): 20*log10 of one 16-bit
# step is -90 dBFS, so nothing a microphone gives is quieter.
SILENCE_DB = -100.0
# No audio block for this long while recording means the device is gone: PortAudio blocks come
# every few to a few hundred milliseconds. The first block may take longer: a sound server wakes
# its idle devices first (PulseAudio took 1.5 s in the tests), so it gets START_SECONDS.
STALL_SECONDS = 2.0
START_SECONDS = 5.0

STOPPED = "stopped"
MAX_LENGTH = "max length"


def _sounddevice():
    """The sounddevice module, or AudioDeviceError saying what is missing."""
    return audio_devices.sounddevice_module("record audio")


def input_devices() -> list[str]:
    """Names of the audio input devices PortAudio sees (AudioDeviceError without PortAudio)."""
    return audio_devices.device_names(_sounddevice(), "input")


def _settings(sd, info: dict) -> tuple[int, int]:
    """(sample rate, channels) to open the device with: its default rate (or a common one it
    takes), and the fewest channels it takes (1, 2, or all of them)."""
    default = int(round(info["default_samplerate"] or 0))
    rates = [r for r in dict.fromkeys((default, 48000, 44100, 32000, 24000, 16000)) if r > 0]
    most = int(info["max_input_channels"])
    for rate in rates:
        for channels in dict.fromkeys((1, min(2, most), most)):
            try:
                sd.check_input_settings(device=info["index"], samplerate=rate, channels=channels, dtype="float32")
                return rate, channels
            except (sd.PortAudioError, ValueError):
                continue
    # nothing checked out: open with the defaults and let PortAudio say what is wrong
    return default or 48000, min(2, most)


def _db(peak: float) -> float:
    return max(20.0 * math.log10(peak), SILENCE_DB) if peak > 0 else SILENCE_DB


class Recorder:
    """Records mono float32 from an input device (see the module doc). One recording at a
    time; start() again after stop() begins a new one."""

    def __init__(self, device: int | str | None = None, max_seconds: float = MAX_RECORD_SECONDS,
                 on_level: Callable[[float], None] | None = None,
                 on_stopped: Callable[[str], None] | None = None,
                 stall_seconds: float | None = STALL_SECONDS):
        """`device`: an index, a name or part of one, or None for the system's default input.
        `on_level(db)`: the peak level in dBFS of each block, from the audio thread.
        `on_stopped(reason)`: "stopped", "max length" or "device error: <what happened>".
        `stall_seconds`: how long without audio means the device is gone (None: never)."""
        if not max_seconds > 0:
            raise ValueError("max_seconds must be positive")
        self.device = device
        self.max_seconds = float(max_seconds)
        self.on_level = on_level
        self.on_stopped = on_stopped
        self.stall_seconds = stall_seconds
        self.sample_rate: int = 0       # known once started
        self.channels: int = 0          # as opened (mixed down to mono)
        self.device_name: str = ""
        self.level_db: float = SILENCE_DB   # peak of the last block
        self.overflows = 0              # PortAudio dropped input (the audio thread was late)
        self.stop_reason: str | None = None
        self._sd = None
        self._stream = None
        self._lock = threading.Lock()
        self._blocks: list[np.ndarray] = []
        self._frames = 0
        self._limit = 0
        self._running = False
        self._last_block = 0.0
        self._blocks_seen = 0
        self._watchdog: threading.Thread | None = None
        self._ended = threading.Event()

    # -- the caller's side ------------------------------------------------------------------------

    def start(self) -> None:
        """Opens the device and starts recording. AudioDeviceError with a message for the user
        when there is no PortAudio, no input device, or the device refuses (busy, unplugged)."""
        with self._lock:
            if self._running:
                raise RuntimeError("already recording")
        self._close_stream()
        sd = _sounddevice()
        self._sd = sd
        info = audio_devices.find_device(sd, self.device, "input")
        rate, channels = _settings(sd, info)
        with self._lock:
            self.device_name = info["name"]
            self.sample_rate, self.channels = rate, channels
            self._blocks, self._frames = [], 0
            self._limit = max(1, int(round(self.max_seconds * rate)))
            self.level_db, self.overflows, self.stop_reason = SILENCE_DB, 0, None
            self._ended.clear()
            self._last_block = time.monotonic()
            self._blocks_seen = 0
            self._running = True
        try:
            self._stream = sd.InputStream(samplerate=rate, device=info["index"], channels=channels, dtype="float32",
                                          callback=self._callback, finished_callback=self._finished)
            self._stream.start()
        except (sd.PortAudioError, ValueError) as e:
            with self._lock:
                self._running = False
            self._ended.set()
            self._close_stream()
            raise AudioDeviceError(f"cannot record from '{self.device_name}': {e}" + _hint(str(e))) from e
        if self.stall_seconds:
            self._watchdog = threading.Thread(target=self._watch, name="vocable-recorder-watchdog", daemon=True)
            self._watchdog.start()

    def stop(self) -> tuple[np.ndarray, int]:
        """Stops recording (if it still runs) and returns what was recorded: float32 mono
        samples and their sample rate. Idempotent: after the end it returns the same audio."""
        with self._lock:
            notify = self._running
            if notify:
                self.stop_reason = STOPPED
                self._running = False
        self._close_stream()
        self._ended.set()
        if notify:
            self._notify(STOPPED)
        return self.samples(), self.sample_rate

    def samples(self) -> np.ndarray:
        """The audio recorded so far (float32 mono), also while recording."""
        with self._lock:
            blocks = list(self._blocks)
        return np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.float32)

    @property
    def running(self) -> bool:
        return self._running

    @property
    def elapsed(self) -> float:
        """Seconds recorded so far."""
        return self._frames / self.sample_rate if self.sample_rate else 0.0

    def wait(self, timeout: float | None = None) -> bool:
        """Waits until the recording has ended (stop(), the maximum length or a device error);
        True when it has."""
        return self._ended.wait(timeout)

    def __enter__(self) -> "Recorder":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- ending ---------------------------------------------------------------------------------

    def _end(self, reason: str) -> None:
        """The recording ended by itself: records why and tells on_stopped from a thread of its own
        (this runs on PortAudio's threads, where the stream must not be closed)."""
        with self._lock:
            if not self._running:
                return
            self.stop_reason = reason   # before running turns False: a poller sees the reason
            self._running = False
            stream = self._stream
        self._ended.set()
        if reason != MAX_LENGTH:
            log.warning("recording from '%s' ended: %s", self.device_name, reason)
        threading.Thread(target=self._close_and_notify, args=(stream, reason), name="vocable-recorder-stopped",
                         daemon=True).start()

    def _close_and_notify(self, stream, reason: str) -> None:
        self._close_stream(stream)
        self._notify(reason)

    def _notify(self, reason: str) -> None:
        if self.on_stopped is not None:
            try:
                self.on_stopped(reason)
            except Exception:
                log.exception("on_stopped failed")

    def _close_stream(self, stream=None) -> None:
        """Closes `stream` (None: the current one); a newer recording's stream stays open."""
        with self._lock:
            if stream is None or stream is self._stream:
                stream, self._stream = self._stream, None
        if stream is None:
            return
        try:
            stream.abort()
        except Exception as e:  # PortAudioError: the device is gone already
            log.debug("abort: %s", e)
        try:
            stream.close()
        except Exception as e:
            log.debug("close: %s", e)

    def _watch(self) -> None:
        stream = self._stream
        while not self._ended.wait(min(0.25, self.stall_seconds)):
            if stream is not self._stream:
                return
            quiet = time.monotonic() - self._last_block
            if quiet > (self.stall_seconds if self._blocks_seen else max(self.stall_seconds, START_SECONDS)):
                self._end(f"device error: no audio came from '{self.device_name}' for {quiet:.1f} s "
                          "(was it unplugged or taken by another program?)")
                return

    # -- PortAudio's side (its own threads) -------------------------------------------------------

    def _callback(self, indata, frames, _time, status) -> None:
        self._last_block = time.monotonic()
        self._blocks_seen += 1
        if status.input_overflow:
            self.overflows += 1
        block = indata[:, 0].copy() if indata.shape[1] == 1 else indata.mean(axis=1, dtype=np.float32)
        with self._lock:
            if not self._running:
                raise self._sd.CallbackAbort
            block = block[:self._limit - self._frames]
            self._blocks.append(block)
            self._frames += block.size
            full = self._frames >= self._limit
        self.level_db = _db(float(np.max(np.abs(block)))) if block.size else SILENCE_DB
        if self.on_level is not None:
            try:
                self.on_level(self.level_db)
            except Exception:
                log.exception("on_level failed")
        if full:
            self._end(MAX_LENGTH)
            raise self._sd.CallbackStop

    def _finished(self) -> None:
        # The stream ended. After stop() or the maximum length this changes nothing; otherwise
        # PortAudio ended it on its own: the device failed.
        self._end(f"device error: the input stream from '{self.device_name}' ended unexpectedly")


def _hint(message: str) -> str:
    """What to do about a PortAudio error when opening a device."""
    m = message.lower()
    if "unavailable" in m or "busy" in m:
        return " (it may be in use by another program)"
    if "sample rate" in m or "channel" in m:
        return " (it does not take its own default settings; choose another input device)"
    return ""
