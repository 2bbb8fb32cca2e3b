"""Speech faster or slower at the same pitch, as it streams: WSOLA (waveform-similarity
overlap-add, Verhelst & Roelands 1993).

Each output hop takes a Hann-windowed frame of the input from near where the new tempo puts it,
shifted by up to a quarter frame to the position that best continues the previous frame's
waveform, so pitch periods line up and nothing is resampled. Speech needs nothing more, and it
runs chunk by chunk: the output of a stream fed in any pieces is the same as of the whole.

    stretch = TempoStretch(1.5, 24000)
    for chunk in chunks:
        out.write(stretch.feed(chunk))
    out.write(stretch.finish())
"""
from __future__ import annotations

import math

import numpy as np

MIN_SPEED, MAX_SPEED = 0.25, 4.0     # OpenAI's speech API range
FRAME_SECONDS = 0.04                 # a few pitch periods of the lowest voices


class TempoStretch:
    """Plays mono float32 audio `speed` times as fast (2.0: half as long) at its own pitch."""

    def __init__(self, speed: float, sample_rate: int):
        if not (isinstance(speed, (int, float)) and MIN_SPEED <= speed <= MAX_SPEED):
            raise ValueError(f"speed must be from {MIN_SPEED} to {MAX_SPEED}, got {speed!r}")
        self.speed = float(speed)
        self._frame = 2 * max(8, int(round(FRAME_SECONDS * sample_rate / 2)))
        self._hop = self._frame // 2                       # output hop: Hann at 50 % sums to 1
        self._tolerance = self._frame // 4                 # how far a frame may move to fit
        self._window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(self._frame) / self._frame)).astype(np.float32)
        self._input = np.zeros(0, dtype=np.float32)
        self._input_start = 0             # absolute index of self._input[0]
        self._received = 0                # input samples fed
        self._emitted = 0                 # output samples handed back
        self._overlap = np.zeros(self._frame, dtype=np.float32)   # output from frame k's hop on
        self._k = 0                       # next frame
        self._previous: int | None = None  # where the last frame was taken from

    def feed(self, samples: np.ndarray) -> np.ndarray:
        """The output that is final once `samples` are added (possibly none yet)."""
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        if self.speed == 1.0:
            self._received += samples.size
            self._emitted += samples.size
            return samples
        self._input = np.concatenate([self._input, samples])
        self._received += samples.size
        return self._run(finishing=False)

    def finish(self) -> np.ndarray:
        """The rest of the output: the stream's whole output is len(input) / speed samples."""
        if self.speed == 1.0:
            return np.zeros(0, dtype=np.float32)
        return self._run(finishing=True)

    def _nominal(self, k: int) -> int:
        return int(round(k * self._hop * self.speed))

    def _needed_end(self, k: int) -> int:
        """The input a frame needs: its candidates and the previous frame's natural continuation."""
        end = self._nominal(k) + self._tolerance + self._frame
        if self._previous is not None:
            end = max(end, self._previous + self._hop + self._frame)
        return end

    def _slice(self, start: int, length: int) -> np.ndarray:
        """input[start:start + length] in absolute positions, zeros past what was fed."""
        lo = start - self._input_start
        piece = self._input[max(lo, 0):lo + length]
        if piece.size < length:
            piece = np.concatenate([np.zeros(max(0, -lo), np.float32)[:length], piece])
            piece = np.concatenate([piece, np.zeros(length - piece.size, np.float32)])
        return piece

    def _run(self, finishing: bool) -> np.ndarray:
        out: list[np.ndarray] = []
        while True:
            k = self._k
            nominal = self._nominal(k)
            if finishing:
                if nominal >= self._received + self._hop:
                    break
            elif self._needed_end(k) > self._received or (k + 1) * self._hop * self.speed > self._received:
                break  # (the second: this hop's output would stand for input not fed yet)
            position = nominal
            if self._previous is not None:
                natural = self._slice(self._previous + self._hop, self._frame)
                low = max(0, nominal - self._tolerance)
                candidates = self._slice(low, nominal + self._tolerance - low + self._frame)
                score = np.correlate(candidates, natural, mode="valid")
                position = low + int(np.argmax(score)) if np.any(score) else nominal
            self._overlap += self._window * self._slice(position, self._frame)
            out.append(self._overlap[:self._hop].copy())
            self._overlap = np.concatenate([self._overlap[self._hop:], np.zeros(self._hop, np.float32)])
            self._previous = position
            self._k = k + 1
            keep_from = min(self._nominal(self._k) - self._tolerance, self._previous + self._hop)
            drop = keep_from - self._input_start
            if drop > 0:
                self._input = self._input[drop:]
                self._input_start += drop
        if finishing:
            out.append(self._overlap[:self._hop].copy())
        audio = np.concatenate(out) if out else np.zeros(0, dtype=np.float32)
        if finishing:
            expected = int(math.ceil(self._received / self.speed))
            audio = audio[:max(0, expected - self._emitted)]
        self._emitted += audio.size
        return audio
