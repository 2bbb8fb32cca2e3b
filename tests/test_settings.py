"""Settings: defaults, saving, and loading whatever is on disk without failing."""
from __future__ import annotations

import json
import logging

import pytest

from vocable.errors import VocableError
from vocable.library.settings import Settings


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("VOCABLE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_defaults_when_there_is_no_file(home):
    s = Settings.load()
    assert s == Settings()
    assert (s.model_path, s.quantization, s.threads, s.input_device, s.output_device, s.export_dir, s.language) == \
        (None, "q8_0", None, None, None, None, "auto")
    assert not (home / "config" / "settings.json").exists()


def test_save_and_load_round_trip(home):
    s = Settings(model_path="/models/ünï.gguf", quantization="q4_k", threads=3, input_device="USB Mic",
                 output_device="Speakers (HDMI)", export_dir="/home/me/Audio", language="german")
    s.save()
    path = home / "config" / "settings.json"
    assert json.loads(path.read_text(encoding="utf-8"))["model_path"] == "/models/ünï.gguf"
    assert Settings.load() == s
    s.threads = None
    s.save()
    assert Settings.load().threads is None
    assert [p.name for p in path.parent.iterdir()] == ["settings.json"]  # no temporary files


def test_explicit_path(tmp_path):
    path = tmp_path / "elsewhere.json"
    Settings(language="french").save(path)
    assert Settings.load(path).language == "french"


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", "", "\x00\x01\x02", '"text"',
                                     '{"language": ' + "[" * 100_000 + "]" * 100_000 + "}"])
def test_a_corrupt_file_gives_defaults_and_is_kept_aside(home, content, caplog):
    path = home / "config" / "settings.json"
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with caplog.at_level(logging.WARNING, logger="vocable.library.settings"):
        assert Settings.load() == Settings()
    assert "unreadable" in caplog.text
    assert (path.parent / "settings.json.corrupt").read_text() == content
    Settings(threads=2).save()
    assert Settings.load().threads == 2


def test_bad_values_fall_back_one_by_one(home, caplog):
    path = home / "config" / "settings.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"model_path": 42, "quantization": "q2", "threads": 0, "input_device": "Mic",
                                "output_device": ["a"], "export_dir": "/x", "language": "", "unknown": 1,
                                "window": {"x": 1}}))
    with caplog.at_level(logging.WARNING, logger="vocable.library.settings"):
        s = Settings.load()
    assert s == Settings(input_device="Mic", export_dir="/x")
    for word in ("quantization 'q2'", "threads 0", "model_path", "output_device", "language"):
        assert word in caplog.text
    for threads in (True, 2.5, "4", 5000):
        path.write_text(json.dumps({"threads": threads}))
        assert Settings.load().threads is None
    for device in ("gpu please", "vulkan:", "Vulkan:0", 0, None, "vulkan:0; rm -rf /"):
        path.write_text(json.dumps({"compute_device": device}))
        assert Settings.load().compute_device == "auto", device
    for device in ("cpu", "vulkan:1", "cuda:0", "metal:0"):
        path.write_text(json.dumps({"compute_device": device}))
        assert Settings.load().compute_device == device


@pytest.mark.parametrize("field, value", [("quantization", "q3"), ("threads", 0), ("threads", "8"),
                                          ("model_path", 5), ("language", ""),
                                          ("compute_device", "gpu")])
def test_saving_a_bad_value_is_refused_and_keeps_the_file(home, field, value):
    Settings(threads=4).save()
    s = Settings()
    setattr(s, field, value)
    with pytest.raises(VocableError, match="cannot save the settings"):
        s.save()
    assert Settings.load().threads == 4


def test_an_unwritable_place_is_a_clear_error(tmp_path):
    with pytest.raises(VocableError, match="cannot save the settings"):
        Settings().save(tmp_path / "missing-folder" / "settings.json")


def test_a_write_that_fails_midway_keeps_the_old_file(home):
    from test_library import write_limit

    Settings(threads=4).save()
    with write_limit(50):
        with pytest.raises(VocableError, match="cannot save the settings"):
            Settings(threads=8, export_dir="/a/long/path" * 10).save()
    assert Settings.load().threads == 4
    assert [p.name for p in (home / "config").iterdir()] == ["settings.json"]


def test_a_fifo_instead_of_the_file_does_not_block(home):
    import os

    (home / "config").mkdir(parents=True)
    os.mkfifo(home / "config" / "settings.json")
    assert Settings.load() == Settings()
