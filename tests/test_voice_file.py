"""Voice files: round trip, and refusal of anything that is not a Vocable voice."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from vocable import Voice, VoiceError


def make_voice(**kw):
    args = dict(speaker_embedding=np.arange(12, dtype=np.float32), codes=np.arange(32, dtype=np.int32).reshape(2, 16),
                ref_text="Hello there.", name="Ada", model_variant="0.6B", reference_seconds=3.0)
    args.update(kw)
    return Voice(**args)


def test_round_trip(tmp_path):
    v = make_voice()
    path = v.save(tmp_path / "ada.voice")
    w = Voice.load(path)
    np.testing.assert_array_equal(w.speaker_embedding, v.speaker_embedding)
    np.testing.assert_array_equal(w.codes, v.codes)
    assert (w.ref_text, w.name, w.model_variant, w.reference_seconds) == ("Hello there.", "Ada", "0.6B", 3.0)
    assert not list(tmp_path.glob("*.tmp"))


def test_round_trip_without_transcript(tmp_path):
    w = Voice.load(make_voice(ref_text=None, codes=None).save(tmp_path / "v.voice"))
    assert w.ref_text is None and w.codes is None


def test_missing(tmp_path):
    with pytest.raises(VoiceError, match="not found"):
        Voice.load(tmp_path / "none.voice")


def test_pickle_is_refused(tmp_path):
    path = tmp_path / "evil.voice"
    path.write_bytes(pickle.dumps({"speaker_embedding": np.zeros(3)}))
    with pytest.raises(VoiceError, match="not a Vocable voice file"):
        Voice.load(path)


def test_other_safetensors_refused(tmp_path):
    from safetensors.numpy import save_file
    path = tmp_path / "other.safetensors"
    save_file({"x": np.zeros(3, dtype=np.float32)}, str(path))
    with pytest.raises(VoiceError, match="not a Vocable voice"):
        Voice.load(path)


def test_truncated(tmp_path):
    path = make_voice().save(tmp_path / "v.voice")
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(VoiceError):
        Voice.load(path)


def test_load_is_the_checked_reader(tmp_path):
    """Voice.load refuses every damaged or hostile file the library refuses, with the same
    message (it had no size cap and no type, range or NaN checks, and bad metadata gave a traceback)."""
    from test_library import _hostile_files
    for path, message in _hostile_files(tmp_path):
        with pytest.raises(VoiceError, match=message):
            Voice.load(path)


def test_save_refuses_what_load_would_refuse(tmp_path):
    codes = np.arange(32, dtype=np.int32).reshape(2, 16)
    codes[0, 0] = 2048
    for voice, message in ((make_voice(codes=codes), "out of range"),
                           (make_voice(speaker_embedding=np.full(12, np.nan, np.float32)), "NaN"),
                           (make_voice(codes=np.zeros((2, 8), np.int32)), "reference codes of shape")):
        with pytest.raises(VoiceError, match=message):
            voice.save(tmp_path / "v.voice")
        assert list(tmp_path.iterdir()) == []
