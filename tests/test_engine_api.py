"""The Python engine API: model info, log forwarding, the GIL, errors of the native layer, and
streaming synthesis (chunks, result, cancel, files, decode)."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import reference
from vocable import AudioError, Engine, ModelError, SynthesisCancelled, VocableError, Voice, _engine


def test_versions_and_abi():
    assert _engine.abi_min_version() <= _engine.abi_version()
    assert _engine.ABI_VERSION == _engine.abi_version()
    assert _engine.version() == _engine.__version__
    assert _engine.ggml_version().startswith("0.")


@pytest.mark.parametrize("variant,variant_name", [("0.6b", "0.6B"), ("1.7b", "1.7B")])
def test_model_info(converted, variant, variant_name):
    with Engine(converted(variant, "f32"), threads=1) as engine:
        info = engine.info
    assert info["variant"] == variant_name
    assert info["sample_rate"] == 24000 and info["samples_per_frame"] == 1920
    assert info["n_codebooks"] == 16 and info["codebook_size"] == 2048
    assert info["n_speaker_embd"] == info["talker_hidden"]
    assert info["weight_type"] == "f32"
    assert info["codec_chunk_frames"] == round(_engine.DEFAULT_CODEC_CHUNK_SEC * 12.5)


def test_codec_chunk_width(converted):
    with Engine(converted("0.6b", "f32"), threads=1, codec_chunk_sec=0.8) as engine:
        assert engine.info["codec_chunk_frames"] == 10
    with pytest.raises(ValueError, match="codec_chunk_sec"):
        Engine(converted("0.6b", "f32"), codec_chunk_sec=0)


def test_perf_lines_reach_python_logging(converted, caplog):
    with caplog.at_level(logging.INFO, logger="vocable.engine"):
        with Engine(converted("0.6b", "f32"), threads=2) as engine:
            engine.embed_voice(reference("0.6b", "ref_wav_24k"), 24000)
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "vocable.engine")
    assert "[Perf] model load" in text
    assert "[Perf] speaker embedding" in text and "reference codes" in text


def test_generation_perf_lines(converted, caplog):
    from vocable import Voice
    voice = Voice(reference("0.6b", "speaker_embedding"))
    with caplog.at_level(logging.INFO, logger="vocable.engine"):
        with Engine(converted("0.6b", "f32"), threads=2) as engine:
            engine.synthesize("Hello world.", voice, greedy=True, max_frames=5).result()
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "vocable.engine")
    for part in ("[Perf] prompt build", "prefill", "time to first frame", "talker", "ms/frame", "code predictor",
                 "[Perf] stream", "real-time factor", "first audio after"):
        assert part in text


def test_gil_is_released_while_computing(converted):
    """Another Python thread keeps running while the engine embeds a long clip."""
    clip = np.tile(reference("0.6b", "ref_wav_24k"), 20)  # 60 s
    ticks = []
    done = threading.Event()

    def ticker():
        while not done.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    with Engine(converted("0.6b", "f32"), threads=1) as engine:
        t = threading.Thread(target=ticker)
        t.start()
        start = time.perf_counter()
        engine.embed_voice(clip, 24000)
        elapsed = time.perf_counter() - start
        done.set()
        t.join()
    during = [x for x in ticks if start <= x <= start + elapsed]
    assert elapsed > 0.02
    assert len(during) >= 5, f"only {len(during)} ticks in {elapsed:.3f} s"


def test_closed_engine_refuses_work(converted):
    engine = Engine(converted("0.6b", "f32"), threads=1)
    engine.close()
    with pytest.raises(ValueError, match="closed"):
        engine.embed_voice(reference("0.6b", "ref_wav_24k"), 24000)


def test_folder_instead_of_model(tmp_path):
    with pytest.raises(ModelError, match="convert it first"):
        Engine(tmp_path)


def test_bad_thread_count(converted):
    with pytest.raises(ValueError, match="threads"):
        Engine(converted("0.6b", "f32"), threads=0)


def test_concurrent_calls_are_serialised(converted):
    """Two Python threads sharing one Engine get the same, correct results."""
    clip = reference("0.6b", "ref_wav_24k")
    with Engine(converted("0.6b", "f32"), threads=1) as engine:
        expected = engine.embed_voice(clip, 24000)
        results = []

        def work():
            for _ in range(3):
                results.append(engine.embed_voice(clip, 24000))

        threads = [threading.Thread(target=work) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(results) == 9
    for v in results:
        np.testing.assert_array_equal(v.codes, expected.codes)
        np.testing.assert_allclose(v.speaker_embedding, expected.speaker_embedding, rtol=0, atol=1e-6)


# -- streaming synthesis ---------------------------------------------------------------------------

TEXT = "Hello world, this is a test."


def snr_db(signal: np.ndarray, residual: np.ndarray) -> float:
    return 10 * np.log10(np.sum(signal.astype(np.float64) ** 2) / max(np.sum(residual.astype(np.float64) ** 2), 1e-30))


def test_stream_chunks_join_to_the_result(engine, voice):
    frames = 60
    with engine.synthesize(TEXT, voice, greedy=True, max_frames=frames) as stream:
        chunks = list(stream.chunks())
        result = stream.result()
    spf = engine.info["samples_per_frame"]
    # the header's schedule: one frame, then twice as many each time up to the codec chunk
    cap = engine.info["codec_chunk_frames"]
    sizes, n = [], 1
    while sum(sizes) < frames:
        sizes.append(min(n, cap, frames - sum(sizes)))
        n *= 2
    assert [c.codes.shape[0] for c in chunks] == sizes
    assert [c.first_frame for c in chunks] == list(np.cumsum([0] + sizes[:-1]))
    assert all(c.audio.dtype == np.float32 and c.audio.size == c.codes.shape[0] * spf for c in chunks)
    assert [c.first_sample for c in chunks] == [c.first_frame * spf for c in chunks]
    # joined, the chunks are the whole audio, exactly; their codes are the result's codes
    np.testing.assert_array_equal(np.concatenate([c.audio for c in chunks]), result.audio)
    np.testing.assert_array_equal(np.concatenate([c.codes for c in chunks]), result.codes)
    assert result.audio.dtype == np.float32 and result.audio.shape == (frames * spf,)
    assert result.sample_rate == 24000 and result.seconds == pytest.approx(frames / 12.5)
    assert result.codes.shape == (frames, 16) and not result.reached_eos and result.segments == (TEXT,)
    assert np.all(np.isfinite(result.audio)) and 0 < np.abs(result.audio).max() <= 1.0
    assert 0 < result.time_to_first_audio < result.wall_time
    assert result.real_time_factor == pytest.approx(result.wall_time / result.seconds)
    p = stream.progress
    assert p.done and p.frames == frames and p.audio_seconds == pytest.approx(result.seconds)
    assert p.time_to_first_audio == pytest.approx(result.time_to_first_audio)


def test_iterating_yields_float32_audio(engine, voice):
    stream = engine.synthesize(TEXT, voice, greedy=True, max_frames=8)
    audio = list(stream)
    assert all(isinstance(a, np.ndarray) and a.dtype == np.float32 and a.ndim == 1 for a in audio)
    np.testing.assert_array_equal(np.concatenate(audio), stream.result().audio)
    np.testing.assert_array_equal(np.concatenate(list(stream)), stream.result().audio)  # a second pass


def test_stream_equals_buffered_decode(engine, voice):
    result = engine.synthesize(TEXT, voice, greedy=True, max_frames=40).result()
    whole = engine.decode(result.codes)
    assert whole.shape == result.audio.shape
    assert snr_db(whole, result.audio - whole) >= 80


def test_first_chunk_before_the_end(engine, voice):
    """The consumer gets the first frame's audio while the engine is still generating."""
    with engine.synthesize(TEXT, voice, max_frames=4000) as stream:
        it = iter(stream)
        first = next(it)
        progress = stream.progress
        assert first.size == engine.info["samples_per_frame"]
        assert not progress.done and progress.frames < 4000 and progress.real_time_factor is not None
        assert progress.time_to_first_audio is not None and progress.time_to_first_audio <= progress.elapsed
        stream.cancel()
    with pytest.raises(SynthesisCancelled):
        stream.result()


