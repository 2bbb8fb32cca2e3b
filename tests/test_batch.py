"""Long texts in batches: a text's segments generated side by side (Engine.synthesize(batch=N),
synthesize_to_file) give the stream one by one gives, chunk for chunk and bit for bit: with a
frame cap, with the stream's cap, with the watchdog's stops and retries, in both clone modes."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from conftest import manifest, reference
from test_runaway import never_stopping
from vocable import Engine, SynthesisCancelled, Voice
from vocable.audio.files import read_audio

SENTENCES = ("The first sentence is here.", "A second one follows it.", "And a third ends the text.",
             "A fourth one is here too.", "The fifth is the last.")
TEXT = " ".join(SENTENCES)
UNITS = 32  # max_segment_units that makes each sentence a segment


def run(engine, text, voice, units=UNITS, **kwargs):
    with engine.synthesize(text, voice, max_segment_units=units, **kwargs) as stream:
        chunks = list(stream.chunks())
        result = stream.result()
    return chunks, result


def assert_same_stream(a, b):
    (chunks_a, result_a), (chunks_b, result_b) = a, b
    assert len(chunks_a) == len(chunks_b)
    for x, y in zip(chunks_a, chunks_b):
        assert (x.first_sample, x.first_frame, x.segment) == (y.first_sample, y.first_frame, y.segment)
        np.testing.assert_array_equal(x.audio, y.audio)
        np.testing.assert_array_equal(x.codes, y.codes)
    np.testing.assert_array_equal(result_a.audio, result_b.audio)
    np.testing.assert_array_equal(result_a.codes, result_b.codes)
    assert result_a.reached_eos == result_b.reached_eos
    assert result_a.segments == result_b.segments and result_a.runaway == result_b.runaway


@pytest.mark.parametrize("batch", [2, 3, 5])
def test_a_batch_gives_the_stream_of_one_by_one(engine, voice, batch):
    """Sampled, each segment with its own seed; 3 at a time means the fourth and fifth start as
    earlier ones end."""
    kwargs = dict(seed=7, max_frames=9)
    one_by_one = run(engine, TEXT, voice, **kwargs)
    assert len(one_by_one[1].segments) == 5 and one_by_one[1].codes.shape[0] == 5 * 9
    assert_same_stream(run(engine, TEXT, voice, batch=batch, **kwargs), one_by_one)


def test_the_stream_cap_in_a_batch(engine, voice):
    """Random weights never stop: each segment runs to its own cap one by one until the
    stream's cap ends the stream inside a segment. In a batch the segments run ahead to their
    own caps, and the one that crosses the stream's cap is generated again alone with the cap
    it has in order: the same stream."""
    from vocable.engine import stream_frame_cap
    kwargs = dict(greedy=True, watchdog=False)
    one_by_one = run(engine, TEXT, voice, **kwargs)
    assert one_by_one[1].codes.shape[0] == stream_frame_cap(TEXT) and not one_by_one[1].reached_eos
    assert len(one_by_one[1].segments) == 5 and one_by_one[0][-1].segment < 4  # the cap struck early
    assert_same_stream(run(engine, TEXT, voice, batch=4, **kwargs), one_by_one)


def test_the_watchdog_in_a_batch(converted, tmp_path, voice):
    """A silent model that never stops: every segment is stopped early on silence and tried
    again with another seed, stopped again, and the stream goes on with the next segment."""
    with Engine(never_stopping(converted, tmp_path, silent=True), threads=2) as engine:
        long = "This sentence would take a good few seconds to say out loud, if anything were said at all."
        text = " ".join([long] * 3)
        one_by_one = run(engine, text, voice, units=120, seed=11)
        assert len(one_by_one[1].segments) == 3
        assert [s.retried for s in one_by_one[1].runaway] == [True, False] * 3
        assert_same_stream(run(engine, text, voice, units=120, seed=11, batch=3), one_by_one)


def test_in_context_batch(converted):
    m = manifest("0.6b")
    icl = Voice(reference("0.6b", "speaker_embedding"), reference("0.6b", "ref_codes"), m["ref_text"])
    with Engine(converted("0.6b", "f32"), threads=2) as engine:
        kwargs = dict(seed=3, max_frames=5)
        one_by_one = run(engine, TEXT, icl, **kwargs)
        assert one_by_one[1].mode == "in-context"
        assert_same_stream(run(engine, TEXT, icl, batch=4, **kwargs), one_by_one)


def test_progress_covers_the_whole_text(engine, voice):
    with engine.synthesize(TEXT, voice, seed=1, max_frames=6, max_segment_units=UNITS, batch=3) as stream:
        stream.result()
        progress = stream.progress
    assert progress.done and progress.frames == 5 * 6 and progress.segments == 5 and progress.segment == 4
    assert progress.audio_seconds == pytest.approx(5 * 6 * 0.08)


def test_cancel_a_batch(engine, voice):
    started = threading.Event()
    with engine.synthesize(TEXT, voice, seed=1, max_frames=200, max_segment_units=UNITS, batch=3) as stream:
        with pytest.raises(SynthesisCancelled):
            for _ in stream.chunks():
                started.set()
                stream.cancel()
        with pytest.raises(SynthesisCancelled):
            stream.result()
    assert started.is_set()
    # the engine goes on as before
    assert_same_stream(run(engine, TEXT, voice, seed=2, max_frames=3, batch=2),
                       run(engine, TEXT, voice, seed=2, max_frames=3))


def test_a_bad_batch_is_refused(engine, voice):
    from vocable import _engine
    for batch in (0, _engine.MAX_BATCH + 1):
        with pytest.raises(ValueError, match="batch must be 1 to"):
            engine.synthesize(TEXT, voice, batch=batch)


def test_files_are_written_in_batches(engine, voice, tmp_path):
    """synthesize_to_file batches a long text by default, with the audio of one by one."""
    batched = engine.synthesize_to_file(TEXT, voice, tmp_path / "batched.wav", seed=5, max_frames=4,
                                        max_segment_units=UNITS)
    alone = engine.synthesize_to_file(TEXT, voice, tmp_path / "alone.wav", seed=5, max_frames=4,
                                      max_segment_units=UNITS, batch=1)
    np.testing.assert_array_equal(batched.audio, alone.audio)
    a, _ = read_audio(tmp_path / "batched.wav")
    b, _ = read_audio(tmp_path / "alone.wav")
    np.testing.assert_array_equal(a, b)
