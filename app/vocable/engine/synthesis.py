"""The engine wrapper: loads a converted model, turns reference audio into voices and text into
speech, streamed.

No Qt here; the GUI drives this from a worker thread. The native calls release the GIL.

    with Engine("model.gguf") as engine:
        with engine.synthesize("Hello there.", voice, seed=7) as stream:   # returns at once
            for chunk in stream:            # float32 audio as it is produced (first: one frame)
                player.write(chunk)
            result = stream.result()        # SynthesisResult: whole audio, codes, mode, timings
"""
from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import secrets
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from .. import _engine
from ..audio.files import FILE_FORMATS, _file_format, prepare_reference, write_audio  # noqa: F401 (re-exported)
from ..errors import ModelError, SynthesisCancelled, VocableError
from .runaway import RunawayStop, RunawayWatch
from ..library.voice import Voice

LANGUAGES_KEY = "qwen3-tts.talker.language_names"
X_VECTOR = "x-vector"
IN_CONTEXT = "in-context"

FRAME_RATE = 12.5  # codec frames per second of audio
# The model can run on without emitting EOS. Besides each request's own cap (the engine's
# qt_default_max_frames: 3 s plus 1 s per text token, which zero-width characters or rare
# scripts inflate), a whole stream stops after STREAM_CAP_BASE_SEC plus STREAM_CAP_FACTOR times
# the longest its text takes to speak (text.longest_speech_seconds), as qt_default_max_frames
# allows about three times speech at a normal rate.
STREAM_CAP_BASE_SEC = 3.0
STREAM_CAP_FACTOR = 3.0
# Length of the raised-cosine fade out and in where two text segments of a long text meet: each
# segment is a fresh request whose decoder starts from its own state, so the waveform would jump
# there. 5 ms (120 samples at 24 kHz) is far below a syllable, and enough to remove the click.
SEGMENT_FADE_SEC = 0.005
# A segment the watchdog retries samples again with _segment_seed(its seed, RETRY_SEED_INDEX):
# another seed, the same for the same stream seed (reproducible).
RETRY_SEED_INDEX = 1 << 20
# Segments of a long text generated side by side when it goes to a file (Engine.synthesize's
# `batch`): each step then costs less per segment (README, Speed, long texts), and the talker's
# cache of each (about 0.23 MB per frame at the 0.6B size) is held at once.
FILE_BATCH = 4


@dataclass
class SynthesisResult:
    """A finished synthesis: the audio, the codec codes it was decoded from, and how it ran.

    Timings are measured in Python from the synthesize() call: time to first audio (the first
    chunk handed over), wall time (the last), and their real-time factor (wall / audio seconds;
    below 1 is faster than real time). A long text is spoken as several segments (see
    text.split_for_synthesis); `codes` are theirs back to back, and `audio` has a short fade where
    two segments meet, so it is not exactly Engine.decode(codes) then."""
    codes: np.ndarray     # int32 [frames, 16], 12.5 frames per second of audio
    mode: str             # X_VECTOR or IN_CONTEXT
    mode_reason: str      # why that mode ran, in words
    reached_eos: bool     # False: a frame cap stopped generation (of some segment, or the stream)
    seed: int             # the seed used (pass it back to reproduce the run)
    audio: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))  # float32 [samples], mono
    sample_rate: int = 24000
    segments: tuple[str, ...] = ()      # the texts of the requests, in order
    time_to_first_audio: float = 0.0    # seconds
    wall_time: float = 0.0              # seconds
    runaway: tuple[RunawayStop, ...] = ()   # segments the watchdog stopped (runaway.py), in order

    @property
    def seconds(self) -> float:
        """Length of the audio (of the codes when there is no audio)."""
        return self.audio.size / self.sample_rate if self.audio.size else self.codes.shape[0] / FRAME_RATE

    @property
    def real_time_factor(self) -> float:
        return self.wall_time / self.seconds if self.seconds else float("inf")


@dataclass(frozen=True)
class AudioChunk:
    """A piece of a synthesis stream: its audio and the codes it was decoded from."""
    audio: np.ndarray   # float32 [n]
    first_sample: int   # index of audio[0] in the whole stream's audio
    codes: np.ndarray   # int32 [frames, 16] (none for the faded tail of a segment)
    first_frame: int    # index of codes[0] in the whole stream's codes
    segment: int        # index of the text segment it belongs to


