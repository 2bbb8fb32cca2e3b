"""The app's folders and atomic writes."""
from __future__ import annotations

import os
import time

import pytest

from vocable.library import paths
from vocable.errors import VocableError


def test_vocable_home_overrides_every_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("VOCABLE_HOME", str(tmp_path / "home"))
    assert paths.data_dir() == tmp_path / "home" / "data"
    assert paths.config_dir() == tmp_path / "home" / "config"
    assert paths.log_dir() == tmp_path / "home" / "logs"
    assert paths.models_dir() == tmp_path / "home" / "data" / "models"
    assert paths.voices_dir() == tmp_path / "home" / "data" / "voices"
    assert paths.history_dir() == tmp_path / "home" / "data" / "history"
    for folder in ("data", "config", "logs", "data/models", "data/voices", "data/history"):
        assert (tmp_path / "home" / folder).is_dir()


def test_platform_folders_without_vocable_home(tmp_path, monkeypatch):
    monkeypatch.delenv("VOCABLE_HOME", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))
    assert paths.data_dir() == tmp_path / "xdg-data" / "Vocable"
    assert paths.config_dir() == tmp_path / "xdg-config" / "Vocable"
    assert paths.log_dir().is_relative_to(tmp_path / "xdg-state" / "Vocable")
    assert paths.voices_dir().is_dir()


def test_a_folder_that_cannot_be_created_is_a_clear_error(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("VOCABLE_HOME", str(tmp_path / "file"))
    with pytest.raises(VocableError, match="cannot create the folder"):
        paths.data_dir()


def test_atomic_write_replaces_and_leaves_nothing_else(tmp_path):
    target = tmp_path / "a.json"
    paths.atomic_write_text(target, "first")
    paths.atomic_write_text(target, "second ✓")
    assert target.read_text(encoding="utf-8") == "second ✓"
    paths.atomic_write_bytes(target, b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_a_failed_write_keeps_the_old_file(tmp_path):
    target = tmp_path / "voice.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with paths.atomic_writer(target) as tmp:
            tmp.write_bytes(b"half of the new")
            raise RuntimeError("the writer failed")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["voice.bin"]
    with pytest.raises(OSError):
        paths.atomic_write_bytes(tmp_path / "missing" / "x", b"data")


def test_atomic_copy_and_a_stopped_copy(tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(3 * 1024 + 5))
    dest = paths.atomic_copy(src, tmp_path / "dest.bin", chunk=1024)
    assert dest.read_bytes() == src.read_bytes()

    def stop(copied):
        if copied >= 2048:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        paths.atomic_copy(src, tmp_path / "stopped.bin", chunk=1024, on_chunk=stop)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest.bin", "src.bin"]


def test_stale_temp_files_are_removed_fresh_ones_kept(tmp_path):
    old = tmp_path / ".a.json.1234abcd.tmp"
    fresh = tmp_path / ".b.json.5678abcd.tmp"
    other = tmp_path / "user-file.tmp"
    for p in (old, fresh, other):
        p.write_text("x")
    long_ago = time.time() - 7200
    os.utime(old, (long_ago, long_ago))
    os.utime(other, (long_ago, long_ago))
    paths.remove_stale_temp_files(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [fresh.name, other.name]
