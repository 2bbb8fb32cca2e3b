"""A long text as segments: each one request to the native engine, spoken one after the other in
one stream, with its own seed, joined to the next without a click, under the caps that stop a
generation that does not end.

Used by the stream (synthesis.py) and by the batched generation of a file's segments
(batch.py), which must give the same stream bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import _engine
from ..errors import SynthesisCancelled, VocableError

FRAME_RATE = 12.5  # codec frames per second of audio
# The model can run on without emitting EOS. Besides each request's own cap (the engine's
# qt_default_max_frames: 3 s plus 1 s per text token, which zero-width characters or rare
# scripts inflate), a whole stream stops after STREAM_CAP_BASE_SEC plus STREAM_CAP_FACTOR times
# the longest its text takes to speak (sentences.longest_speech_seconds), as qt_default_max_frames
# allows about three times speech at a normal rate.
STREAM_CAP_BASE_SEC = 3.0
STREAM_CAP_FACTOR = 3.0
# Length of the raised-cosine fade out and in where two text segments of a long text meet: each
# segment is a fresh request whose decoder starts from its own state, so the waveform would jump
# there. 5 ms (120 samples at 24 kHz) is far below a syllable, and enough to remove the click.
SEGMENT_FADE_SEC = 0.005
# A segment the watchdog retries samples again with segment_seed(its seed, RETRY_SEED_INDEX):
# another seed, the same for the same stream seed (reproducible).
RETRY_SEED_INDEX = 1 << 20
# Segments of a long text generated side by side when it goes to a file (Engine.synthesize's
# `batch`): each step then costs less per segment (README, Speed, long texts), and the talker's
# cache of each (about 0.23 MB per frame at the 0.6B size) is held at once.
FILE_BATCH = 4


@dataclass
class Segment:
    """One request of a stream: a segment's text, its prompt ids, its seed and the index of the
    text's chapter (chapters.split_chapters) it belongs to."""
    text: str
    ids: np.ndarray      # int32 prompt ids
    seed: int
    chapter: int = 0


def stream_frame_cap(text: str) -> int:
    """The most frames a stream speaking `text` generates by default, all segments together."""
    from .sentences import longest_speech_seconds
    return int(FRAME_RATE * (STREAM_CAP_BASE_SEC + STREAM_CAP_FACTOR * longest_speech_seconds(text)))


def segment_seed(seed: int, index: int) -> int:
    """The seed of segment `index` of a stream: the stream's own for the first, then a
    SplitMix64 mix of (seed, index), so every segment samples differently but reproducibly."""
    if index == 0:
        return seed
    z = (seed + index * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


def raised_cosine(n: int) -> np.ndarray:
    """n gains rising from near 0 to near 1 (half a cosine period, endpoints excluded)."""
    return (0.5 - 0.5 * np.cos(np.pi * (np.arange(n) + 0.5) / n)).astype(np.float32)


class SegmentJoiner:
    """Joins the streamed audio of consecutive segments without a click: each segment after the
    first fades in over `fade` samples, each before the last fades out over its last `fade`
    samples. A segment's end is known only when its request returns, so while it streams its
    last `fade` samples are held back (a 5 ms delay) and released with the next chunk, or faded
    at the end. Lengths are kept: the joined audio has exactly the samples of the segments."""

    def __init__(self, n_segments: int, fade: int):
        self._n, self._fade = n_segments, fade
        self._index = -1
        self._held = np.zeros(0, dtype=np.float32)
        self._position = 0  # samples fed of the current segment

    def begin(self, index: int) -> None:
        self._index, self._position = index, 0
        self._held = np.zeros(0, dtype=np.float32)

    def feed(self, pcm: np.ndarray) -> np.ndarray:
        """The audio to hand over now for this chunk of the current segment."""
        pcm = np.asarray(pcm, dtype=np.float32)
        if self._index > 0 and self._position < self._fade:
            pcm = pcm.copy()
            n = min(self._fade - self._position, pcm.size)
            pcm[:n] *= raised_cosine(self._fade)[self._position:self._position + n]
        self._position += pcm.size
        if self._index == self._n - 1:
            return pcm
        joined = np.concatenate([self._held, pcm])
        keep = min(self._fade, joined.size)
        self._held = joined[joined.size - keep:].copy()
        return joined[:joined.size - keep]

    def end(self) -> np.ndarray:
        """The rest of the current segment once it has ended: its tail, faded out."""
        tail, self._held = self._held, np.zeros(0, dtype=np.float32)
        return tail * raised_cosine(self._fade)[::-1][self._fade - tail.size:] if tail.size else tail


def raise_request_error(error: _engine.EngineError, stopped_by_watchdog: bool) -> None:
    """Raises what a failed request means for the caller, unless the request ended because the
    runaway watchdog stopped it (its callback returned False, which the engine reports as a
    cancel): then the request ended normally, and the caller keeps what it streamed."""
    if error.args[1] != _engine.STATUS_CANCELLED:
        raise VocableError(f"cannot synthesize: {error.args[0]}") from None
    if not stopped_by_watchdog:
        raise SynthesisCancelled("synthesis cancelled") from None