@dataclass(frozen=True)
class Progress:
    """Where a synthesis stands (Synthesis.progress): for a live display."""
    frames: int                          # codec frames generated so far
    audio_seconds: float                 # audio handed over so far
    elapsed: float                       # seconds since synthesize() was called
    time_to_first_audio: float | None    # None until the first chunk
    segment: int                         # index of the segment being spoken
    segments: int                        # how many segments the text has
    done: bool

    @property
    def real_time_factor(self) -> float | None:
        """Elapsed time per second of audio so far (None before any audio)."""
        return self.elapsed / self.audio_seconds if self.audio_seconds > 0 else None

    def describe(self) -> str:
        """One line for a live display: "2.4 s of audio, first audio after 0.31 s, real-time factor 0.82"."""
        parts = [f"{self.audio_seconds:.1f} s of audio",
                 "first audio after " + (f"{self.time_to_first_audio:.2f} s" if self.time_to_first_audio is not None
                                         else "...")]
        if self.real_time_factor is not None:
            parts.append(f"real-time factor {self.real_time_factor:.2f}")
        if self.segments > 1:
            parts.append(f"segment {self.segment + 1} of {self.segments}")
        return ", ".join(parts)


@dataclass
class _Segment:
    text: str
    ids: np.ndarray      # int32 prompt ids
    seed: int


def stream_frame_cap(text: str) -> int:
    """The most frames a stream speaking `text` generates by default, all segments together."""
    from .text import longest_speech_seconds
    return int(FRAME_RATE * (STREAM_CAP_BASE_SEC + STREAM_CAP_FACTOR * longest_speech_seconds(text)))


