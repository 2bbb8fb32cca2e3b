"""Reference audio in: any rate and channel count, and a clear error for every bad input."""
from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from conftest import cosine, reference
from vocable import AudioError, Engine
from vocable.audio_io import prepare_reference, read_audio


@pytest.fixture(scope="module")
def engine(converted):
    with Engine(converted("0.6b", "f32"), threads=2) as e:
        yield e


@pytest.fixture(scope="module")
def clip():
    return reference("0.6b", "ref_wav_24k")


def test_any_rate_and_channels(engine, clip, tmp_path):
    import soxr
    base = engine.embed_voice(clip, 24000)
    stereo_44k = soxr.resample(clip, 24000, 44100)
    stereo_44k = np.stack([stereo_44k, 0.5 * stereo_44k], axis=1)
    path = tmp_path / "stereo.flac"
    sf.write(path, stereo_44k, 44100)
    samples, rate = read_audio(path)
    assert samples.shape[1] == 2 and rate == 44100
    voice = engine.embed_voice(samples, rate)
    assert "mixed 2 channels down to mono" in voice.warnings
    # resampled, attenuated mono of the same speech: the same speaker
    assert cosine(voice.speaker_embedding, base.speaker_embedding) > 0.95
    assert voice.codes.shape == base.codes.shape


@pytest.mark.parametrize("fmt,subtype", [("WAV", "PCM_16"), ("FLAC", "PCM_24"), ("OGG", "VORBIS"), ("MP3", None)])
def test_reads_common_formats(tmp_path, clip, fmt, subtype):
    path = tmp_path / f"clip.{fmt.lower()}"
    try:
        sf.write(path, clip, 24000, format=fmt, subtype=subtype)
    except (sf.LibsndfileError, TypeError, ValueError) as e:
        pytest.skip(f"this libsndfile cannot write {fmt}: {e}")
    samples, rate = read_audio(path)
    assert rate == 24000 and abs(samples.shape[0] - clip.shape[0]) < 2400


def test_missing_file(tmp_path):
    with pytest.raises(AudioError, match="not found"):
        read_audio(tmp_path / "nope.wav")


def test_empty_file(tmp_path):
    (tmp_path / "empty.wav").write_bytes(b"")
    with pytest.raises(AudioError, match="empty"):
        read_audio(tmp_path / "empty.wav")


@pytest.mark.parametrize("content", [b"RIFF\x00\x00\x00\x00WAVEfmt garbage", b"this is not audio at all" * 10,
                                     bytes(range(256)) * 4])
def test_corrupt_or_unsupported_file(tmp_path, content):
    path = tmp_path / "bad.wav"
    path.write_bytes(content)
    with pytest.raises(AudioError, match="not a readable audio file"):
        read_audio(path)


def test_zero_samples(tmp_path):
    path = tmp_path / "zero.wav"
    sf.write(path, np.zeros(0, dtype=np.float32), 24000)
    with pytest.raises(AudioError, match="no audio samples"):
        read_audio(path)


def test_too_short(engine):
    with pytest.raises(AudioError, match="at least 1 s"):
        engine.embed_voice(np.zeros(16000, dtype=np.float32), 24000)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_samples(engine, clip, bad):
    x = clip.copy()
    x[1000] = bad
    with pytest.raises(AudioError, match="NaN or infinite"):
        engine.embed_voice(x, 24000)


def test_too_long_is_trimmed(engine, clip):
    long = np.tile(clip, 25)  # 75 s
    voice = engine.embed_voice(long, 24000)
    assert any("first 60 s" in w for w in voice.warnings)
    assert voice.reference_seconds == pytest.approx(60.0)
    assert voice.codes.shape[0] == 60 * 24000 // 1920


def test_bad_sample_rate(clip):
    with pytest.raises(AudioError, match="sample rate"):
        prepare_reference(clip, 0)


def test_engine_rejects_what_python_would_not_send(engine, clip):
    """The native layer checks too: a direct call with NaN or a short clip is refused."""
    from vocable import _engine
    ctx = engine._ctx
    with pytest.raises(_engine.EngineError, match="non-finite"):
        ctx.extract_voice_ref(np.full(24000, np.nan, dtype=np.float32))
    with pytest.raises(_engine.EngineError, match="1 to 60 s"):
        ctx.extract_voice_ref(np.zeros(100, dtype=np.float32))
