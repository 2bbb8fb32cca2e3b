"""The app's settings, kept as JSON in paths.config_dir()/settings.json.

Each setting is declared once, below, with its default. Loading never fails: a missing file
gives the defaults; a value of the wrong kind falls back to its default (logged); a file that is
not JSON at all is moved aside to settings.json.corrupt (so it is not lost) and the defaults are
used. Saving is atomic.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from . import paths
from ..store import atomic_write_text
from ..errors import VocableError
from ..untrusted import parse_json

log = logging.getLogger(__name__)

FILE_NAME = "settings.json"
WEIGHT_TYPES = ("f32", "f16", "q8_0", "q4_k")   # convert.WEIGHT_TYPES (not imported: it pulls in numpy)
MAX_THREADS = 1024
MAX_FILE_BYTES = 1 << 20
COMPUTE_DEVICE = re.compile(r"auto|cpu|[a-z]{1,16}:[0-9]{1,3}")


@dataclass
class Settings:
    model_path: str | None = None       # the model in use (a .gguf)
    quantization: str = "q8_0"          # weight type for imports and downloads
    threads: int | None = None          # engine threads; None: all cores
    compute_device: str = "auto"        # where the model runs: "auto" (the best GPU, else the
                                        # CPU), "cpu" or a device id ("vulkan:0")
    input_device: str | None = None     # recording device name; None: the system default
    output_device: str | None = None    # playback device name; None: the system default
    export_dir: str | None = None       # last folder audio was saved to
    language: str = "auto"
    whisper_model: str | None = None    # speech recognition model: a name in the store or a folder;
                                        # None: the first installed
    check_results: bool = False         # transcribe each result and compare it with its text
    api_server: bool = False            # serve the speech API (vocable.server) while the app runs
    api_port: int = 8765                # on 127.0.0.1:api_port

    @staticmethod
    def default_path() -> Path:
        return paths.config_dir() / FILE_NAME

    @classmethod
    def load(cls, path: Path | None = None) -> "Settings":
        """The saved settings; defaults when the file is missing or corrupt (logged)."""
        try:
            path = Path(path) if path is not None else cls.default_path()
        except VocableError as e:
            log.warning("settings: %s; using the defaults", e)
            return cls()
        if path.exists() and not path.is_file():
            log.warning("settings: %s is not a regular file; using the defaults", path)
            return cls()
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                raise ValueError("the file is too large")
            data = parse_json(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError) as e:
            log.warning("settings: %s is unreadable (%s); using the defaults", path, e)
            aside = path.with_name(path.name + ".corrupt")
            with contextlib.suppress(OSError):
                os.replace(path, aside)
                log.warning("settings: the unreadable file was moved to %s", aside)
            return cls()
        settings = cls()
        for f in dataclasses.fields(cls):
            if f.name not in data:
                continue
            value = data[f.name]
            try:
                setattr(settings, f.name, _check(f.name, value))
            except ValueError as e:
                log.warning("settings: %s; using the default %r", e, getattr(settings, f.name))
        return settings

    def save(self, path: Path | None = None) -> None:
        """Writes the settings atomically; VocableError with the reason when that fails (the
        previous file is kept then)."""
        for f in dataclasses.fields(self):
            try:
                _check(f.name, getattr(self, f.name))
            except ValueError as e:
                raise VocableError(f"cannot save the settings: {e}") from None
        path = Path(path) if path is not None else self.default_path()
        try:
            atomic_write_text(path, json.dumps(dataclasses.asdict(self), indent=2, ensure_ascii=False) + "\n")
        except OSError as e:
            raise VocableError(f"cannot save the settings to {path}: {e.strerror or e}") from e


def _check(name: str, value):
    """The value if it suits the setting; ValueError saying why not."""
    if name == "quantization":
        if value not in WEIGHT_TYPES:
            raise ValueError(f"quantization {value!r} is not one of {', '.join(WEIGHT_TYPES)}")
    elif name == "threads":
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or not 1 <= value <= MAX_THREADS):
            raise ValueError(f"threads {value!r} is not a number from 1 to {MAX_THREADS}")
    elif name == "compute_device":
        if not isinstance(value, str) or not COMPUTE_DEVICE.fullmatch(value):
            raise ValueError(f"compute_device {str(value)[:80]!r} is not auto, cpu or a device id such as vulkan:0")
    elif name in ("api_server", "check_results"):
        if not isinstance(value, bool):
            raise ValueError(f"{name} {str(value)[:80]!r} is not true or false")
    elif name == "api_port":
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
            raise ValueError(f"api_port {str(value)[:80]!r} is not a port number from 1 to 65535")
    elif name == "language":
        if not isinstance(value, str) or not value or len(value) > 64:
            raise ValueError(f"language {value!r} is not a language name")
    else:  # optional text: paths and device names
        if value is not None and (not isinstance(value, str) or len(value) > 4096 or "\0" in value):
            raise ValueError(f"{name} {str(value)[:80]!r} is not valid text")
    return value
