"""Streaming playback: audio chunks played as they arrive, through PortAudio (sounddevice).

No Qt and no engine here; the CLI and the GUI feed it from a synthesis stream:

    with StreamPlayer(24000) as player:      # AudioDeviceError: no PortAudio, no output device
        for chunk in synthesis:
            player.write(chunk)
        player.finish()
        player.wait()
    player.underruns                         # times playback ran dry and waited for audio

The player is a jitter buffer: output starts once `preroll_sec` of audio is buffered (or the
writer calls finish()), so the small uneven chunks of a stream play without gaps. When the
buffer runs dry before finish() it plays silence, counts an underrun, and buffers again, with a
pre-roll twice as long as before (up to `max_preroll_sec`), so a stream that is produced slower
than real time settles into longer, rarer pauses instead of stuttering. A device that does not
take the stream's sample rate gets the audio resampled (soxr) to its own rate.
"""
from __future__ import annotations

import collections
import threading

import numpy as np

from . import audio_devices
from .errors import AudioDeviceError

DEFAULT_PREROLL_SEC = 0.25
MAX_PREROLL_SEC = 2.0
# After the last sample, the stream plays silence for its output latency and this much more
# before it stops: PortAudio ends a stream without waiting for the device's buffer to play out
# (through ALSA and PulseAudio the last 30 ms, one device latency, were lost: the test that
# records the null sink's monitor found the end of every stream missing).
FLUSH_SEC = 0.1


def _sounddevice(action: str = "play audio"):
    """The sounddevice module, or AudioDeviceError saying what is missing."""
    return audio_devices.sounddevice_module(action)


def output_devices() -> list[str]:
    """Names of the audio output devices PortAudio sees (AudioDeviceError without PortAudio)."""
    return audio_devices.device_names(_sounddevice(), "output")


class StreamPlayer:
    """Plays mono float32 chunks as they are written (see the module doc). Thread-safe: one
    thread may write while another stops."""

    def __init__(self, sample_rate: int, device: int | str | None = None,
                 preroll_sec: float = DEFAULT_PREROLL_SEC, max_preroll_sec: float = MAX_PREROLL_SEC):
        if sample_rate <= 0 or preroll_sec < 0 or max_preroll_sec < preroll_sec:
            raise ValueError("need sample_rate > 0 and 0 <= preroll_sec <= max_preroll_sec")
        sd = _sounddevice()
        self._sd = sd
        info = audio_devices.find_device(sd, device, "output")
        self.device_name: str = info["name"]
        self.sample_rate = int(sample_rate)
        rate = self.sample_rate
        try:
            sd.check_output_settings(device=info["index"], samplerate=rate, channels=1, dtype="float32")
        except sd.PortAudioError:
            rate = int(info["default_samplerate"])
        self.device_rate = rate
        self._resampler = None
        if rate != self.sample_rate:
            import soxr
            self._resampler = soxr.ResampleStream(self.sample_rate, rate, 1, dtype="float32", quality="HQ")

        self._lock = threading.Lock()
        self._chunks: collections.deque[np.ndarray] = collections.deque()
        self._offset = 0            # samples of _chunks[0] already played
        self._buffered = 0          # samples in _chunks not yet played
        self._preroll = int(round(preroll_sec * rate))
        self._max_preroll = int(round(max_preroll_sec * rate))
        self._buffering = True      # waiting for the pre-roll before playing
        self._finishing = False     # finish() called: play out what is left, then stop
        self._flush = 0             # silence still to play after the last sample, once finishing
        self._stopped = False
        self._done = threading.Event()
        self._played = 0            # device-rate samples played from the buffer
        self.underruns = 0          # the buffer ran dry before finish()
        self.device_underflows = 0  # PortAudio reported an output underflow (callback too late)
        try:
            self._stream = sd.OutputStream(samplerate=rate, device=info["index"], channels=1, dtype="float32",
                                           latency="high", callback=self._callback,
                                           finished_callback=self._done.set)
            self._stream.start()
        except sd.PortAudioError as e:
            raise AudioDeviceError(f"cannot play audio on '{self.device_name}': {e}") from e

    # -- the writer's side ----------------------------------------------------------------------

    def write(self, chunk: np.ndarray) -> None:
        """Queues mono samples at `sample_rate` (ignored once stopped)."""
        x = np.ascontiguousarray(chunk, dtype=np.float32)
        if x.ndim != 1:
            raise ValueError(f"expected mono samples [n], got shape {list(x.shape)}")
        with self._lock:
            if self._stopped:
                return
            if self._finishing:
                raise RuntimeError("write() after finish()")
            if self._resampler is not None:
                x = self._resampler.resample_chunk(x)
            if x.size:
                self._chunks.append(x)
                self._buffered += x.size

    def finish(self) -> None:
        """No more audio will come: what is buffered plays out, then the stream ends."""
        with self._lock:
            if self._finishing or self._stopped:
                return
            if self._resampler is not None:
                tail = self._resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
                if tail.size:
                    self._chunks.append(tail)
                    self._buffered += tail.size
            latency = getattr(self._stream, "latency", 0.0)
            latency = float(latency) if isinstance(latency, (int, float)) else 0.0
            self._flush = int(round((latency + FLUSH_SEC) * self.device_rate))
            self._finishing = True

    def wait(self, timeout: float | None = None) -> bool:
        """Waits until everything written has played (after finish()) or the player stopped;
        True when it has. Closes the device then."""
        if not self._done.wait(timeout):
            return False
        self._close_stream()
        return True

    def stop(self) -> None:
        """Stops at once, dropping what is buffered. Idempotent."""
        with self._lock:
            self._stopped = True
            self._chunks.clear()
            self._buffered = 0
        try:
            self._stream.abort()
        except self._sd.PortAudioError:
            pass
        self._done.set()
        self._close_stream()

    close = stop

    def __enter__(self) -> "StreamPlayer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def buffered_seconds(self) -> float:
        return self._buffered / self.device_rate

    @property
    def played_seconds(self) -> float:
        """Audio taken from the buffer so far (it reaches the speaker one device latency later)."""
        return self._played / self.device_rate

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def _close_stream(self) -> None:
        try:
            self._stream.close()
        except self._sd.PortAudioError:
            pass

    # -- PortAudio's side (its own thread) --------------------------------------------------------

    def _callback(self, outdata, frames, _time, status) -> None:
        if status.output_underflow:
            self.device_underflows += 1
        out = outdata[:, 0]
        with self._lock:
            if self._stopped:
                out.fill(0)
                raise self._sd.CallbackAbort
            if self._buffering:
                if self._buffered >= self._preroll or self._finishing:
                    self._buffering = False
                else:
                    out.fill(0)
                    return
            n = 0
            while n < frames and self._chunks:
                head = self._chunks[0]
                take = min(frames - n, head.size - self._offset)
                out[n:n + take] = head[self._offset:self._offset + take]
                n += take
                self._offset += take
                if self._offset == head.size:
                    self._chunks.popleft()
                    self._offset = 0
            self._buffered -= n
            self._played += n
            if n < frames:
                out[n:] = 0
                if self._finishing:
                    self._flush -= frames - n
                    if self._flush <= 0:
                        raise self._sd.CallbackStop  # what is in outdata still plays
                    return
                self.underruns += 1
                self._buffering = True
                self._preroll = min(max(2 * self._preroll, 1), self._max_preroll)
