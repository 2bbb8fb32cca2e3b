"""A synthesis stream (Engine.synthesize returns one at once): the segments of a text spoken one
after the other on a background thread, each chunk of audio handed to the consumers as it is
produced, and the whole result at the end; or, for files, the segments generated side by side
(batch.py) with the same stream.
"""
from __future__ import annotations

import atexit
import dataclasses
import logging
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

import numpy as np

from .. import _engine
from ..audio.export import ChapterSpan
from ..errors import SynthesisCancelled
from ..library.voice import Voice
from .batch import BatchedSegments
from .runaway import RunawayStop, RunawayWatch, cut_at_stop
from .segments import (FRAME_RATE, RETRY_SEED_INDEX, SEGMENT_FADE_SEC, Segment, SegmentJoiner, raise_request_error,
                       segment_seed)

if TYPE_CHECKING:
    from .engine import Engine

X_VECTOR = "x-vector"
IN_CONTEXT = "in-context"

log = logging.getLogger("vocable.engine")


@dataclass
class SynthesisResult:
    """A finished synthesis: the audio, the codec codes it was decoded from, and how it ran.

    Timings are measured in Python from the synthesize() call: time to first audio (the first
    chunk handed over), wall time (the last), and their real-time factor (wall / audio seconds;
    below 1 is faster than real time). A long text is spoken as several segments (see
    sentences.split_for_synthesis); `codes` are theirs back to back, and `audio` has a short fade where
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
    # where each chapter of the text (chapters.split_chapters) lies in `audio`, in order; one
    # untitled chapter for a text without headings
    chapters: tuple[ChapterSpan, ...] = ()

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

    def __init__(self, engine: "Engine", segments: list[Segment], voice: Voice, language: str,
                 ref_codes: np.ndarray | None, ref_ids: np.ndarray | None, mode: str, reason: str, seed: int,
                 talker: dict, predictor: dict, max_frames: int | None, stream_cap: int, started: float,
                 watchdog: bool, batch: int = 1, chapter_titles: tuple[str, ...] = ("",)):
        self._engine = engine
        self._segments = segments
        self._chapter_titles = chapter_titles
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

    def _speak(self, seg: "Segment", index: int, seed: int, cap: int, frames_before: int,
               joiner: SegmentJoiner) -> tuple[np.ndarray, bool, RunawayStop | None]:
        """One request for segment `index`, streamed: its codes, whether it reached EOS, and the
        watchdog's stop when it ran away (the codes and audio up to the stop are kept)."""
        from .sentences import expected_speech_seconds

        engine = self._engine
        watch = RunawayWatch(index, expected_speech_seconds(seg.text),
                             engine.info["samples_per_frame"]) if self._watchdog else None
        streamed: list[np.ndarray] = []
        joiner.begin(index)

        def on_chunk(first_frame: int, codes: np.ndarray, pcm: np.ndarray) -> bool:
            codes, pcm, stop = cut_at_stop(watch, first_frame, codes, pcm)
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
            raise_request_error(e, stopped_by_watchdog=watch is not None and watch.stop is not None
                                and not self._cancel_flag.is_set())
            codes, eos = np.concatenate(streamed), False
        self._emit(joiner.end(), codes[:0], frames_before + codes.shape[0], index)
        return codes, bool(eos), watch.stop if watch is not None else None

    def _chapter_spans(self, total: int) -> tuple[ChapterSpan, ...]:
        """Each chapter from the first sample of its first segment's audio to the next chapter's
        start; a chapter the stream's cap left unspoken is empty, at the end."""
        starts = [total] * len(self._chapter_titles)
        for chunk in reversed(self._chunks):
            starts[self._segments[chunk.segment].chapter] = chunk.first_sample
        for c in range(len(starts) - 2, -1, -1):
            starts[c] = min(starts[c], starts[c + 1])
        ends = starts[1:] + [total]
        return tuple(ChapterSpan(title, start, end) for title, start, end in zip(self._chapter_titles, starts, ends))

    def _cap(self, seg: "Segment", frames_before: int) -> int:
        """The frame cap of a segment spoken after `frames_before` frames of the stream."""
        return self._max_frames or min(_engine.default_max_frames(seg.ids.size), self._stream_cap - frames_before)

    def _generate_one_by_one(self, joiner: SegmentJoiner) -> tuple[list[np.ndarray], bool, list[RunawayStop]]:
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
                seed = segment_seed(seed, RETRY_SEED_INDEX)
        return codes_all, eos_all, stops

    def _run(self) -> None:
        engine = self._engine
        joiner = SegmentJoiner(len(self._segments), self._fade)
        try:
            with engine._lock:
                engine._active = self
                try:
                    if self._batch > 1 and len(self._segments) > 1:
                        codes_all, eos_all, stops = BatchedSegments(self, joiner).run()
                    else:
                        codes_all, eos_all, stops = self._generate_one_by_one(joiner)
                finally:
                    engine._active = None
                    # a device that ran out of memory is given up for the CPU during a request
                    engine.device, engine.device_fallback = engine._ctx.device()
            audio = np.concatenate([c.audio for c in self._chunks]) if self._chunks \
                else np.zeros(0, dtype=np.float32)
            codes = np.concatenate(codes_all) if codes_all else np.zeros((0, 16), dtype=np.int32)
            now = time.perf_counter()
            result = SynthesisResult(codes, self.mode, self.mode_reason, eos_all, self.seed, audio, self.sample_rate,
                                     self.segments, (self._first_audio or now) - self._started, now - self._started,
                                     tuple(stops), self._chapter_spans(audio.size))
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
