"""A stand-in for the sounddevice module: what vocable.audio.playback and vocable.audio.recorder use of it.
Its streams have no audio thread: a test plays that part by calling `FakeStream.run_callback`."""
from __future__ import annotations

import builtins
import sys

import numpy as np


class CallbackFlags:
    """The status PortAudio hands each callback."""

    def __init__(self, input_overflow: bool = False):
        self.input_overflow = input_overflow
        self.output_underflow = False


class FakeStream:
    """An opened stream; active from start() until abort() or until its callback ends it."""

    def __init__(self, samplerate, device, channels, callback, finished_callback, latency=0.0):
        self.samplerate, self.device, self.channels = samplerate, device, channels
        self.callback, self.finished_callback = callback, finished_callback
        self.latency = latency
        self.active = self.closed = False

    def start(self):
        self.active = True

    def abort(self):
        if self.active:
            self._end()

    def close(self):
        self.closed = True

    def run_callback(self, data: np.ndarray, overflow: bool = False) -> None:
        """One callback with `data` [frames, channels], as PortAudio's thread makes it: a
        CallbackStop or CallbackAbort from the callback ends the stream."""
        try:
            self.callback(data, data.shape[0], None, CallbackFlags(input_overflow=overflow))
        except (FakeSoundDevice.CallbackStop, FakeSoundDevice.CallbackAbort):
            self._end()

    def _end(self):
        self.active = False
        self.finished_callback()


class FakeSoundDevice:
    """sounddevice over the `devices` given (query_devices() entries). `accepts(rate, channels)`
    says which settings a device takes; `open_error` fails every stream's opening with that
    message; without `has_default` there is no default device of either kind."""

    class PortAudioError(Exception):
        pass

    class CallbackStop(Exception):
        pass

    class CallbackAbort(Exception):
        pass

    def __init__(self, devices, accepts=lambda rate, channels: True, open_error=None, has_default=True):
        self.devices = devices
        self.accepts, self.open_error, self.has_default = accepts, open_error, has_default
        self.streams: list[FakeStream] = []

    def query_devices(self, kind=None):
        if kind is None:
            return self.devices
        usable = [d for d in self.devices if d.get(f"max_{kind}_channels", 0) > 0]
        if not self.has_default or not usable:
            raise self.PortAudioError("Error querying device -1")
        return usable[0]

    def check_output_settings(self, device, samplerate, channels, dtype):
        self._check(device, samplerate, channels, "max_output_channels")

    def check_input_settings(self, device, samplerate, channels, dtype):
        self._check(device, samplerate, channels, "max_input_channels")

    def OutputStream(self, samplerate, device, channels, dtype, latency, callback, finished_callback):  # noqa: N802
        assert channels == 1 and dtype == "float32"
        # the latency the device reports, whatever was asked for: the player's flush after the
        # last sample is sized by it
        return self._open(FakeStream(samplerate, device, channels, callback, finished_callback, latency=0.05))

    def InputStream(self, samplerate, device, channels, dtype, callback, finished_callback):  # noqa: N802
        assert dtype == "float32"
        return self._open(FakeStream(samplerate, device, channels, callback, finished_callback))

    def _check(self, device, samplerate, channels, most_channels):
        if channels > self.devices[device][most_channels] or not self.accepts(samplerate, channels):
            raise self.PortAudioError("Invalid number of channels" if channels > 1 else "Invalid sample rate")

    def _open(self, stream: FakeStream) -> FakeStream:
        if self.open_error:
            raise self.PortAudioError(self.open_error)
        self.streams.append(stream)
        return stream


def make_sounddevice_unimportable(monkeypatch, error: type[Exception]) -> None:
    """`import sounddevice` raises `error`: ImportError where the package is missing, OSError
    (what sounddevice raises) where the PortAudio library is."""
    real_import = builtins.__import__

    def failing_import(name, *args, **kwargs):
        if name == "sounddevice":
            raise error("PortAudio library not found")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "sounddevice", raising=False)
    monkeypatch.setattr(builtins, "__import__", failing_import)
