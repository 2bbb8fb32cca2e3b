"""Reference audio in: any rate and channel count, and a clear error for every bad input."""
from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from conftest import cosine
from vocable import AudioError
from vocable.audio.files import prepare_reference, read_audio


def test_any_rate_and_channels(engine, reference_clip, tmp_path):
    import soxr
    base = engine.embed_voice(reference_clip, 24000)
    stereo_44k = soxr.resample(reference_clip, 24000, 44100)
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
def test_reads_common_formats(tmp_path, reference_clip, fmt, subtype):
    path = tmp_path / f"clip.{fmt.lower()}"
    try:
        sf.write(path, reference_clip, 24000, format=fmt, subtype=subtype)
    except (sf.LibsndfileError, TypeError, ValueError) as e:
        pytest.skip(f"this libsndfile cannot write {fmt}: {e}")
    samples, rate = read_audio(path)
    assert rate == 24000 and abs(samples.shape[0] - reference_clip.shape[0]) < 2400


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
def test_non_finite_samples(engine, reference_clip, bad):
    x = reference_clip.copy()
    x[1000] = bad
    with pytest.raises(AudioError, match="NaN or infinite"):
        engine.embed_voice(x, 24000)


def test_too_long_is_trimmed(engine, reference_clip):
    long = np.tile(reference_clip, 25)  # 75 s
    voice = engine.embed_voice(long, 24000)
    assert any("first 60 s" in w for w in voice.warnings)
    assert voice.reference_seconds == pytest.approx(60.0)
    assert voice.codes.shape[0] == 60 * 24000 // 1920


def test_bad_sample_rate(reference_clip):
    with pytest.raises(AudioError, match="sample rate"):
        prepare_reference(reference_clip, 0)


def test_engine_rejects_what_python_would_not_send(engine, reference_clip):
    """The native layer checks too: a direct call with NaN or a short reference_clip is refused."""
    from vocable import _engine
    ctx = engine._ctx
    with pytest.raises(_engine.EngineError, match="non-finite"):
        ctx.extract_voice_ref(np.full(24000, np.nan, dtype=np.float32))
    with pytest.raises(_engine.EngineError, match="1 to 60 s"):
        ctx.extract_voice_ref(np.zeros(100, dtype=np.float32))


# -- long files: read only as far as a reference keeps -------------------------------------------------

def write_noise(path, minutes: float, rate: int = 48000, level: float = 0.05):
    """Minutes of low-level white noise as 16-bit WAV, written a minute at a time."""
    rng = np.random.default_rng(1)
    with sf.SoundFile(path, "w", rate, 1, "PCM_16") as f:
        for _ in range(int(minutes)):
            f.write((level * rng.standard_normal(60 * rate)).astype(np.float32))


