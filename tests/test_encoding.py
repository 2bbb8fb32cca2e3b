"""The stream encoder (audio/encoding.py) and the tempo change (audio/tempo.py) of the speech API."""
from __future__ import annotations

import io
import os

import numpy as np
import pytest
import soundfile as sf

from vocable.audio.encoding import FORMATS, StreamEncoder
from vocable.audio.tempo import TempoStretch
from vocable.errors import AudioError

RATE = 24000


def tone(seconds=2.0, hz=180.0):
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.5 * np.sin(2 * np.pi * hz * t) * (1 + 0.3 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)


def stretched(speed, x, piece=None):
    s = TempoStretch(speed, RATE)
    if piece is None:
        return np.concatenate([s.feed(x), s.finish()])
    rng = np.random.default_rng(piece)
    parts, i = [], 0
    while i < x.size:
        n = int(rng.integers(1, 4000))
        parts.append(s.feed(x[i:i + n]))
        i += n
    return np.concatenate(parts + [s.finish()])


@pytest.mark.parametrize("speed", [0.25, 0.5, 0.8, 1.0, 1.25, 2.0, 4.0])
def test_tempo_keeps_the_pitch_and_scales_the_length(speed):
    x = tone()
    y = stretched(speed, x)
    assert y.size == int(np.ceil(x.size / speed))
    middle = y[2000:-2000] * np.hanning(y.size - 4000)
    peak = np.argmax(np.abs(np.fft.rfft(middle))) * RATE / middle.size
    assert abs(peak - 180.0) < 3.0, peak
    assert 0.4 < np.abs(y).max() < 0.7      # no doubling or loss where frames overlap


@pytest.mark.parametrize("speed", [0.5, 1.5, 3.0])
def test_tempo_streamed_in_any_pieces_is_the_same(speed):
    x = tone(1.3)
    whole = stretched(speed, x)
    assert np.array_equal(stretched(speed, x, piece=1), whole)
    assert np.array_equal(stretched(speed, x, piece=2), whole)


def test_tempo_refuses_speeds_outside_openais_range():
    for speed in (0.2, 4.5, float("nan")):
        with pytest.raises(ValueError, match="0.25 to 4.0"):
            TempoStretch(speed, RATE)


def encode(fmt, x, piece=3000):
    with StreamEncoder(fmt, RATE) as encoder:
        parts = [encoder.feed(x[i:i + piece]) for i in range(0, x.size, piece)]
        parts.append(encoder.finish())
    return parts


@pytest.mark.parametrize("fmt", ["wav", "mp3", "opus", "flac"])
def test_encoded_streams_read_back_with_libsndfile(fmt):
    x = tone(2.5)
    parts = encode(fmt, x)
    audio, rate = sf.read(io.BytesIO(b"".join(parts)), dtype="float32")
    lossy = fmt in ("mp3", "opus")
    assert abs(audio.size / rate - x.size / RATE) < (0.1 if lossy else 1e-9)
    if fmt in ("wav", "mp3"):          # sent as they are made, not held to the end
        assert sum(1 for p in parts[:-1] if p) > len(parts) // 2
    if fmt == "flac":                  # whole, so that its header has the length
        assert not any(parts[:-1])


def test_every_format_is_known_and_others_are_refused():
    assert set(FORMATS) == {"mp3", "opus", "aac", "flac", "wav", "pcm"}
    with pytest.raises(AudioError, match="unknown audio format 'ogg'"):
        StreamEncoder("ogg", RATE)


def test_encoders_leave_no_pipe_or_thread_behind():
    """A cancelled response closes its encoder mid-stream; nothing is left open."""
    import threading
    before = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    threads = threading.active_count()
    for fmt in ("mp3", "opus"):
        for _ in range(20):
            encoder = StreamEncoder(fmt, RATE)
            encoder.feed(tone(0.3))
            encoder.close()
            encoder.close()
    if before is not None:
        assert len(os.listdir("/proc/self/fd")) == before
    assert threading.active_count() == threads
