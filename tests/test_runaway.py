"""The runaway watchdog (vocable/engine/runaway.py): its three signs on made-up streams, then the engine
with models made never to stop (the end-of-speech code's logit row zeroed, so greedy decoding
never picks it), one of them also silent (the decoder's last convolution zeroed)."""
from __future__ import annotations

import numpy as np
import pytest

from gguf_craft import craft_gguf
from vocable import Engine
from vocable.engine.runaway import (EARLY_FRACTION, FRAME_RATE, OVERLONG_FACTOR, OVERLONG_MARGIN_SEC, REPEAT_STOP_SEC,
                                    SILENCE_STOP_SEC, RunawayWatch)

SPF = 1920  # samples per frame


def speech(frames: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Codes that change every frame and audio at about -20 dBFS."""
    codes = rng.integers(0, 2048, size=(frames, 16), dtype=np.int32)
    return codes, (0.1 * rng.standard_normal(frames * SPF)).astype(np.float32)


def silence(frames: int, rng) -> tuple[np.ndarray, np.ndarray]:
    codes = rng.integers(0, 2048, size=(frames, 16), dtype=np.int32)
    return codes, (1e-4 * rng.standard_normal(frames * SPF)).astype(np.float32)   # -80 dBFS


def feed_in_chunks(watch: RunawayWatch, codes: np.ndarray, pcm: np.ndarray, widths=(1, 2, 4, 8, 16)):
    """As the engine streams: chunks of 1, 2, 4, ... frames; returns the first stop."""
    at, k = 0, 0
    while at < codes.shape[0]:
        n = min(widths[min(k, len(widths) - 1)], codes.shape[0] - at)
        stop = watch.feed(codes[at:at + n], pcm[at * SPF:(at + n) * SPF])
        if stop:
            return stop
        at, k = at + n, k + 1
    return None


def test_speech_of_the_expected_length_is_left_alone():
    rng = np.random.default_rng(0)
    watch = RunawayWatch(0, 6.0, SPF)
    assert feed_in_chunks(watch, *speech(int(6.0 * FRAME_RATE * 1.5), rng)) is None


def test_a_chunk_without_all_its_audio_is_an_error_not_silence():
    codes, pcm = speech(4, np.random.default_rng(5))
    with pytest.raises(ValueError, match="fewer than"):
        RunawayWatch(0, 6.0, SPF).feed(codes, pcm[:-1])


def test_silence_after_speech_stops_the_segment():
    rng = np.random.default_rng(1)
    c1, p1 = speech(25, rng)
    c2, p2 = silence(60, rng)
    stop = feed_in_chunks(RunawayWatch(2, 2.0, SPF), np.concatenate([c1, c2]), np.concatenate([p1, p2]))
    assert stop is not None and stop.reason == "silence" and stop.segment == 2
    assert stop.seconds == pytest.approx(2.0 + SILENCE_STOP_SEC, abs=0.1)
    assert not stop.early and "did not end by itself" in stop.describe()


def test_a_short_pause_is_no_silence():
    rng = np.random.default_rng(2)
    parts = [speech(20, rng), silence(12, rng), speech(20, rng)]   # a pause of ~1 s
    codes, pcm = (np.concatenate(x) for x in zip(*parts))
    assert feed_in_chunks(RunawayWatch(0, 4.5, SPF), codes, pcm) is None


@pytest.mark.parametrize("period", [1, 2, 3, 4])
def test_a_loop_of_codes_stops_the_segment(period):
    rng = np.random.default_rng(3)
    c1, p1 = speech(10, rng)
    c2, p2 = speech(40, rng)
    c2[:, 0] = np.resize(rng.integers(0, 2048, size=period), 40)    # first codebook loops, audio does not
    stop = feed_in_chunks(RunawayWatch(0, 8.0, SPF), np.concatenate([c1, c2]), np.concatenate([p1, p2]))
    assert stop is not None and stop.reason == "repetition"
    assert stop.seconds <= (10 + REPEAT_STOP_SEC * FRAME_RATE + period + 1) / FRAME_RATE


def test_running_far_past_the_text_stops_the_segment():
    rng = np.random.default_rng(4)
    stop = feed_in_chunks(RunawayWatch(0, 1.0, SPF), *speech(200, rng))
    assert stop is not None and stop.reason == "overlong"
    assert stop.seconds == pytest.approx(OVERLONG_FACTOR * 1.0 + OVERLONG_MARGIN_SEC, abs=0.1)


def test_silence_from_the_start_is_an_early_stop():
    rng = np.random.default_rng(5)
    stop = feed_in_chunks(RunawayWatch(0, 10.0, SPF), *silence(100, rng))
    assert stop.reason == "silence" and stop.early and stop.seconds < EARLY_FRACTION * 10.0


# -- the engine, with models that never stop ------------------------------------------------------

def never_stopping(converted, tmp_path, silent: bool = False):
    import gguf
    src = converted("0.6b", "f32")
    reader = gguf.GGUFReader(str(src))
    eos = int(reader.fields["qwen3-tts.codec.eos_id"].contents())
    tensors = {t.name: t for t in reader.tensors}
    head = np.array(tensors["talker.codec_head.weight"].data, dtype=np.float32)
    head[eos] = 0.0
    changed = {"talker.codec_head.weight": (head, gguf.GGMLQuantizationType.F32)}
    if silent:
        last = max(int(n.split(".")[2]) for n in tensors if n.startswith("cdec.dec.") and n.endswith(".conv.weight"))
        for part in ("weight", "bias"):
            name = f"cdec.dec.{last}.conv.{part}"
            changed[name] = (np.zeros_like(np.array(tensors[name].data, dtype=np.float32)),
                             gguf.GGMLQuantizationType.F32)
    return craft_gguf(src, tmp_path / ("silent.gguf" if silent else "endless.gguf"), tensors=changed)


def test_a_model_that_never_stops_is_stopped_past_its_text(converted, tmp_path, voice):
    text = "Hello there."
    with Engine(never_stopping(converted, tmp_path), threads=2) as engine:
        watched = engine.synthesize(text, voice, greedy=True).result()
        unwatched = engine.synthesize(text, voice, greedy=True, watchdog=False).result()
    assert not unwatched.reached_eos and unwatched.runaway == ()
    assert not watched.reached_eos and len(watched.runaway) == 1
    stop = watched.runaway[0]
    assert stop.reason in ("overlong", "repetition") and not stop.retried
    assert watched.codes.shape[0] < unwatched.codes.shape[0]
    assert watched.seconds <= OVERLONG_FACTOR * stop.expected_seconds + OVERLONG_MARGIN_SEC + 0.1
    # what was streamed is the result
    assert watched.audio.size == watched.codes.shape[0] * SPF


def test_an_early_runaway_is_tried_once_more_with_another_seed(converted, tmp_path, voice):
    """A silent, never-ending model: the first try stops on silence long before its text could
    have been spoken, the second (another seed) too, and then the watchdog gives up."""
    text = "This sentence would take a good few seconds to say out loud, if anything were said at all."
    with Engine(never_stopping(converted, tmp_path, silent=True), threads=2) as engine:
        with engine.synthesize(text, voice, seed=11) as stream:
            chunks = list(stream.chunks())
            result = stream.result()
    assert [s.reason for s in result.runaway] == ["silence", "silence"]
    assert [s.retried for s in result.runaway] == [True, False]
    assert all(s.early for s in result.runaway)
    frames = round(SILENCE_STOP_SEC * FRAME_RATE)
    assert result.codes.shape[0] == 2 * frames
    assert np.array_equal(np.concatenate([c.audio for c in chunks]), result.audio)


def test_a_fixed_length_is_not_watched(converted, tmp_path, voice):
    """max_frames asks for that many frames (the bench times exactly so many): no watchdog."""
    with Engine(never_stopping(converted, tmp_path, silent=True), threads=2) as engine:
        result = engine.synthesize("Hi.", voice, greedy=True, max_frames=60).result()
    assert result.codes.shape[0] == 60 and result.runaway == ()


def test_the_command_line_says_what_the_watchdog_did(converted, tmp_path, cli_env):
    import subprocess
    import sys
    from conftest import fixture_dir
    model = never_stopping(converted, tmp_path)
    out = tmp_path / "o.wav"
    proc = subprocess.run([sys.executable, "-m", "vocable", "say", "--model", str(model), "--ref",
                           str(fixture_dir("0.6b") / "reference" / "ref_24k.wav"), "--text", "Hello there.",
                           "--seed", "3", "--out", str(out)], env=cli_env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "warning: the watchdog stopped a runaway: segment 1 did not end by itself" in proc.stderr
    assert "stopped at the frame cap" not in proc.stderr and out.exists()