def test_seed_reproduces_audio(engine, voice):
    a = engine.synthesize(TEXT, voice, seed=42, max_frames=10).result()
    b = engine.synthesize(TEXT, voice, seed=42, max_frames=10).result()
    c = engine.synthesize(TEXT, voice, max_frames=10).result()
    np.testing.assert_array_equal(a.audio, b.audio)
    assert a.seed == 42 and isinstance(c.seed, int) and c.seed != 42


def test_cancel_mid_stream(engine, voice):
    stream = engine.synthesize(TEXT, voice, max_frames=4000)
    it = stream.chunks()
    next(it)
    start = time.perf_counter()
    stream.cancel()
    with pytest.raises(SynthesisCancelled):
        for _ in it:
            pass
    assert time.perf_counter() - start < 2.0
    with pytest.raises(SynthesisCancelled):
        stream.result()
    assert stream.progress.frames < 4000
    # the engine stays usable
    assert engine.synthesize("Hello.", voice, greedy=True, max_frames=3).result().codes.shape == (3, 16)


def test_engine_cancel_stops_the_stream(engine, voice):
    stream = engine.synthesize(TEXT, voice, max_frames=4000)
    next(iter(stream))
    engine.cancel()
    with pytest.raises(SynthesisCancelled):
        stream.result(timeout=5)
    assert engine.synthesize("Hello.", voice, greedy=True, max_frames=2).result().audio.size == 2 * 1920