def _segment_seed(seed: int, index: int) -> int:
    """The seed of segment `index` of a stream: the stream's own for the first, then a
    SplitMix64 mix of (seed, index), so every segment samples differently but reproducibly."""
    if index == 0:
        return seed
    z = (seed + index * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


def _raised_cosine(n: int) -> np.ndarray:
    """n gains rising from near 0 to near 1 (half a cosine period, endpoints excluded)."""
    return (0.5 - 0.5 * np.cos(np.pi * (np.arange(n) + 0.5) / n)).astype(np.float32)


class _SegmentJoiner:
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
            pcm[:n] *= _raised_cosine(self._fade)[self._position:self._position + n]
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
        return tail * _raised_cosine(self._fade)[::-1][self._fade - tail.size:] if tail.size else tail


_live: "weakref.WeakSet[Synthesis]" = weakref.WeakSet()


@atexit.register
def _stop_live_syntheses() -> None:
    """At interpreter exit, cancel streams still running (their threads are daemons) and let them
    leave the engine before it is torn down."""
    for s in list(_live):
        s.close(timeout=5.0)


class Synthesis:
    """A synthesis running on a background thread (Engine.synthesize returns one at once).

    Iterate it for the audio as it is produced (float32 chunks; chunks() gives AudioChunk with
    codes and positions); result() waits for the end and returns the SynthesisResult. Engine
    errors are raised in the consumer, from the iteration and from result(); cancel() stops it
    within a frame (SynthesisCancelled). Use it as a context manager, or call close(): leaving
    it cancels a synthesis that is still running and waits for its thread. Several consumers may
    iterate it; each sees every chunk from the start."""

    def __init__(self, engine: "Engine", segments: list[_Segment], voice: Voice, language: str,
                 ref_codes: np.ndarray | None, ref_ids: np.ndarray | None, mode: str, reason: str, seed: int,
                 talker: dict, predictor: dict, max_frames: int | None, stream_cap: int, started: float,
                 watchdog: bool, batch: int = 1):
        self._engine = engine
        self._segments = segments
        self._voice = voice
        self._language = language
        self._ref_codes, self._ref_ids = ref_codes, ref_ids
        self.mode, self.mode_reason, self.seed = mode, reason, seed
        self._sampling = (talker, predictor)
        self._max_frames = max_frames
        self._stream_cap = stream_cap
        self._watchdog = watchdog
        self._batch = batch
        self._started = started
        self.sample_rate = engine.sample_rate
        self._fade = max(1, int(round(SEGMENT_FADE_SEC * self.sample_rate)))

        self._cond = threading.Condition()
        self._chunks: list[AudioChunk] = []
        self._samples = 0                     # audio handed over
        self._frames = 0                      # frames generated (all segments)
        self._segment = 0
        self._first_audio: float | None = None
        self._finished: float | None = None
        self._error: BaseException | None = None
        self._result: SynthesisResult | None = None
        self._cancel_flag = _engine.CancelFlag()
        self._thread = threading.Thread(target=self._run, name="vocable-synthesis", daemon=True)
        _live.add(self)
        self._thread.start()

    # -- the consumer's side --------------------------------------------------------------------

    def chunks(self, timeout: float | None = None) -> Iterator[AudioChunk]:
        """The stream's chunks from the first, each as soon as it is produced; raises the
        synthesis' error (SynthesisCancelled, VocableError) after the chunks made before it.
        `timeout`: longest wait for one chunk (TimeoutError)."""
        index = 0
        while True:
            with self._cond:
                if not self._cond.wait_for(lambda: index < len(self._chunks) or self._finished is not None,
                                           timeout):
                    raise TimeoutError(f"no audio for {timeout} s")
                if index < len(self._chunks):
                    chunk = self._chunks[index]
                elif self._error is not None:
                    raise self._error
                else:
                    return
            index += 1
            yield chunk

    def __iter__(self) -> Iterator[np.ndarray]:
        for chunk in self.chunks():
            yield chunk.audio

    def result(self, timeout: float | None = None) -> SynthesisResult:
        """Waits for the end; the whole result, or the synthesis' error raised here."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._finished is not None, timeout):
                raise TimeoutError(f"the synthesis did not finish within {timeout} s")
            if self._error is not None:
                raise self._error
            return self._result

    def wait(self, timeout: float | None = None) -> bool:
        """True once the synthesis has ended (finished, failed or cancelled)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._finished is not None, timeout)

    @property
    def done(self) -> bool:
        return self._finished is not None

    @property
    def progress(self) -> Progress:
        with self._cond:
            end = self._finished if self._finished is not None else time.perf_counter()
            return Progress(self._frames, self._samples / self.sample_rate, end - self._started,
                            None if self._first_audio is None else self._first_audio - self._started,
                            self._segment, len(self._segments), self._finished is not None)

    @property
    def segments(self) -> tuple[str, ...]:
        return tuple(s.text for s in self._segments)

    def cancel(self) -> None:
        """Asks the synthesis to stop (it ends within one frame with SynthesisCancelled)."""
        self._cancel_flag.set()

    def close(self, timeout: float | None = None) -> None:
        """Cancels the synthesis if it is still running and waits for its thread to end."""
        if self._finished is None:
            self.cancel()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def __enter__(self) -> "Synthesis":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the engine thread ----------------------------------------------------------------------

    def _emit(self, audio: np.ndarray, codes: np.ndarray, first_frame: int, segment: int) -> None:
        if audio.size == 0 and codes.shape[0] == 0:
            return
        with self._cond:
            if self._first_audio is None and audio.size:
                self._first_audio = time.perf_counter()
            self._chunks.append(AudioChunk(audio, self._samples, codes, first_frame, segment))
            self._samples += audio.size
            self._cond.notify_all()

    def _speak(self, seg: "_Segment", index: int, seed: int, cap: int, frames_before: int,
               joiner: _SegmentJoiner) -> tuple[np.ndarray, bool, RunawayStop | None]:
        """One request for segment `index`, streamed: its codes, whether it reached EOS, and the
        watchdog's stop when it ran away (the codes and audio up to the stop are kept)."""
        from .text import expected_speech_seconds

        engine = self._engine
        watch = RunawayWatch(index, expected_speech_seconds(seg.text),
                             engine.info["samples_per_frame"]) if self._watchdog else None
        streamed: list[np.ndarray] = []
        joiner.begin(index)

        def on_chunk(first_frame: int, codes: np.ndarray, pcm: np.ndarray) -> bool:
            stop = watch.feed(codes, pcm) if watch is not None else None
            if stop is not None:  # the stream ends with the frame that showed it
                keep = stop.frames - first_frame
                codes, pcm = codes[:keep], pcm[:keep * engine.info["samples_per_frame"]]
            with self._cond:
                self._frames = frames_before + first_frame + codes.shape[0]
            self._emit(joiner.feed(pcm), codes, frames_before + first_frame, index)
            streamed.append(codes)
            return stop is None and not self._cancel_flag.is_set()

        try:
            codes, _pcm, eos = engine._ctx.synthesize(
                seg.ids, self._voice.speaker_embedding, self._ref_codes, self._ref_ids, self._language,
                *self._sampling, seed, int(cap), on_chunk, self._cancel_flag)
        except _engine.EngineError as e:
            if e.args[1] != _engine.STATUS_CANCELLED:
                raise VocableError(f"cannot synthesize: {e.args[0]}") from None
            if watch is None or watch.stop is None or self._cancel_flag.is_set():
                raise SynthesisCancelled("synthesis cancelled") from None
            codes, eos = np.concatenate(streamed), False
        self._emit(joiner.end(), codes[:0], frames_before + codes.shape[0], index)
        return codes, bool(eos), watch.stop if watch is not None else None

    def _cap(self, seg: "_Segment", frames_before: int) -> int:
        """The frame cap of a segment spoken after `frames_before` frames of the stream."""
        return self._max_frames or min(_engine.default_max_frames(seg.ids.size), self._stream_cap - frames_before)

    def _generate_one_by_one(self, joiner: _SegmentJoiner) -> tuple[list[np.ndarray], bool, list[RunawayStop]]:
        codes_all: list[np.ndarray] = []
        eos_all = True
        stops: list[RunawayStop] = []
        frames_before = 0
        for i, seg in enumerate(self._segments):
            seed = seg.seed
            for attempt in range(2 if self._watchdog else 1):
                if self._cancel_flag.is_set():
                    raise SynthesisCancelled("synthesis cancelled")
                cap = self._cap(seg, frames_before)
                if cap < 1:  # the stream's cap is spent: a segment ran on without EOS
                    return codes_all, False, stops
                codes, eos, stop = self._speak(seg, i, seed, cap, frames_before, joiner)
                codes_all.append(codes)
                frames_before += codes.shape[0]
                retry = stop is not None and attempt == 0 and stop.early
                if stop is not None:
                    stops.append(dataclasses.replace(stop, retried=retry))
                    log.warning("the watchdog stopped a runaway segment: %s", stops[-1].describe())
                if not retry:
                    eos_all = eos_all and eos
                    break
                seed = _segment_seed(seed, RETRY_SEED_INDEX)
        return codes_all, eos_all, stops

    def _run(self) -> None:
        engine = self._engine
        joiner = _SegmentJoiner(len(self._segments), self._fade)
        try:
            with engine._lock:
                engine._active = self
                try:
                    if self._batch > 1 and len(self._segments) > 1:
                        codes_all, eos_all, stops = _BatchedSegments(self, joiner).run()
                    else:
                        codes_all, eos_all, stops = self._generate_one_by_one(joiner)
                finally:
                    engine._active = None
            audio = np.concatenate([c.audio for c in self._chunks]) if self._chunks \
                else np.zeros(0, dtype=np.float32)
            codes = np.concatenate(codes_all) if codes_all else np.zeros((0, 16), dtype=np.int32)
            now = time.perf_counter()
            result = SynthesisResult(codes, self.mode, self.mode_reason, eos_all, self.seed, audio, self.sample_rate,
                                     self.segments, (self._first_audio or now) - self._started, now - self._started,
                                     tuple(stops))
            # as the caller sees it (the engine's own [Perf] lines time each request inside)
            log.info("[Perf] stream: %.2f s of audio (%d frames, %d segment(s)%s) %.2f s after the call, first audio "
                     "after %.0f ms, real-time factor %.3f", result.seconds, codes.shape[0], len(self._segments),
                     f", up to {self._batch} at a time" if self._batch > 1 and len(self._segments) > 1 else "",
                     result.wall_time, 1000 * result.time_to_first_audio, result.real_time_factor)
            with self._cond:
                self._result = result
        except BaseException as e:  # handed to the consumer
            with self._cond:
                self._error = e
        finally:
            with self._cond:
                self._finished = time.perf_counter()
                self._cond.notify_all()
            _live.discard(self)


