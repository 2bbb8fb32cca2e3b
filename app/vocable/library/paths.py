"""Where Vocable keeps its files.

The folders are the platform's user folders for the app "Vocable" (platformdirs): on Linux
~/.local/share/Vocable, ~/.config/Vocable and ~/.local/state/Vocable/log. The environment
variable VOCABLE_HOME, when set, replaces all three with $VOCABLE_HOME/data, /config and /logs
(tests, portable installs). Every folder is created when it is first asked for.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..store import ensure_dir

APP_NAME = "Vocable"
HOME_ENV = "VOCABLE_HOME"


def _folder(kind: str) -> Path:
    home = os.environ.get(HOME_ENV)
    if home:
        path = Path(home).expanduser() / {"data": "data", "config": "config", "log": "logs"}[kind]
    else:
        import platformdirs

        path = Path({"data": platformdirs.user_data_dir, "config": platformdirs.user_config_dir,
                     "log": platformdirs.user_log_dir}[kind](APP_NAME, appauthor=False))
    return ensure_dir(path)


def data_dir() -> Path:
    return _folder("data")


def config_dir() -> Path:
    return _folder("config")


def log_dir() -> Path:
    return _folder("log")


def models_dir() -> Path:
    return ensure_dir(data_dir() / "models")


def whisper_dir() -> Path:
    """Speech recognition models (one folder each, by name), beside the TTS models."""
    return ensure_dir(models_dir() / "whisper")


def voices_dir() -> Path:
    return ensure_dir(data_dir() / "voices")


def history_dir() -> Path:
    return ensure_dir(data_dir() / "history")


def downloads_dir() -> Path:
    """Model folders downloaded from Hugging Face (kept to resume or convert again)."""
    return ensure_dir(data_dir() / "downloads")