def test_leaving_the_stream_cancels_it(engine, voice):
    start = time.perf_counter()
    with engine.synthesize(TEXT, voice, max_frames=4000) as stream:
        next(iter(stream))
    assert stream.done and time.perf_counter() - start < 5.0
    with pytest.raises(SynthesisCancelled):
        stream.result()


def test_streams_queue_on_one_engine(engine, voice):
    """A second stream waits for the first (one context computes one request at a time)."""
    a = engine.synthesize(TEXT, voice, greedy=True, max_frames=20)
    b = engine.synthesize(TEXT, voice, greedy=True, max_frames=20)
    ra, rb = a.result(), b.result()
    np.testing.assert_array_equal(ra.audio, rb.audio)


def test_gil_is_released_while_streaming(engine, voice):
    ticks = []
    stream = engine.synthesize(TEXT, voice, greedy=True, max_frames=80)
    while not stream.done:
        ticks.append(time.perf_counter())
        time.sleep(0.001)
    assert len(ticks) >= 20
    stream.result()


def test_engine_errors_reach_the_consumer(engine, voice):
    # in-context reference codes with the wrong number of codebooks: refused by the engine
    bad = Voice(voice.speaker_embedding, np.zeros((10, 8), dtype=np.int32), "Okay.")
    stream = engine.synthesize(TEXT, bad, max_frames=5)
    with pytest.raises(VocableError, match="cannot synthesize"):
        list(stream)
    with pytest.raises(VocableError, match="cannot synthesize"):
        stream.result()


def test_argument_errors_are_raised_at_once(engine, voice):
    from vocable.engine.text import TextError
    with pytest.raises(TextError):
        engine.synthesize("  \n ", voice)
    with pytest.raises(VocableError, match="unknown language 'klingon'"):
        engine.synthesize(TEXT, voice, language="klingon")
    with pytest.raises(VocableError, match="another model size"):
        engine.synthesize(TEXT, Voice(np.zeros(voice.speaker_embedding.size + 4, dtype=np.float32)))
    with pytest.raises(ValueError, match="max_frames"):
        engine.synthesize(TEXT, voice, max_frames=0)
    assert "english" in engine.languages and "chinese" in engine.languages
    engine.synthesize(TEXT, voice, language="English", greedy=True, max_frames=2).result()


@pytest.mark.parametrize("suffix,subtype", [(".wav", "PCM_16"), (".flac", "PCM_16"), (".ogg", "VORBIS")])
def test_synthesize_to_file(engine, voice, tmp_path, suffix, subtype):
    import soundfile as sf
    path = tmp_path / f"out{suffix}"
    result = engine.synthesize_to_file(TEXT, voice, path, greedy=True, max_frames=12)
    info = sf.info(str(path))
    assert info.samplerate == 24000 and info.channels == 1 and info.subtype == subtype
    data, rate = sf.read(str(path), dtype="float32")
    assert data.shape == result.audio.shape
    if subtype == "PCM_16":
        np.testing.assert_allclose(data, result.audio, atol=1.0 / 32768 + 1e-6)
    else:
        assert snr_db(result.audio, data - result.audio) > 10
    assert not list(tmp_path.glob("*.tmp"))


def test_synthesize_to_file_errors(engine, voice, tmp_path):
    with pytest.raises(AudioError, match="unknown audio file type '.mp4'"):
        engine.synthesize_to_file(TEXT, voice, tmp_path / "out.mp4", max_frames=2)
    with pytest.raises(AudioError, match="does not exist"):
        engine.synthesize_to_file(TEXT, voice, tmp_path / "none" / "out.wav", max_frames=2)


