"""Every file Vocable writes (exported audio, history, library, voices, settings, models) reports a
failed write with the file and its cause, and leaves the old file or nothing: a full disk once
gave "System error." alone, and a full disk under an OGG export gave a cut file and no error."""
from __future__ import annotations

import errno
import os
import re

import numpy as np
import pytest

from conftest import fixture_dir
from test_library import write_limit
from vocable import store
from vocable.audio.files import write_audio
from vocable.errors import AudioError, ModelError, VocableError, VoiceError
from vocable.library.history import History, HistoryError
from vocable.library.voices import VoiceLibrary
from vocable.engine.models import ModelStore
from vocable.library.settings import Settings
from vocable.library.voice import Voice

NO_SPACE = os.strerror(errno.ENOSPC)   # "No space left on device"
AUDIO = (0.3 * np.sin(np.arange(24000) / 10.0)).astype(np.float32)


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("VOCABLE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def a_voice() -> Voice:
    return Voice(np.linspace(-1, 1, 64, dtype=np.float32), np.arange(160, dtype=np.int32).reshape(10, 16),
                 "Hello there.", "Ada", "0.6B", 3.0)


@pytest.fixture
def disk_full(monkeypatch):
    """Flushing to disk fails with ENOSPC from the `after`-th fsync on (0: the first), as on file
    systems that allocate late; every writer flushes before its rename."""
    state = {"after": 0}
    real_fsync = os.fsync

    def fsync(fd):
        if state["after"] > 0:
            state["after"] -= 1
            return real_fsync(fd)
        raise OSError(errno.ENOSPC, NO_SPACE)

    monkeypatch.setattr(os, "fsync", fsync)
    return state


def temp_files(folder):
    return [p.name for p in folder.rglob(f"*{store.TMP_SUFFIX}")]


@pytest.mark.parametrize("suffix", [".wav", ".flac", ".ogg", ".mp3"])
def test_exported_audio(tmp_path, disk_full, suffix):
    import soundfile as sf
    if suffix == ".mp3" and "MP3" not in sf.available_formats():
        pytest.skip("this libsndfile cannot write MP3")
    out = tmp_path / f"speech{suffix}"
    with pytest.raises(AudioError, match=re.escape(f"cannot write {out}: {NO_SPACE}")):
        write_audio(out, AUDIO, 24000)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("suffix", [".wav", ".flac", ".ogg"])
def test_exported_audio_over_the_size_limit(tmp_path, suffix):
    """A real failing write (EFBIG past RLIMIT_FSIZE): the old file is kept, whole."""
    out = tmp_path / f"speech{suffix}"
    write_audio(out, AUDIO[:100], 24000)
    before = out.read_bytes()
    with write_limit(4000):
        with pytest.raises(AudioError, match=re.escape(f"cannot write {out}: {os.strerror(errno.EFBIG)}")):
            write_audio(out, np.random.default_rng(0).uniform(-1, 1, 10 * 24000).astype(np.float32), 24000)
    assert out.read_bytes() == before and temp_files(tmp_path) == []


def test_voice_file(tmp_path, disk_full):
    out = tmp_path / "ada.safetensors"
    with pytest.raises(VoiceError, match=re.escape(f"cannot write the voice file {out}: {NO_SPACE}")):
        a_voice().save(out)
    assert list(tmp_path.iterdir()) == []


def test_library(disk_full):
    library = VoiceLibrary()
    with pytest.raises(VoiceError, match=f"cannot write the voice file {re.escape(str(library.root))}/ada-[0-9a-f]+"
                                         rf"\.safetensors: {NO_SPACE}"):
        library.save(a_voice(), "Ada")
    assert list(library.root.iterdir()) == []


def test_library_rename_keeps_the_old_file(disk_full):
    disk_full["after"] = 1
    library = VoiceLibrary()
    entry = library.save(a_voice(), "Ada")
    with pytest.raises(VoiceError, match=re.escape(f"cannot write the voice file {entry.path}: {NO_SPACE}")):
        library.rename(entry.id, "Grace")
    assert [e.name for e in library.entries()] == ["Ada"] and temp_files(library.root) == []


def test_history_audio(disk_full):
    history = History()
    with pytest.raises(AudioError, match=f"cannot write {re.escape(str(history.root))}/[0-9-]+[0-9a-f]+\\.flac: "
                                         f"{NO_SPACE}"):
        history.add("Hello.", "Ada", {}, AUDIO, 24000)
    assert list(history.root.iterdir()) == []


def test_history_entry(disk_full):
    disk_full["after"] = 1  # the audio is written, its JSON is not
    history = History()
    with pytest.raises(HistoryError, match=f"cannot write the history entry {re.escape(str(history.root))}/"
                                           f"[0-9-]+[0-9a-f]+\\.json: {NO_SPACE}"):
        history.add("Hello.", "Ada", {}, AUDIO, 24000)
    assert list(history.root.iterdir()) == []


def test_settings(disk_full):
    path = Settings.default_path()
    with pytest.raises(VocableError, match=re.escape(f"cannot save the settings to {path}: {NO_SPACE}")):
        Settings(language="german").save()
    assert not path.exists()


def test_model_copy(tmp_path, converted, disk_full):
    disk_full["after"] = 10 ** 6  # the fixture's conversion, when not made yet, flushes too
    model = converted("0.6b", "q8_0")
    disk_full["after"] = 0
    store = ModelStore()
    with pytest.raises(ModelError, match=f"cannot copy {re.escape(str(model))} to "
                                         f"{re.escape(str(store.root))}/model.gguf: {NO_SPACE}"):
        store.add_converted(model)
    assert list(store.root.iterdir()) == []


def test_model_import(disk_full):
    store = ModelStore()
    with pytest.raises(ModelError, match=f"cannot write the converted model {re.escape(str(store.root))}/"
                                         rf"Qwen3-TTS-12Hz-0\.6B-Base-f32\.gguf: {NO_SPACE}"):
        store.import_hf_folder(fixture_dir("0.6b") / "model", "f32")
    assert list(store.root.iterdir()) == []


@pytest.mark.parametrize("name, write", [
    ("out.wav", lambda out: write_audio(out, AUDIO, 24000)),
    ("out.safetensors", lambda out: a_voice().save(out)),
    ("settings.json", lambda out: Settings().save(out)),
])
def test_a_fifo_is_not_renamed_over(tmp_path, name, write):
    """Writing is a rename over the target: over a device or a FIFO it would replace it (as root
    even /dev/full), so such a target is refused, and left as it was."""
    fifo = tmp_path / name
    os.mkfifo(fifo)
    with pytest.raises(VocableError, match=f"{re.escape(str(fifo))}: it exists and is not a regular file"):
        write(fifo)
    assert fifo.is_fifo() and temp_files(tmp_path) == []