def test_a_long_reference_is_read_only_as_far_as_it_is_kept(tmp_path):
    """A 20-minute reference was read whole (372 MB) to keep its first 60 s. Now only the first
    90 s (60 s kept, after up to 30 s of leading silence) are decoded, and the clone gets the
    same audio as from the whole file."""
    import tracemalloc

    from vocable.audio.files import MAX_REFERENCE_SECONDS, REFERENCE_LEAD_SECONDS, read_reference
    from vocable.audio.reference import check_reference

    path = tmp_path / "long.wav"
    write_noise(path, minutes=10)
    whole, rate = sf.read(path, dtype="float32", always_2d=True)   # as before: 115 MB of samples
    tracemalloc.start()
    try:
        samples, rate, seconds = read_reference(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rate == 48000 and seconds == pytest.approx(600.0)
    assert samples.shape == (int((MAX_REFERENCE_SECONDS + REFERENCE_LEAD_SECONDS) * rate), 1)
    assert peak < 1.2 * samples.nbytes and peak < whole.nbytes / 5
    np.testing.assert_array_equal(samples, whole[:samples.shape[0]])
    # what a clone keeps is the same: the command line's (untrimmed) and the app's (trimmed)
    np.testing.assert_allclose(prepare_reference(samples, rate).samples, prepare_reference(whole, rate).samples,
                               atol=1e-6)
    for trim in (False, True):
        new, old = check_reference(samples, rate, trim, source_seconds=seconds), check_reference(whole, rate, trim)
        np.testing.assert_allclose(new.samples, old.samples, atol=1e-6)
        assert new.warnings == old.warnings and any("600.0 s long" in w for w in new.warnings)


def test_a_header_that_lies_about_its_length_allocates_nothing_huge(tmp_path):
    """A FLAC whose header claims 2^36 samples (a day at 8 kHz is far less) once made the reader
    allocate them all: a MemoryError, or the machine's memory."""
    import io
    import tracemalloc

    from vocable.audio.files import read_reference

    encoded = io.BytesIO()
    sf.write(encoded, np.zeros(48000, np.float32), 48000, format="FLAC")
    data = bytearray(encoded.getvalue())
    streaminfo = 8  # after "fLaC" and the block header: 20 bits of rate, 3 + 5 of format, 36 of length
    fields = int.from_bytes(data[streaminfo + 10:streaminfo + 18], "big") | ((1 << 36) - 1)
    data[streaminfo + 10:streaminfo + 18] = fields.to_bytes(8, "big")
    path = tmp_path / "lying.flac"
    path.write_bytes(bytes(data))
    tracemalloc.start()
    try:
        with pytest.raises(AudioError, match="more than Vocable reads"):
            read_audio(path)
        with pytest.raises(AudioError, match="lying.flac"):
            read_reference(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20


def crafted_wav(rate=24000, channels=1, bits=16, data_bytes=4800, declared=None) -> bytes:
    """A PCM WAV file written by hand, with whatever its header should not say."""
    import struct
    block = (channels * bits // 8) & 0xFFFF
    fmt = struct.pack("<HHIIHH", 1, channels, rate & 0xFFFFFFFF, (rate * block) & 0xFFFFFFFF, block, bits)
    body = (b"WAVEfmt " + struct.pack("<I", 16) + fmt + b"data"
            + struct.pack("<I", data_bytes if declared is None else declared) + b"\x01\x00" * (data_bytes // 2))
    return b"RIFF" + struct.pack("<I", len(body)) + body


@pytest.mark.parametrize("content, message", [
    (crafted_wav(rate=0), "not a readable audio file"),
    (crafted_wav(rate=1), "unsupported sample rate of 1 Hz"),
    (crafted_wav(rate=2_000_000_000), "unsupported sample rate of 2000000000 Hz"),
    (crafted_wav(rate=0xFFFFFFFF), "not a readable audio file"),
    (crafted_wav(channels=0), "not a readable audio file"),
    (crafted_wav(channels=100, data_bytes=100 * 2 * 48), "100 channels"),
    (crafted_wav(channels=65535), "not a readable audio file"),
    (crafted_wav(bits=0), "not a readable audio file"),
    (crafted_wav(data_bytes=0), "no audio samples"),
    (crafted_wav()[:30], "not a readable audio file"),
])
def test_crafted_headers_are_clear_errors(tmp_path, content, message):
    from vocable.audio.files import read_reference
    path = tmp_path / "crafted.wav"
    path.write_bytes(content)
    for read in (read_audio, read_reference):
        with pytest.raises(AudioError, match=message):
            read(path)


def test_a_data_chunk_longer_than_the_file_reads_what_is_there(tmp_path):
    path = tmp_path / "long-header.wav"
    path.write_bytes(crafted_wav(declared=0xFFFFFFF0))
    samples, rate = read_audio(path)
    assert samples.shape == (2400, 1) and rate == 24000


def test_a_fifo_or_device_is_refused_without_blocking(tmp_path):
    import os
    fifo = tmp_path / "reference.wav"
    os.mkfifo(fifo)
    for path in (fifo, "/dev/zero"):
        with pytest.raises(AudioError, match="not a regular file"):
            read_audio(path)
