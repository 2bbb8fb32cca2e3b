"""Long text: segments spoken back to back in one stream, in the same voice, with reproducible
per-segment seeds, and joined without gaps or clicks."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import manifest, reference
from vocable import IN_CONTEXT, Engine, Voice
from vocable.engine.segments import SEGMENT_FADE_SEC, SegmentJoiner, raised_cosine, segment_seed

SENTENCES = ("The first sentence is here.", "A second one follows it.", "And a third ends the text.")
TEXT = " ".join(SENTENCES)
UNITS = 32      # max_segment_units that makes each sentence a segment
FRAMES = 10     # frame cap of each segment (random weights never reach EOS)
FADE = round(SEGMENT_FADE_SEC * 24000)


@pytest.fixture(scope="module")
def streamed(engine, voice):
    with engine.synthesize(TEXT, voice, seed=7, max_frames=FRAMES, max_segment_units=UNITS) as stream:
        chunks = list(stream.chunks())
        result = stream.result()
    return chunks, result


def test_segments_stream_back_to_back(streamed):
    chunks, result = streamed
    assert result.segments == SENTENCES
    n = len(SENTENCES) * FRAMES
    assert result.codes.shape == (n, 16)
    # no gap: the joined audio has exactly the samples of the segments' frames
    assert result.audio.shape == (n * 1920,)
    np.testing.assert_array_equal(np.concatenate([c.audio for c in chunks]), result.audio)
    np.testing.assert_array_equal(np.concatenate([c.codes for c in chunks]), result.codes)
    assert [c.segment for c in chunks] == sorted(c.segment for c in chunks)
    assert {c.segment for c in chunks} == {0, 1, 2}
    assert [c.first_sample for c in chunks] == list(np.cumsum([0] + [c.audio.size for c in chunks[:-1]]))
    assert result.seed == 7 and not result.reached_eos


def test_each_segment_is_its_own_request(engine, voice, streamed):
    """Segment i is what a request for its sentence alone gives with the seed derived from
    (seed, i): the voice is kept, the seeds reproducible; the audio differs from it only in the
    fades where segments meet."""
    _, result = streamed
    seg_samples = FRAMES * 1920
    ramp = raised_cosine(FADE)
    for i, sentence in enumerate(SENTENCES):
        alone = engine.synthesize(sentence, voice, seed=segment_seed(7, i), max_frames=FRAMES).result()
        np.testing.assert_array_equal(result.codes[i * FRAMES:(i + 1) * FRAMES], alone.codes)
        joined = result.audio[i * seg_samples:(i + 1) * seg_samples]
        expect = alone.audio.copy()
        if i > 0:
            expect[:FADE] *= ramp
        if i < len(SENTENCES) - 1:
            expect[-FADE:] *= ramp[::-1]
        np.testing.assert_array_equal(joined, expect)
    assert segment_seed(7, 0) == 7 and len({segment_seed(7, i) for i in range(100)}) == 100


def test_same_seed_same_long_audio(engine, voice, streamed):
    _, result = streamed
    again = engine.synthesize(TEXT, voice, seed=7, max_frames=FRAMES, max_segment_units=UNITS).result()
    np.testing.assert_array_equal(again.audio, result.audio)


def test_joins_have_no_jump(streamed):
    """At each join the waveform goes to zero and back smoothly: the step across the boundary
    is no larger than the typical step inside a segment."""
    _, result = streamed
    x = result.audio
    steps = np.abs(np.diff(x))
    bounds = [i * FRAMES * 1920 for i in range(1, len(SENTENCES))]
    inside = np.ones(steps.size, dtype=bool)
    for b in bounds:
        inside[b - FADE - 1:b + FADE] = False
    typical = np.median(steps[inside])
    for b in bounds:
        assert abs(x[b]) < 0.01 and abs(x[b - 1]) < 0.01
        assert abs(x[b] - x[b - 1]) <= typical


def test_joiner_on_smooth_signals():
    """The joiner on sines of unrelated phases, fed in uneven chunks: a plain concatenation would
    jump at each boundary; the joined signal's largest step there stays within the signal's own
    steps, and every sample away from the fades is unchanged."""
    rate, fade = 24000, FADE
    rng = np.random.default_rng(0)
    segments = [(0.5 * np.sin(2 * np.pi * f * np.arange(n) / rate + ph)).astype(np.float32)
                for f, n, ph in [(220, 9000, 0.3), (330, 4000, 2.0), (275, 12345, 4.1), (180, 500, 1.0)]]
    plain = np.concatenate(segments)
    bounds = np.cumsum([s.size for s in segments])[:-1]
    own_step = max(np.abs(np.diff(s)).max() for s in segments)
    assert max(abs(plain[b] - plain[b - 1]) for b in bounds) > 5 * own_step  # the click the joiner removes

    joiner = SegmentJoiner(len(segments), fade)
    out = []
    for i, seg in enumerate(segments):
        joiner.begin(i)
        pos = 0
        while pos < seg.size:
            n = int(rng.integers(1, 3000))
            out.append(joiner.feed(seg[pos:pos + n]))
            pos += n
        out.append(joiner.end())
    joined = np.concatenate(out)
    assert joined.shape == plain.shape
    for b in bounds:
        window = joined[b - fade - 1:b + fade + 1]
        assert np.abs(np.diff(window)).max() <= own_step * 1.01
    away = np.ones(plain.size, dtype=bool)
    for b in bounds:
        away[b - fade:b + fade] = False
    np.testing.assert_array_equal(joined[away], plain[away])


def test_in_context_long_text(converted):
    """In-context mode keeps the reference (codes and transcript) for every segment."""
    m = manifest("0.6b")
    icl = Voice(reference("0.6b", "speaker_embedding"), reference("0.6b", "ref_codes"), m["ref_text"])
    with Engine(converted("0.6b", "f32"), threads=2) as engine:
        result = engine.synthesize(TEXT, icl, greedy=True, max_frames=4, max_segment_units=UNITS).result()
        first = engine.synthesize(SENTENCES[0], icl, greedy=True, max_frames=4).result()
    assert result.mode == IN_CONTEXT and len(result.segments) == 3
    assert result.audio.size == 3 * 4 * 1920
    np.testing.assert_array_equal(result.codes[:4], first.codes)


def test_default_split_keeps_short_text_whole(engine, voice):
    result = engine.synthesize(TEXT, voice, greedy=True, max_frames=2).result()
    assert result.segments == (TEXT,)


# -- the frame cap counts the whole stream ------------------------------------------------------------

def test_invisible_characters_do_not_lengthen_the_stream(engine, voice):
    """1000 zero-width spaces and "hi" once made four segments of 8192 frames each (43 min of
    audio from random weights that never stop); the stream's cap follows what there is to say."""
    from vocable.engine import stream_frame_cap
    text = "\u200b" * 1000 + "hi"
    # the cap itself (the watchdog, which stops such a run sooner, is tested in test_runaway.py)
    result = engine.synthesize(text, voice, greedy=True, watchdog=False).result()
    assert len(result.segments) == 1 and not result.reached_eos
    assert result.codes.shape[0] == stream_frame_cap(text) == stream_frame_cap("hi") < 50


