"""The history of generations: keeping, listing, replaying, exporting and deleting them."""
from __future__ import annotations

import json
import logging
import os
import time

import numpy as np
import pytest
import soundfile as sf

from vocable.audio.export import ChapterSpan
from vocable.audio.files import read_audio, write_audio
from vocable.errors import AudioError
from vocable.library.history import History, HistoryError

RATE = 24000


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("VOCABLE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def speech(seconds=1.5, freq=220.0, seed=0) -> np.ndarray:
    """A test signal with speech-like variety: a chirp with noise and an envelope."""
    t = np.arange(int(seconds * RATE)) / RATE
    rng = np.random.default_rng(seed)
    x = 0.5 * np.sin(2 * np.pi * (freq + 80 * t) * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
    return (x + 0.02 * rng.standard_normal(t.size)).astype(np.float32)


SETTINGS = {"language": "english", "temperature": np.float32(0.9), "top_k": np.int64(50), "seed": 7,
            "greedy": False, "mode": "in-context", "model": "tiny.gguf", "codes": np.arange(3)}


def test_add_list_replay_and_restart(home):
    history = History()
    assert history.root == home / "data" / "history"
    first = history.add("Hello there.", "Grandma", SETTINGS, speech(seed=1), RATE)
    time.sleep(0.01)
    second = history.add("Ünïcode — 日本語 too.", "Me", {}, speech(2.0, seed=2), RATE)
    assert first.text == "Hello there." and first.voice_name == "Grandma"
    assert first.settings == {"language": "english", "temperature": pytest.approx(0.9), "top_k": 50, "seed": 7,
                              "greedy": False, "mode": "in-context", "model": "tiny.gguf", "codes": [0, 1, 2]}
    assert first.seconds == pytest.approx(1.5) and first.sample_rate == RATE
    assert first.audio_path.suffix == ".flac" and first.audio_path.parent == history.root
    assert first.created.tzinfo is not None and second.created >= first.created
    assert [e.id for e in history.entries()] == [second.id, first.id]  # newest first

    restarted = History()
    assert [(e.id, e.text, e.settings) for e in restarted.entries()] == \
        [(e.id, e.text, e.settings) for e in history.entries()]
    audio, rate = restarted.load_audio(first.id)
    assert rate == RATE and audio.dtype == np.float32 and audio.ndim == 1
    assert np.max(np.abs(audio - speech(seed=1))) < 1e-6  # 24-bit: exact to the ear and beyond


def test_stereo_column_and_loud_audio_are_kept():
    history = History()
    loud = speech() * 3  # clipped to full scale, not wrapped
    entry = history.add("x", "v", {}, loud[:, None], RATE)
    audio, _ = history.load_audio(entry.id)
    assert audio.max() == pytest.approx(1.0, abs=1e-6) and audio.min() == pytest.approx(-1.0, abs=1e-6)


@pytest.mark.parametrize("suffix", [".wav", ".flac", ".ogg", ".opus", ".mp3"])
def test_export_in_every_format(tmp_path, suffix):
    history = History()
    entry = history.add("Export me.", "v", {}, speech(2.0), RATE)
    if suffix == ".mp3" and "MP3" not in sf.available_formats():
        with pytest.raises(AudioError, match="MP3 needs libsndfile 1.1"):
            history.export(entry.id, tmp_path / f"out{suffix}")
        return
    out = history.export(entry.id, tmp_path / f"out{suffix}")
    assert out == tmp_path / f"out{suffix}"
    data, rate = read_audio(out)
    assert rate == RATE
    x = data[:, 0]
    ref = speech(2.0)
    lossy = suffix in (".ogg", ".opus", ".mp3")
    assert abs(x.size - ref.size) < 0.05 * ref.size
    # a lossy codec may shift the audio (encoder delay, unless the decoder removes it): best lag
    lags = range(-2000, 2001) if lossy else [0]
    corr = max(np.corrcoef(x[3000 + lag:40000 + lag], ref[3000:40000])[0, 1] for lag in lags)
    assert corr > (0.99 if lossy else 0.99999), corr
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_export_into_a_folder_and_bad_destinations(tmp_path):
    history = History()
    entry = history.add("Hello, world!", "v", {}, speech(), RATE)
    out = history.export(entry.id, tmp_path)
    assert out.parent == tmp_path and out.name.startswith("hello-world-") and out.suffix == ".wav"
    with pytest.raises(AudioError, match="unknown audio file type '.mp4'"):
        history.export(entry.id, tmp_path / "x.mp4")
    with pytest.raises(AudioError, match="does not exist"):
        history.export(entry.id, tmp_path / "missing" / "x.wav")


def test_delete():
    history = History()
    a = history.add("a", "v", {}, speech(), RATE)
    b = history.add("b", "v", {}, speech(), RATE)
    history.delete(a.id)
    assert [e.id for e in history.entries()] == [b.id]
    assert not a.audio_path.exists()
    for call in (history.delete, history.load_audio, lambda i: history.export(i, a.audio_path.parent)):
        with pytest.raises(HistoryError, match="no history entry"):
            call(a.id)
    history.clear()
    assert history.entries() == [] and list(history.root.iterdir()) == []


@pytest.mark.parametrize("bad_id", ["../x", "", "20260101-000000-000000-abcdef/../../x", None])
def test_ids_are_never_paths(bad_id):
    history = History()
    for call in (history.delete, history.load_audio, history.entry):
        with pytest.raises(HistoryError, match="invalid history entry id"):
            call(bad_id)


@pytest.mark.parametrize("audio, message", [
    (np.zeros(0, np.float32), "no audio"), (np.zeros((10, 10), np.float32), "no audio"),
    (np.full(100, np.nan, np.float32), "NaN"), (np.array(["a", "b"]), "must be numbers"),
])
def test_unusable_audio_is_refused_and_nothing_is_left(audio, message):
    history = History()
    with pytest.raises(AudioError, match=message):
        history.add("text", "v", {}, audio, RATE)
    with pytest.raises(AudioError, match="sample rate"):
        history.add("text", "v", {}, speech(), 0)
    assert list(history.root.iterdir()) == []


def test_damaged_entries_are_skipped(caplog):
    history = History()
    good = history.add("good", "v", {}, speech(), RATE)
    broken = [history.add(f"broken {i}", "v", {}, speech(), RATE) for i in range(7)]
    (history.root / f"{broken[0].id}.json").write_text("{not json")
    broken[1].audio_path.unlink()
    record = json.loads((history.root / f"{broken[2].id}.json").read_text())
    (history.root / f"{broken[2].id}.json").write_text(json.dumps({**record, "settings": "oops"}))
    (history.root / f"{broken[3].id}.json").write_text(json.dumps({**record, "version": 99}))
    (history.root / f"{broken[4].id}.json").write_text(json.dumps([1, 2, 3]))
    (history.root / f"{broken[5].id}.json").write_text('{"text": ' + "[" * 100_000 + "]" * 100_000 + "}")
    (history.root / f"{broken[6].id}.json").write_bytes(b'{"text": "caf\xe9"}')
    with caplog.at_level(logging.WARNING, logger="vocable.library.history"):
        assert [e.id for e in history.entries()] == [good.id]
    assert "skipping a history entry" in caplog.text
    broken_audio = history.add("audio damaged", "v", {}, speech(), RATE)
    broken_audio.audio_path.write_bytes(b"not flac")
    with pytest.raises(HistoryError, match="cannot be read"):
        history.load_audio(broken_audio.id)


def test_chapters_are_kept_and_exported(tmp_path):
    history = History()
    spans = (ChapterSpan("One", 0, 30000), ChapterSpan("Two", 30000, 48000))
    entry = history.add("# One\nA.\n# Two\nB.", "v", {}, speech(2.0), RATE, spans)
    assert History().entry(entry.id).chapters == spans
    files = history.export_chapters(entry.id, tmp_path / "book", ".ogg")
    assert [f.name for f in files] == ["01 One.ogg", "02 Two.ogg"]
    plain = history.add("No chapters.", "v", {}, speech(), RATE, (ChapterSpan("", 0, 36000),))
    assert plain.chapters == ()
    with pytest.raises(HistoryError, match="no chapters"):
        history.export_chapters(plain.id, tmp_path / "none", ".wav")


@pytest.mark.parametrize("chapters", ["x", [["a", 0]], [["a", 0, 10**9]], [["a", 100, 50]], [[1, 0, 10]],
                                      [["a", 0, 30000], ["b", 20000, 48000]], [["a", True, 10]], [None] * 10_001])
def test_damaged_chapters_skip_the_entry(chapters):
    history = History()
    entry = history.add("x", "v", {}, speech(2.0), RATE)
    path = history.root / f"{entry.id}.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "chapters": chapters}))
    with pytest.raises(HistoryError, match="'chapters' is invalid"):
        history.entry(entry.id)


def test_orphaned_audio_from_a_crash_is_removed_later():
    history = History()
    entry = history.add("x", "v", {}, speech(), RATE)
    orphan = history.root / "20250101-000000-000000-abcdef.flac"
    write_audio(orphan, speech(), RATE)
    fresh = history.root / "20250101-000000-000001-abcdef.flac"
    write_audio(fresh, speech(), RATE)
    long_ago = time.time() - 7200
    os.utime(orphan, (long_ago, long_ago))
    History()
    assert not orphan.exists() and fresh.exists() and entry.audio_path.exists()


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="needs file permissions that bind")
def test_a_read_only_history_gives_an_error_and_loses_nothing():
    history = History()
    entry = history.add("kept", "v", {}, speech(), RATE)
    history.root.chmod(0o500)
    try:
        with pytest.raises(AudioError, match="cannot write"):
            history.add("new", "v", {}, speech(), RATE)
        with pytest.raises(HistoryError, match="cannot delete"):
            history.delete(entry.id)
    finally:
        history.root.chmod(0o700)
    assert [e.id for e in history.entries()] == [entry.id]
    assert history.load_audio(entry.id)[0].size == speech().size


def test_a_write_that_fails_midway_loses_nothing():
    from test_library import write_limit

    history = History()
    entry = history.add("kept", "v", {}, speech(), RATE)
    with write_limit(20000):  # a full disk, in effect
        with pytest.raises(AudioError, match="cannot write"):
            history.add("new", "v", {}, speech(3.0), RATE)
    assert [e.id for e in history.entries()] == [entry.id]
    assert sorted(p.name for p in history.root.iterdir()) == [f"{entry.id}.flac", f"{entry.id}.json"]


def test_a_fifo_in_the_folder_does_not_block():
    history = History()
    entry = history.add("kept", "v", {}, speech(), RATE)
    os.mkfifo(history.root / "20250101-000000-000000-abcdef.json")
    assert [e.id for e in history.entries()] == [entry.id]