def test_decode(engine, voice):
    codes = reference("0.6b", "ref_codes")
    whole = engine.decode(codes)
    assert whole.dtype == np.float32 and whole.shape == (codes.shape[0] * 1920,)
    for width in (1, 7, codes.shape[0]):
        part = engine.decode(codes, chunk_frames=width)
        assert snr_db(whole, part - whole) >= 50, width
    with pytest.raises(ValueError, match="codes must be"):
        engine.decode(codes[:, :8])
    with pytest.raises(VocableError, match="cannot decode"):
        engine.decode(np.full((2, 16), 5000, dtype=np.int32))


def test_closed_engine_refuses_synthesis(converted, voice):
    engine = Engine(converted("0.6b", "f32"), threads=1)
    engine.close()
    with pytest.raises(ValueError, match="closed"):
        engine.synthesize(TEXT, voice)


def test_native_chunk_callback(engine, voice):
    """_engine.Context.synthesize: on_chunk gets (first_frame, codes, pcm); False stops with
    STATUS_CANCELLED; an exception in it comes out of synthesize() as itself; the CancelFlag
    stops it from another thread."""
    ctx = engine._ctx
    ids = np.asarray(engine.tokenizer.target_prompt(TEXT).ids, dtype=np.int32)
    greedy = {"temperature": 0.0}
    seen = []
    codes, pcm, eos = ctx.synthesize(ids, voice.speaker_embedding, None, None, "auto", greedy, greedy, 0, 7,
                                     lambda f, c, p: seen.append((f, c.copy(), p.copy())))
    assert [f for f, _, _ in seen] == [0, 1, 3] and not eos
    np.testing.assert_array_equal(np.concatenate([c for _, c, _ in seen]), codes)
    np.testing.assert_array_equal(np.concatenate([p for _, _, p in seen]), pcm)
    assert pcm.dtype == np.float32 and pcm.shape == (7 * 1920,)

    with pytest.raises(_engine.EngineError) as e:
        ctx.synthesize(ids, voice.speaker_embedding, None, None, "auto", {}, {}, 0, 50, lambda f, c, p: f < 2)
    assert e.value.args[1] == _engine.STATUS_CANCELLED

    def boom(f, c, p):
        raise KeyError("from the callback")
    with pytest.raises(KeyError, match="from the callback"):
        ctx.synthesize(ids, voice.speaker_embedding, None, None, "auto", {}, {}, 0, 50, boom)
    with pytest.raises(TypeError):
        ctx.synthesize(ids, voice.speaker_embedding, None, None, "auto", {}, {}, 0, 50, lambda f, c, p: "yes")

    flag = _engine.CancelFlag()
    timer = threading.Timer(0.05, flag.set)
    timer.start()
    with pytest.raises(_engine.EngineError) as e:
        ctx.synthesize(ids, voice.speaker_embedding, None, None, "auto", {}, {}, 0, 8000, None, flag)
    timer.join()
    assert e.value.args[1] == _engine.STATUS_CANCELLED and flag.is_set()
    assert ctx.synthesize(ids, voice.speaker_embedding, None, None, "auto", greedy, greedy, 0, 2)[0].shape == (2, 16)


def test_reference_codes_outside_the_codebook_are_refused_at_once(engine, voice):
    """Codebook-0 codes of 2048 to 3071 (the talker's control ids) once aborted the engine."""
    codes = np.zeros((10, 16), dtype=np.int32)
    codes[:, 0] = 2048 + np.arange(10)
    with pytest.raises(VocableError, match="out of range"):
        engine.synthesize(TEXT, Voice(voice.speaker_embedding, codes, "Okay."))
    codes[:, 0] = -1
    with pytest.raises(VocableError, match="out of range"):
        engine.synthesize(TEXT, Voice(voice.speaker_embedding, codes, "Okay."))
    codes[:, 0] = 2047
    engine.synthesize(TEXT, Voice(voice.speaker_embedding, codes, "Okay."), greedy=True, max_frames=2).result()


def _mapped_files() -> str:
    with open("/proc/self/maps") as f:
        return f.read()


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux's /proc/self/maps")
def test_the_weights_are_mapped_from_the_file_and_unmapped_at_close(converted, caplog):
    """A synthesis holds only the pages its graphs read (not the encoders, not most of the text
    embedding); the file is let go when the engine closes."""
    path = converted("0.6b", "q8_0")
    with caplog.at_level(logging.INFO, logger="vocable.engine"):
        with Engine(path, threads=1) as engine:
            assert str(path) in _mapped_files()
            engine.synthesize("Hello world.", Voice(reference("0.6b", "speaker_embedding")), greedy=True,
                              max_frames=3).result()
    assert str(path) not in _mapped_files()
    assert "of weights (mapped)" in "\n".join(r.getMessage() for r in caplog.records)