@dataclass(eq=False)
class _Unit:
    """One request of a batched stream: a segment's attempt (1: the watchdog's retry)."""
    index: int
    attempt: int
    seed: int
    cap: int                                # the frame cap it is generated with
    watch: RunawayWatch | None
    generated: bool = False                 # handed to the engine
    chunks: list = field(default_factory=list)  # (codes, pcm) as streamed (a stop's tail cut)
    frames: int = 0
    complete: bool = False
    stop: RunawayStop | None = None
    eos: bool = False
    stream_cap: int = 0                     # its cap when spoken in order, once known
    emitted: int = 0                        # chunks handed over
    emitted_frames: int = 0
    begun: bool = False
    rerun: bool = False                     # the stream's cap ends it earlier than its own cap


class _BatchedSegments:
    """The segments of a Synthesis generated side by side (Engine.synthesize(batch=N)), with the
    stream the one-by-one order gives, bit for bit: each segment (and each retry of a runaway
    one) is one request of _engine's synthesize_batch with its own seed and cap, and its chunks
    are handed over in speaking order, each segment's as soon as those before it are complete.
    The stream's cap depends on the segments before, so it is applied in that order: a segment
    that ran past it is generated again alone with the cap it would have had (a stream of
    runaway segments only; its chunks up to there are the same, so only the rest is new)."""

    def __init__(self, synthesis: Synthesis, joiner: _SegmentJoiner):
        from .text import expected_speech_seconds
        self._s, self._joiner = synthesis, joiner
        self._spf = synthesis._engine.info["samples_per_frame"]
        self._expected = expected_speech_seconds
        self._order = [self._unit(i, 0, seg.seed) for i, seg in enumerate(synthesis._segments)]
        self._pointer = 0          # the unit being handed over
        self._frames_before = 0    # frames of the units handed over
        self._spent = False        # the stream's cap is reached: nothing more is spoken
        self._codes: list[np.ndarray] = []
        self._eos = True
        self._stops: list[RunawayStop] = []

    def _unit(self, index: int, attempt: int, seed: int) -> _Unit:
        s = self._s
        seg = s._segments[index]
        watch = RunawayWatch(index, self._expected(seg.text), self._spf) if s._watchdog else None
        return _Unit(index, attempt, seed, s._max_frames or _engine.default_max_frames(seg.ids.size), watch)

    def run(self) -> tuple[list[np.ndarray], bool, list[RunawayStop]]:
        while not self._spent and self._pointer < len(self._order):
            todo = [u for u in self._order if not u.generated]
            rerun = [u for u in self._order if u.rerun]
            if todo:
                for u in todo:
                    u.generated = True
                self._generate(todo)
            elif rerun:
                self._generate_alone(rerun[0])
            else:  # the engine broke its contract: a request ended without its last chunk
                raise VocableError("cannot synthesize: a segment of the batch never completed")
            self._advance()
        return self._codes, self._eos and not self._spent, self._stops

    def _generate(self, units: list[_Unit]) -> None:
        s = self._s

        def on_chunk(k: int, first_frame: int, codes: np.ndarray, pcm: np.ndarray, last: bool) -> bool:
            u = units[k]
            stop = u.watch.feed(codes, pcm) if u.watch is not None and codes.shape[0] else None
            if stop is not None:  # the stream ends with the frame that showed it
                keep = stop.frames - first_frame
                codes, pcm = codes[:keep], pcm[:keep * self._spf]
            u.chunks.append((codes, pcm))
            u.frames += codes.shape[0]
            with s._cond:
                s._frames += codes.shape[0]
            go_on = stop is None and not self._spent and not s._cancel_flag.is_set()
            if last or not go_on:
                u.complete, u.stop = True, stop
                u.eos = last and stop is None and u.frames < u.cap
            self._advance()
            return go_on

        requests = [(s._segments[u.index].ids, u.seed, u.cap) for u in units]
        # as few at a time as still take the fewest rounds: 10 segments by up to 8 run 5 and 5,
        # not 8 and then 2 (each step costs more the more it holds)
        rounds = -(-len(units) // s._batch)
        width = -(-len(units) // rounds)
        try:
            s._engine._ctx.synthesize_batch(requests, s._voice.speaker_embedding, s._ref_codes, s._ref_ids,
                                            s._language, *s._sampling, width, on_chunk, s._cancel_flag)
        except _engine.EngineError as e:
            if e.args[1] == _engine.STATUS_CANCELLED:
                raise SynthesisCancelled("synthesis cancelled") from None
            raise VocableError(f"cannot synthesize: {e.args[0]}") from None

    def _generate_alone(self, u: _Unit) -> None:
        """Generates unit u again alone, with the cap it has in speaking order."""
        s = self._s
        seg = s._segments[u.index]
        watch = RunawayWatch(u.index, self._expected(seg.text), self._spf) if s._watchdog else None
        u.chunks, u.frames, u.rerun, u.complete = [], 0, False, False
        u.cap = u.stream_cap

        def on_chunk(first_frame: int, codes: np.ndarray, pcm: np.ndarray) -> bool:
            stop = watch.feed(codes, pcm) if watch is not None else None
            if stop is not None:
                keep = stop.frames - first_frame
                codes, pcm = codes[:keep], pcm[:keep * self._spf]
            u.chunks.append((codes, pcm))
            u.frames += codes.shape[0]
            u.stop = stop
            return stop is None and not s._cancel_flag.is_set()

        try:
            _codes, _pcm, eos = s._engine._ctx.synthesize(seg.ids, s._voice.speaker_embedding, s._ref_codes,
                                                          s._ref_ids, s._language, *s._sampling, u.seed, u.cap,
                                                          on_chunk, s._cancel_flag)
        except _engine.EngineError as e:
            if e.args[1] != _engine.STATUS_CANCELLED:
                raise VocableError(f"cannot synthesize: {e.args[0]}") from None
            if u.stop is None or s._cancel_flag.is_set():
                raise SynthesisCancelled("synthesis cancelled") from None
            eos = False
        u.complete, u.eos = True, bool(eos) and u.stop is None

    def _advance(self) -> None:
        """Hands over what the speaking order allows: the chunks of the unit at the pointer, and
        on to the next once it is complete."""
        s, joiner = self._s, self._joiner
        while self._pointer < len(self._order) and not self._spent:
            u = self._order[self._pointer]
            if not u.begun:
                u.stream_cap = s._cap(s._segments[u.index], self._frames_before)
                if u.stream_cap < 1:  # the stream's cap is spent: a segment ran on without EOS
                    self._spent = True
                    return
                joiner.begin(u.index)
                u.begun = True
                with s._cond:
                    s._segment = u.index
            while u.emitted < len(u.chunks):
                codes, pcm = u.chunks[u.emitted]
                if u.emitted_frames + codes.shape[0] > u.stream_cap:
                    u.rerun = True  # generated past the cap it has in order: again, alone
                    return
                s._emit(joiner.feed(pcm), codes, self._frames_before + u.emitted_frames, u.index)
                u.emitted += 1
                u.emitted_frames += codes.shape[0]
            if not u.complete or u.rerun:
                return
            s._emit(joiner.end(), np.zeros((0, 16), dtype=np.int32), self._frames_before + u.frames, u.index)
            self._codes.append(np.concatenate([c for c, _ in u.chunks]) if u.chunks
                               else np.zeros((0, 16), dtype=np.int32))
            self._frames_before += u.frames
            retry = u.stop is not None and u.attempt == 0 and u.stop.early
            if u.stop is not None:
                self._stops.append(dataclasses.replace(u.stop, retried=retry))
                log.warning("the watchdog stopped a runaway segment: %s", self._stops[-1].describe())
            if retry:
                self._order.insert(self._pointer + 1,
                                   self._unit(u.index, 1, _segment_seed(u.seed, RETRY_SEED_INDEX)))
            else:
                # a segment that ended exactly at the cap it has in order stopped there one by one
                self._eos = self._eos and u.eos and u.frames < u.stream_cap
            self._pointer += 1


log = logging.getLogger("vocable.engine")

_LEVELS = {0: logging.DEBUG, 1: logging.INFO, 2: logging.WARNING, 3: logging.ERROR}


def _forward_log(level: int, text: str) -> None:
    log.log(_LEVELS.get(level, logging.INFO), "%s", text)


class Engine:
    """A loaded model. Calls from several threads are serialised (a context computes one
    request at a time, a synthesis stream holds it until it ends); use one Engine per thread for
    parallel work."""

    def __init__(self, model_path: str | os.PathLike, threads: int | None = None,
                 dump_dir: str | os.PathLike | None = None, codec_chunk_sec: float | None = None,
                 share_cores: bool = True):
        """`threads`: the most threads a computation runs on (None: every core). `share_cores`:
        run on fewer while other processes keep cores busy (measured every quarter second), so a
        busy desktop slows synthesis by its share of the cores instead of stalling it.
        `codec_chunk_sec`: width of the codec decoder's chunks (and the largest streamed chunk),
        None for the engine's default (_engine.DEFAULT_CODEC_CHUNK_SEC)."""
        path = Path(model_path)
        if not path.is_file():
            raise ModelError(f"model file not found: {path}" + (" (it is a folder: convert it first with "
                                                                "`vocable convert`)" if path.is_dir() else ""))
        if threads is not None and threads < 1:
            raise ValueError("threads must be at least 1")
        if codec_chunk_sec is not None and not codec_chunk_sec > 0:
            raise ValueError("codec_chunk_sec must be positive (None: the default)")
        if dump_dir is not None:
            Path(dump_dir).mkdir(parents=True, exist_ok=True)
        # The metadata is read first, in one bounded pass that checks every length and string,
        # so the engine only gets files whose header is well formed; and the tokenizer is ready
        # before the first synthesis, which then starts as quickly as the next.
        from .gguf_header import read_gguf_header
        from .text import GGUF_TOKENIZER_KEYS, TextTokenizer
        meta = read_gguf_header(path, GGUF_TOKENIZER_KEYS | {LANGUAGES_KEY})
        self._tokenizer = TextTokenizer.from_metadata(meta, path)
        languages = meta.get(LANGUAGES_KEY) or []
        if not (isinstance(languages, list) and all(isinstance(name, str) for name in languages)):
            raise ModelError(f"{path} has a malformed language list ({LANGUAGES_KEY})")
        self._languages = tuple(languages)
        try:
            self._ctx = _engine.Context(str(path), threads or 0, str(dump_dir) if dump_dir else None, _forward_log,
                                        float(codec_chunk_sec or 0.0), bool(share_cores))
            self.info: dict = self._ctx.model_info()
        except _engine.EngineError as e:
            raise ModelError(e.args[0]) from e
        except UnicodeDecodeError:  # text the header check did not see: the file replaced since
            raise ModelError(f"{path} has text that is not UTF-8: not a usable model file") from None
        self.model_path = path
        self._lock = threading.Lock()
        self._active: Synthesis | None = None

    def close(self) -> None:
        """Cancels a running synthesis and frees the model."""
        self.cancel()
        with self._lock:
            self._ctx.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def sample_rate(self) -> int:
        return int(self.info["sample_rate"])

    @property
    def max_chunk_seconds(self) -> float:
        """The longest audio chunk a stream hands over (codec_chunk_sec in whole frames)."""
        return self.info["codec_chunk_frames"] * self.info["samples_per_frame"] / self.sample_rate

    @property
    def languages(self) -> tuple[str, ...]:
        """The languages the model knows ("auto" picks by itself), read from the model file."""
        return self._languages

    def embed_voice(self, samples: np.ndarray, sample_rate: int, ref_text: str | None = None, name: str = "") -> Voice:
        """The voice of a reference clip: any sample rate, mono or multichannel (mixed down),
        1 to 60 s (longer clips keep their first 60 s; see Voice.warnings)."""
        clip = prepare_reference(samples, sample_rate)
        try:
            with self._lock:
                embedding, codes = self._ctx.extract_voice_ref(clip.samples)
        except _engine.EngineError as e:
            raise VocableError(f"cannot embed the reference voice: {e.args[0]}") from e
        text = ref_text.strip() if ref_text and ref_text.strip() else None
        return Voice(embedding, codes, text, name, self.info["variant"], clip.seconds, clip.warnings)

    @property
    def tokenizer(self):
        """The model's text tokenizer (text.TextTokenizer), read from the model file."""
        return self._tokenizer

    def synthesize(self, text: str, voice: Voice, language: str = "auto", ref_text: str | None = None, *,
                   temperature: float = 0.9, top_k: int = 50, top_p: float = 1.0, repetition_penalty: float = 1.05,
                   seed: int | None = None, max_frames: int | None = None, greedy: bool = False,
                   max_segment_units: int | None = None, watchdog: bool | None = None, batch: int = 1) -> Synthesis:
        """Starts speaking `text` in `voice` and returns the Synthesis stream at once (the work
        runs on a background thread; iterate it for audio chunks, or call result()). Errors in
        the arguments (empty text, unknown language, a voice of another model) are raised here.

        In-context cloning runs when the voice carries reference codes and a transcript is known
        (`ref_text`, or the one saved with the voice); otherwise the speaker embedding alone is
        used (x-vector). `greedy` (or temperature 0) picks the most likely codes; a seed makes a
        sampled run reproducible (a random one is drawn and reported when None).

        A text longer than `max_segment_units` (text.MAX_SEGMENT_UNITS, about 20 s of speech) is
        split at sentence boundaries into segments spoken one after the other in the same
        stream, in the same voice; segment i samples with a seed derived from (seed, i).
        `max_frames` is the frame cap of each segment (the model can run on without ending).
        By default a segment stops at _engine.default_max_frames(its text tokens), and the whole
        stream at stream_frame_cap(text) (see STREAM_CAP_FACTOR): then the segments left are not
        spoken, and reached_eos is False.

        The runaway watchdog (runaway.py) stops a segment that goes on in silence, loops, or runs
        far past its text, and generates it once more with another seed when it stopped before
        its text can have been spoken; SynthesisResult.runaway says what it did. It is on unless
        `max_frames` is given (a caller that fixes the length wants exactly that many frames);
        `watchdog` overrides that.

        `batch`: how many segments generate side by side (1 to _engine.MAX_BATCH). They share
        every weight read, so a long text takes less time in all (see README, Speed), with the
        same audio and codes as one by one; but a segment's audio is handed over only once those
        before it are complete, so the first audio comes no sooner. For files, not for playback."""
        from .text import MAX_SEGMENT_UNITS, split_for_synthesis

        started = time.perf_counter()
        language = language.lower()
        known = self.languages
        if language != "auto" and known and language not in known:
            raise VocableError(f"unknown language '{language}'; the model knows: auto, {', '.join(known)}")
        if voice.speaker_embedding.size != self.info["n_speaker_embd"]:
            raise VocableError(f"the voice was made with another model size ({voice.model_variant or 'unknown'}: "
                               f"embedding width {voice.speaker_embedding.size}, this model's is "
                               f"{self.info['n_speaker_embd']}); make it again with this model")
        if max_frames is not None and max_frames < 1:
            raise ValueError("max_frames must be at least 1")
        if not 1 <= batch <= _engine.MAX_BATCH:
            raise ValueError(f"batch must be 1 to {_engine.MAX_BATCH}")
        texts = split_for_synthesis(text, max_segment_units or MAX_SEGMENT_UNITS)
        if seed is None:
            seed = secrets.randbits(63)
        seed = int(seed)
        if not 0 <= seed < 2 ** 64:
            raise ValueError("seed must be in [0, 2**64)")
        segments = [_Segment(t, np.asarray(self.tokenizer.target_prompt(t).ids, dtype=np.int32), _segment_seed(seed, i))
                    for i, t in enumerate(texts)]
        transcript = ref_text if ref_text is not None and ref_text.strip() else voice.ref_text
        ref_codes = ref_ids = None
        if voice.codes is not None and transcript:
            mode, reason = IN_CONTEXT, "the voice has reference codes and a transcript"
            ref_codes = voice.codes
            low, high = int(ref_codes.min(initial=0)), int(ref_codes.max(initial=0))
            if low < 0 or high >= self.info["codebook_size"]:
                raise VocableError(f"the voice's reference codes are out of range ({low} to {high}; this model's "
                                   f"codebooks have codes 0 to {self.info['codebook_size'] - 1}): the voice is "
                                   "damaged, make it again")
            ref_ids = np.asarray(self.tokenizer.ref_prompt(transcript).ids, dtype=np.int32)
        elif voice.codes is None:
            mode, reason = X_VECTOR, "the voice has no reference codes"
        else:
            mode, reason = X_VECTOR, "no transcript of the reference was given"
        if greedy:
            temperature = 0.0
        talker = dict(temperature=temperature, top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty)
        predictor = dict(temperature=temperature, top_k=top_k, top_p=top_p)
        self._ctx.model_info()  # raises ValueError("...closed") now rather than in the stream
        return Synthesis(self, segments, voice, language, ref_codes, ref_ids, mode, reason, seed, talker, predictor,
                         max_frames, stream_frame_cap(text), started,
                         watchdog if watchdog is not None else max_frames is None, batch)

    def synthesize_to_file(self, text: str, voice: Voice, path: str | os.PathLike, language: str = "auto",
                           ref_text: str | None = None, **kwargs) -> SynthesisResult:
        """Speaks `text` into an audio file: WAV or FLAC (16 bit), OGG Vorbis or MP3, by its
        extension. Takes synthesize()'s keyword arguments; returns its SynthesisResult. A long
        text's segments generate FILE_BATCH at a time unless `batch` says otherwise."""
        _file_format(Path(path))  # before the work: a wrong name fails at once
        kwargs.setdefault("batch", FILE_BATCH)
        with self.synthesize(text, voice, language, ref_text, **kwargs) as stream:
            result = stream.result()
        write_audio(path, result.audio, result.sample_rate)
        return result

    def decode(self, codes: np.ndarray, chunk_frames: int | None = None) -> np.ndarray:
        """Audio (float32 [frames * 1920]) of codec codes int32 [frames, 16], decoded in chunks of
        `chunk_frames` (None: the engine's codec chunk) with the same result for any width."""
        codes = np.asarray(codes)
        if codes.ndim != 2 or codes.shape[0] < 1 or codes.shape[1] != self.info["n_codebooks"]:
            raise ValueError(f"codes must be [frames >= 1, {self.info['n_codebooks']}], got {list(codes.shape)}")
        try:
            with self._lock:
                return self._ctx.decode(np.ascontiguousarray(codes, dtype=np.int32), int(chunk_frames or 0))
        except _engine.EngineError as e:
            raise VocableError(f"cannot decode: {e.args[0]}") from e

    def forget_prompts(self) -> None:
        """Drops the engine's cached prompts, so that the next synthesis computes its prefill
        even for a prompt it has seen (the bench times a new prompt this way). Waits for a
        running synthesis to end."""
        with self._lock:
            self._ctx.forget_prompts()

    def cancel(self) -> None:
        """Stops the synthesis running on this engine, if any (it raises SynthesisCancelled)."""
        active = self._active
        if active is not None:
            active.cancel()
        self._ctx.cancel()
