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
    with pytest.raises(VoiceError, match="not a readable voice file"):
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