def test_weights_read_instead_of_mapped_give_the_same_audio(converted, monkeypatch, caplog):
    path, voice = converted("0.6b", "q8_0"), Voice(reference("0.6b", "speaker_embedding"))
    with Engine(path, threads=1) as engine:
        mapped = engine.synthesize("Hello world.", voice, greedy=True, max_frames=4).result()
    monkeypatch.setenv("VOCABLE_NO_MMAP", "1")
    with caplog.at_level(logging.INFO, logger="vocable.engine"):
        with Engine(path, threads=1) as engine:
            assert str(path) not in _mapped_files()
            read = engine.synthesize("Hello world.", voice, greedy=True, max_frames=4).result()
    assert "of weights (read)" in "\n".join(r.getMessage() for r in caplog.records)
    assert np.array_equal(mapped.codes, read.codes) and np.array_equal(mapped.audio, read.audio)


# ---- the prefill cache -----------------------------------------------------------------------

def _prefill_reuse(records) -> list[tuple[int, int]]:
    """(prompt positions, positions restored from the cache) of each synthesis in the log."""
    import re
    pattern = re.compile(r"\((\d+) positions\), prefill: [\d.]+ ms \((\d+) positions from the cache\)")
    return [tuple(map(int, m.groups())) for r in records if (m := pattern.search(r.getMessage()))]


@pytest.mark.parametrize("weight_type", ["f32", "q8_0"])
@pytest.mark.parametrize("mode", ["xvec", "icl"])
def test_a_cached_prefill_gives_the_same_output_as_a_computed_one(converted, caplog, weight_type, mode):
    """The same prompt again (voice, language, text) restores its prefill from the cache, another
    text computes its own; in-context, every request after the first starts from the decoder
    state primed with the voice's reference; the output is bit for bit what a fresh engine
    computes."""
    from conftest import manifest
    path = converted("0.6b", weight_type)
    voice = Voice(reference("0.6b", "speaker_embedding"), reference("0.6b", "ref_codes"),
                  manifest("0.6b")["ref_text"] if mode == "icl" else None)
    texts = ["Hello world.", "Good morning to you.", "Hello world."]
    with caplog.at_level(logging.INFO, logger="vocable.engine"):
        with Engine(path, threads=2) as engine:
            cached = [engine.synthesize(t, voice, "English", greedy=True, max_frames=6).result() for t in texts]
    reuse = _prefill_reuse(caplog.records)
    assert reuse[0][1] == reuse[1][1] == 0 and reuse[2][1] == reuse[2][0] > 0, reuse
    # in-context: the decoder primed with the voice's reference once, its state reused for any text
    primed = [r.getMessage() for r in caplog.records if "codec decoder primed with" in r.getMessage()]
    if mode == "icl":
        assert len(primed) == 3 and [line.endswith("(its state from the cache)") for line in primed] == \
            [False, True, True], primed
    else:
        assert primed == []
    for text, got in zip(texts, cached):
        with Engine(path, threads=2) as fresh:
            want = fresh.synthesize(text, voice, "English", greedy=True, max_frames=6).result()
        assert np.array_equal(got.codes, want.codes) and np.array_equal(got.audio, want.audio), text


def test_forgotten_prompts_are_computed_again(converted, caplog):
    voice = Voice(reference("0.6b", "speaker_embedding"))
    with caplog.at_level(logging.INFO, logger="vocable.engine"):
        with Engine(converted("0.6b", "q8_0"), threads=1) as engine:
            first = engine.synthesize("Hello world.", voice, greedy=True, max_frames=4).result()
            engine.forget_prompts()
            again = engine.synthesize("Hello world.", voice, greedy=True, max_frames=4).result()
    assert [cached for _, cached in _prefill_reuse(caplog.records)] == [0, 0]
    assert np.array_equal(first.audio, again.audio)


