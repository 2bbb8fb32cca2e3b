"""Streaming playback: audio chunks played as they arrive, through PortAudio (sounddevice).

No Qt and no engine here; the CLI and the GUI feed it from a synthesis stream:

    with StreamPlayer(24000) as player:      # AudioDeviceError: no PortAudio, no output device
        for chunk in synthesis:
            player.write(chunk)
        player.finish()
        player.wait()
    player.underruns                         # times playback ran dry and waited for audio

The player is a jitter buffer: output starts once `preroll_sec` of audio is buffered (or the
writer calls finish()), so the small uneven chunks of a stream play without gaps.

A stream produced slower than real time (a slow machine, or one busy with other work) cannot
play from a short pre-roll without pausing. So the player measures the live real-time factor
from the arrival of the chunks (wall time per second of audio, from the first chunk on) and,
given the stream's expected length (`expected_seconds`, e.g. sentences.expected_speech_seconds),
waits for just enough audio that the rest arrives before it is due: with R seconds still to
come at a real-time factor f > 1, playing them takes R s and producing them R f s, so it needs
R (f - 1) s buffered (times a safety margin), plus one chunk c, because audio arrives in chunks
and the last one is only there once all of it is made (a chunk starting at q is due at q and
arrives at (q + c - B) f: B >= R (f - 1) + c). c is the engine's largest chunk
(`max_chunk_seconds`; without it, twice the largest seen so far, as chunks double), at most R.
Counted from the latest chunk's arrival, this is a time: the player starts as soon as it has
passed, between chunks too, so it waits no longer than the plan needs. `waiting` says how long
it still waits and why.

When the buffer still runs dry before finish() (the machine got slower, or the estimate was
short) it plays silence, counts and logs an underrun, and buffers again, with a pre-roll at
least twice as long as before (up to `max_preroll_sec`) and the plan's. A stream that runs past
its expected length is then expected to run half as long again (OVERRUN_GUESS), so that the
plan keeps holding enough back: a few longer waits rather than a gap every pre-roll. A device
that does not take the stream's sample rate gets the audio resampled (soxr) to its own rate.
"""
from __future__ import annotations

import collections
import logging
import threading
import time

import numpy as np

from . import devices as audio_devices
from ..errors import AudioDeviceError

DEFAULT_PREROLL_SEC = 0.25
MAX_PREROLL_SEC = 2.0
# The plan's buffer is R (f - 1) times this: the real-time factor measured from the first chunks
# varies by some 10 % from chunk to chunk, and the expected length of a text is a rough estimate.
PLAN_MARGIN = 1.25
# A stream that has run past its expected length is taken to have this fraction of what it
# wrote still to come (_plan_wait).
OVERRUN_GUESS = 0.5

log = logging.getLogger(__name__)
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
                 preroll_sec: float = DEFAULT_PREROLL_SEC, max_preroll_sec: float = MAX_PREROLL_SEC,
                 expected_seconds: float | None = None, max_chunk_seconds: float | None = None):
        if sample_rate <= 0 or preroll_sec < 0 or max_preroll_sec < preroll_sec:
            raise ValueError("need sample_rate > 0 and 0 <= preroll_sec <= max_preroll_sec")
        if expected_seconds is not None and expected_seconds < 0:
            raise ValueError("expected_seconds cannot be negative")
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
        self.expected_seconds = expected_seconds
        self.max_chunk_seconds = max_chunk_seconds
        self._written_s = 0.0       # seconds of audio written (at the stream's rate)
        self._first_write = None    # time.monotonic() of the first chunk
        self._last_write = 0.0      # and of the latest
        self._plan_held = False     # the plan held back the first sound past the pre-roll
        self._after_first_s = 0.0   # seconds of audio written after the first chunk
        self._largest_chunk_s = 0.0
        self.real_time_factor: float | None = None   # live: wall time per second of audio arriving
        self.waited_seconds: float | None = None     # from the first chunk to the first sound
        self.wait_reason = ""                        # why it waited longer than the pre-roll
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
            self._note_arrival(x.size / self.sample_rate)
            if self._resampler is not None:
                x = self._resampler.resample_chunk(x)
            if x.size:
                self._chunks.append(x)
                self._buffered += x.size

    def _note_arrival(self, seconds: float) -> None:
        now = time.monotonic()
        if self._first_write is None:
            self._first_write = now
        else:
            self._after_first_s += seconds
            if self._after_first_s > 0:
                self.real_time_factor = (now - self._first_write) / self._after_first_s
        self._written_s += seconds
        if self.expected_seconds is not None and self._written_s > self.expected_seconds:
            # Longer than expected, and no end known until finish(): expect half as much again,
            # so that the rest plays after one longer wait rather than with a gap every few
            # seconds, a pre-roll's worth each (finish() ends any wait at once).
            self.expected_seconds = self._written_s * (1.0 + OVERRUN_GUESS)
        self._last_write = now
        self._largest_chunk_s = max(self._largest_chunk_s, seconds)

    def _plan_wait(self, now: float) -> float:
        """Seconds still to wait before playing so that the rest arrives in time (see the module
        doc): R (f - 1) margin + c - B after the latest chunk; 0 when the stream keeps up."""
        f, expected = self.real_time_factor, self.expected_seconds
        if f is None or f <= 1.0 or expected is None:
            return 0.0
        remaining = max(expected - self._written_s, 0.0)
        chunk = min(self.max_chunk_seconds or 2.0 * self._largest_chunk_s, remaining)
        needed = remaining * (f - 1.0) * PLAN_MARGIN + chunk
        return max(0.0, self._last_write + needed - self._buffered / self.device_rate - now)

    @property
    def waiting(self) -> str | None:
        """While the plan holds back the first sound, how long and why ("first sound in 2.1 s, so
        that the rest arrives in time: synthesis runs at 1.31x real time"), else None."""
        with self._lock:
            if not self._buffering or self._finishing or self._stopped or self.waited_seconds is not None:
                return None
            wait = self._plan_wait(time.monotonic())
            if wait <= 0:
                return None
            return (f"first sound in {wait:.1f} s, so that the rest arrives in time: synthesis runs at "
                    f"{self.real_time_factor:.2f}x real time")

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
                now = time.monotonic()
                held = self._buffered >= self._preroll and self._plan_wait(now) > 0
                self._plan_held = self._plan_held or held
                if self._finishing or (self._buffered >= self._preroll and not held):
                    self._buffering = False
                    if self.waited_seconds is None and self._first_write is not None:
                        self.waited_seconds = now - self._first_write
                        if self._plan_held:
                            self.wait_reason = (f"synthesis ran at {self.real_time_factor:.2f}x real time, so it "
                                                f"waited for {self._buffered / self.device_rate:.1f} s of audio")
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
                log.warning("playback ran dry after %.2f s (underrun %d; arriving at %s x real time); "
                            "buffering again", self._played / self.device_rate, self.underruns,
                            "?" if self.real_time_factor is None else f"{self.real_time_factor:.2f}")
