"""The segments of a long text generated side by side (Engine.synthesize(batch=N), used for
files): batched talker and code-predictor steps share each weight read, and the stream that
comes out is the one-by-one stream of synthesis.py, bit for bit.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .. import _engine
from ..errors import VocableError
from .runaway import RunawayStop, RunawayWatch, cut_at_stop
from .segments import RETRY_SEED_INDEX, SegmentJoiner, raise_request_error, segment_seed

if TYPE_CHECKING:
    from .synthesis import Synthesis

log = logging.getLogger("vocable.engine")


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


class BatchedSegments:
    """The segments of a Synthesis generated side by side (Engine.synthesize(batch=N)), with the
    stream the one-by-one order gives, bit for bit: each segment (and each retry of a runaway
    one) is one request of _engine's synthesize_batch with its own seed and cap, and its chunks
    are handed over in speaking order, each segment's as soon as those before it are complete.
    The stream's cap depends on the segments before, so it is applied in that order: a segment
    that ran past it is generated again alone with the cap it would have had (a stream of
    runaway segments only; its chunks up to there are the same, so only the rest is new)."""

    def __init__(self, synthesis: Synthesis, joiner: SegmentJoiner):
        from .sentences import expected_speech_seconds
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
            codes, pcm, stop = cut_at_stop(u.watch, first_frame, codes, pcm)
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
            raise_request_error(e, stopped_by_watchdog=False)

    def _generate_alone(self, u: _Unit) -> None:
        """Generates unit u again alone, with the cap it has in speaking order."""
        s = self._s
        seg = s._segments[u.index]
        watch = RunawayWatch(u.index, self._expected(seg.text), self._spf) if s._watchdog else None
        u.chunks, u.frames, u.rerun, u.complete = [], 0, False, False
        u.cap = u.stream_cap

        def on_chunk(first_frame: int, codes: np.ndarray, pcm: np.ndarray) -> bool:
            codes, pcm, stop = cut_at_stop(watch, first_frame, codes, pcm)
            u.chunks.append((codes, pcm))
            u.frames += codes.shape[0]
            u.stop = stop
            return stop is None and not s._cancel_flag.is_set()

        try:
            _codes, _pcm, eos = s._engine._ctx.synthesize(seg.ids, s._voice.speaker_embedding, s._ref_codes,
                                                          s._ref_ids, s._language, *s._sampling, u.seed, u.cap,
                                                          on_chunk, s._cancel_flag)
        except _engine.EngineError as e:
            raise_request_error(e, stopped_by_watchdog=u.stop is not None and not s._cancel_flag.is_set())
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
                                   self._unit(u.index, 1, segment_seed(u.seed, RETRY_SEED_INDEX)))
            else:
                # a segment that ended exactly at the cap it has in order stopped there one by one
                self._eos = self._eos and u.eos and u.frames < u.stream_cap
            self._pointer += 1
