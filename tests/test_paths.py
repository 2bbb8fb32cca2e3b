"""The app's folders."""
from __future__ import annotations


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