def test_the_stream_cap_counts_every_segment(engine, voice):
    from vocable import _engine
    from vocable.engine import stream_frame_cap
    result = engine.synthesize(TEXT, voice, greedy=True, max_segment_units=UNITS, watchdog=False).result()
    own_caps = [_engine.default_max_frames(len(engine.tokenizer.target_prompt(s).ids)) for s in SENTENCES]
    assert sum(own_caps) > stream_frame_cap(TEXT)  # each segment alone would run to its own cap
    assert result.codes.shape[0] == stream_frame_cap(TEXT) and not result.reached_eos
    assert result.audio.size == result.codes.shape[0] * 1920


@pytest.mark.parametrize("text, message", [("\u200b" * 1000, "only invisible characters"),
                                           ("\u2060\ufeff\u200d \u00ad\n\ufe0f", "only invisible characters"),
                                           ("... ?! --", "nothing to speak")])
def test_text_with_nothing_to_speak_is_a_clear_error(engine, voice, text, message):
    from vocable.engine.text import TextError
    with pytest.raises(TextError, match=message):
        engine.synthesize(text, voice)


def test_a_segment_with_nothing_to_speak_is_not_spoken(engine, voice):
    rule = "-" * 40
    text = f"{SENTENCES[0]}\n\n{rule}\n\n{SENTENCES[1]}"
    result = engine.synthesize(text, voice, greedy=True, max_frames=2, max_segment_units=UNITS).result()
    assert result.segments == (SENTENCES[0], SENTENCES[1])
    assert result.codes.shape[0] == 4