def test_another_reference_primes_the_decoder_anew(converted, caplog):
    """The primed states are kept per reference: a voice with other reference codes (here the
    first half of them) primes its own, and each voice's audio is what a fresh engine gives it."""
    from conftest import manifest
    codes, ref_text = reference("0.6b", "ref_codes"), manifest("0.6b")["ref_text"]
    voices = [Voice(reference("0.6b", "speaker_embedding"), c, ref_text) for c in (codes, codes[: len(codes) // 2])]
    order = [0, 1, 0, 1]
    with caplog.at_level(logging.INFO, logger="vocable.engine"):
        with Engine(converted("0.6b", "q8_0"), threads=2) as engine:
            got = [engine.synthesize(f"Sentence {i}.", voices[v], "English", greedy=True, max_frames=4).result()
                   for i, v in enumerate(order)]
    primed = [r.getMessage() for r in caplog.records if "codec decoder primed with" in r.getMessage()]
    assert [line.endswith("(its state from the cache)") for line in primed] == [False, False, True, True], primed
    assert [f"with {len(voices[v].codes)} reference frames" in line for v, line in zip(order, primed)] == [True] * 4
    for i, v in enumerate(order):
        with Engine(converted("0.6b", "q8_0"), threads=2) as fresh:
            want = fresh.synthesize(f"Sentence {i}.", voices[v], "English", greedy=True, max_frames=4).result()
        assert np.array_equal(got[i].audio, want.audio), i


def test_the_primed_states_kept_are_the_last_four_references(converted, caplog):
    from conftest import manifest
    codes, ref_text = reference("0.6b", "ref_codes"), manifest("0.6b")["ref_text"]
    voices = [Voice(reference("0.6b", "speaker_embedding"), codes[: len(codes) - i], ref_text) for i in range(5)]
    order = [0, 1, 2, 3, 4, 1, 0]   # 0 has made way for 4 by then; 1 is still there
    with caplog.at_level(logging.INFO, logger="vocable.engine"):
        with Engine(converted("0.6b", "q8_0"), threads=2) as engine:
            for v in order:
                engine.synthesize("Hello.", voices[v], "English", greedy=True, max_frames=2).result()
    primed = [r.getMessage() for r in caplog.records if "codec decoder primed with" in r.getMessage()]
    assert [line.endswith("(its state from the cache)") for line in primed] == [False] * 5 + [True, False], primed


def test_forgotten_prompts_prime_the_decoder_again(converted, caplog):
    from conftest import manifest
    voice = Voice(reference("0.6b", "speaker_embedding"), reference("0.6b", "ref_codes"), manifest("0.6b")["ref_text"])
    with caplog.at_level(logging.INFO, logger="vocable.engine"):
        with Engine(converted("0.6b", "q8_0"), threads=1) as engine:
            first = engine.synthesize("Hello world.", voice, greedy=True, max_frames=4).result()
            engine.forget_prompts()
            again = engine.synthesize("Good morning.", voice, greedy=True, max_frames=4).result()
    primed = [r.getMessage() for r in caplog.records if "codec decoder primed with" in r.getMessage()]
    assert len(primed) == 2 and not any(line.endswith("(its state from the cache)") for line in primed), primed
    assert first.mode == again.mode == "in-context"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
@pytest.mark.skipif("libasan" in os.environ.get("LD_PRELOAD", ""),
                    reason="the sanitized run's malloc is AddressSanitizer's, which keeps freed blocks in quarantine")
@pytest.mark.parametrize("mapped_apart", [False, True])
def test_an_engine_process_gives_freed_large_blocks_back(converted, mapped_apart):
    """glibc raises its mmap threshold once a large block is freed, so later large blocks land in
    the heap and stay resident after free while anything above them lives. An engine keeps every
    block of 128 KiB or more in a mapping of its own instead (the control shows the difference)."""
    probe = f"""
import ctypes
from vocable import Engine

def rss_mib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) // 1024

if {mapped_apart}:
    Engine({str(converted("0.6b", "q8_0"))!r}, threads=1).close()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
libc.free(libc.malloc(1 << 20))   # by glibc's default, later 1 MiB blocks come from the heap
before = rss_mib()
blocks = [libc.malloc(1 << 20) for _ in range(32)]
for b in blocks:
    libc.memset(b, 1, 1 << 20)
for b in blocks[:-1]:   # the last one keeps the heap from being trimmed
    libc.free(b)
print(rss_mib() - before)
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    kept_mib = int(out.stdout.split()[-1])
    if mapped_apart:
        assert kept_mib <= 4, f"{kept_mib} MiB of freed blocks stayed resident"
    else:
        assert kept_mib >= 24, f"the control kept only {kept_mib} MiB: the probe no longer shows glibc's default"
