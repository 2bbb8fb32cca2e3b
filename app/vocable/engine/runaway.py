"""The runaway watchdog: a segment whose generation does not end where its text does.

The Base model sometimes never emits its end-of-speech code (peers see about 1 in 200
generations): it goes on in silence, loops on a few codes, or babbles, until a frame cap stops
it at about three times the text's length. RunawayWatch follows a segment's frames and audio
as they stream and calls a stop at the first sure sign:

* silence: SILENCE_STOP_SEC of frames quieter than SILENCE_DBFS in a row (a pause between
  sentences is well under a second);
* repetition: the same first-codebook pattern of 1 to MAX_PERIOD frames repeated for
  REPEAT_STOP_SEC (speech changes its semantic code nearly every frame);
* overlong: past OVERLONG_FACTOR times the text's expected length plus OVERLONG_MARGIN_SEC.

The stream ends at the frame that showed the sign (the rest of its chunk is not handed on). A
stop before EARLY_FRACTION of the expected length means the text was probably not all spoken,
so the engine retries that segment once with another seed (synthesis.py, batch.py). The audio
streamed before a stop has been played already and stays in the result.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SILENCE_DBFS = -50.0
SILENCE_STOP_SEC = 2.5
MAX_PERIOD = 4
REPEAT_STOP_SEC = 2.0
OVERLONG_FACTOR = 2.0
OVERLONG_MARGIN_SEC = 2.0
EARLY_FRACTION = 0.5
FRAME_RATE = 12.5

_REASONS = {"silence": f"{SILENCE_STOP_SEC:g} s of silence", "repetition": "the same sounds over and over",
            "overlong": "it ran far past the text's length"}


@dataclass(frozen=True)
class RunawayStop:
    """Where and why the watchdog stopped a segment."""
    reason: str              # "silence", "repetition" or "overlong"
    segment: int             # index of the segment in its stream
    frames: int              # frames of the segment up to and with the one that showed it
    expected_seconds: float  # how long the segment's text takes to speak
    retried: bool = False    # the segment was generated again with another seed

    @property
    def seconds(self) -> float:
        """Audio of the segment up to the stop."""
        return self.frames / FRAME_RATE

    @property
    def early(self) -> bool:
        """Stopped before its text can have been spoken (see EARLY_FRACTION)."""
        return self.seconds < EARLY_FRACTION * self.expected_seconds

    def describe(self) -> str:
        what = f"segment {self.segment + 1} did not end by itself ({_REASONS[self.reason]}); stopped after " \
               f"{self.seconds:.1f} s of its expected {self.expected_seconds:.1f} s"
        return what + ("; generated again with another seed" if self.retried else "")


class RunawayWatch:
    """Watches one segment's stream: feed() every chunk's codes and audio; it returns a
    RunawayStop once the segment has run away (and keeps returning it)."""

    def __init__(self, segment: int, expected_seconds: float, samples_per_frame: int):
        self.segment, self.expected_seconds = segment, expected_seconds
        self.samples_per_frame = samples_per_frame
        self._silence_floor = (10.0 ** (SILENCE_DBFS / 20.0)) ** 2 * samples_per_frame  # energy of a frame
        self._silent_run = 0
        self._code0: list[int] = []
        self._frames = 0
        self._limit_frames = int((OVERLONG_FACTOR * expected_seconds + OVERLONG_MARGIN_SEC) * FRAME_RATE)
        self._silence_frames = round(SILENCE_STOP_SEC * FRAME_RATE)
        self._repeat_frames = round(REPEAT_STOP_SEC * FRAME_RATE)
        self.stop: RunawayStop | None = None

    def feed(self, codes: np.ndarray, pcm: np.ndarray) -> RunawayStop | None:
        if self.stop is not None:
            return self.stop
        n = codes.shape[0]
        if pcm.size < n * self.samples_per_frame:   # a frame without its audio is not a silent one
            raise ValueError(f"a chunk of {n} frames carries {pcm.size} samples, "
                             f"fewer than {n * self.samples_per_frame}")
        frames = pcm[: n * self.samples_per_frame].astype(np.float64).reshape(n, self.samples_per_frame)
        energy = np.einsum("ij,ij->i", frames, frames)
        for i in range(n):
            self._frames += 1
            self._code0.append(int(codes[i, 0]))
            self._silent_run = self._silent_run + 1 if energy[i] < self._silence_floor else 0
            reason = None
            if self._silent_run >= self._silence_frames:
                reason = "silence"
            elif self._repeating():
                reason = "repetition"
            elif self._frames > self._limit_frames:
                reason = "overlong"
            if reason:
                self.stop = RunawayStop(reason, self.segment, self._frames, self.expected_seconds)
                return self.stop
        return None

    def _repeating(self) -> bool:
        """Whether the last _repeat_frames first-codebook codes repeat with a period of at most
        MAX_PERIOD frames."""
        window = self._code0[-self._repeat_frames - MAX_PERIOD:]
        if len(window) < self._repeat_frames + MAX_PERIOD:
            return False
        tail = window[MAX_PERIOD:]
        return any(all(tail[j] == window[MAX_PERIOD + j - p] for j in range(len(tail)))
                   for p in range(1, MAX_PERIOD + 1))


def cut_at_stop(watch: RunawayWatch | None, first_frame: int, codes: np.ndarray,
                pcm: np.ndarray) -> tuple[np.ndarray, np.ndarray, RunawayStop | None]:
    """A streamed chunk (codes from frame `first_frame` of its segment, and their audio) as it
    is handed on: fed to the watch when the watchdog is on, and cut after the frame that showed a
    runaway; with the stop, None while the segment runs on."""
    stop = watch.feed(codes, pcm) if watch is not None else None
    if stop is not None:  # the stream ends with the frame that showed it
        keep = stop.frames - first_frame
        codes, pcm = codes[:keep], pcm[:keep * watch.samples_per_frame]
    return codes, pcm, stop


def summary(stops: tuple[RunawayStop, ...] | list[RunawayStop]) -> str:
    """What the watchdog did in a synthesis, in words ("" when it did nothing)."""
    if not stops:
        return ""
    return "the watchdog stopped a runaway: " + "; ".join(s.describe() for s in stops)
