"""Where Vocable keeps its files, and writing them atomically.

The folders are the platform's user folders for the app "Vocable" (platformdirs): on Linux
~/.local/share/Vocable, ~/.config/Vocable and ~/.local/state/Vocable/log. The environment
variable VOCABLE_HOME, when set, replaces all three with $VOCABLE_HOME/data, /config and /logs
(tests, portable installs). Every folder is created when it is first asked for.

Files are replaced atomically: written to a temporary file in the same folder, flushed to disk,
then renamed over the old one, so a crash or a full disk leaves the old file or the new one,
never half of one.
"""
from __future__ import annotations

import contextlib
import errno
import os
import secrets
import time
from pathlib import Path
from typing import Iterator

from ..errors import VocableError

APP_NAME = "Vocable"
HOME_ENV = "VOCABLE_HOME"
TMP_SUFFIX = ".tmp"  # temporary files: ".<name>.<random>.tmp" next to their target


def _folder(kind: str) -> Path:
    home = os.environ.get(HOME_ENV)
    if home:
        path = Path(home).expanduser() / {"data": "data", "config": "config", "log": "logs"}[kind]
    else:
        import platformdirs

        path = Path({"data": platformdirs.user_data_dir, "config": platformdirs.user_config_dir,
                     "log": platformdirs.user_log_dir}[kind](APP_NAME, appauthor=False))
    return ensure_dir(path)


def ensure_dir(path: Path) -> Path:
    """Creates the folder (and its parents) if needed; VocableError when that is impossible."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise VocableError(f"cannot create the folder {path}: {e.strerror or e}") from e
    if not path.is_dir():
        raise VocableError(f"{path} is not a folder")
    return path


def data_dir() -> Path:
    return _folder("data")


def config_dir() -> Path:
    return _folder("config")


def log_dir() -> Path:
    return _folder("log")


def models_dir() -> Path:
    return ensure_dir(data_dir() / "models")


def voices_dir() -> Path:
    return ensure_dir(data_dir() / "voices")


def history_dir() -> Path:
    return ensure_dir(data_dir() / "history")


def downloads_dir() -> Path:
    """Model folders downloaded from Hugging Face (kept to resume or convert again)."""
    return ensure_dir(data_dir() / "downloads")


def _temp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}{TMP_SUFFIX}")


def _fsync_dir(folder: Path) -> None:
    """Makes a rename in `folder` durable (POSIX); a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike) -> Iterator[Path]:
    """Yields a temporary path next to `path` for a writer that wants a file name (soundfile,
    safetensors); when the block ends without an exception the file is flushed to disk and
    renamed to `path`. On an exception it is removed and the old `path` is untouched.

    OSError propagates (callers turn it into their own error naming the file), also when `path`
    is a device, a FIFO or a folder: renaming over one would replace it, not write into it."""
    path = Path(path)
    if os.path.lexists(path) and not path.is_file():
        raise OSError(errno.EEXIST, "it exists and is not a regular file", str(path))
    tmp = _temp_path(path)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)


def atomic_write_bytes(path: str | os.PathLike, data: bytes | memoryview) -> Path:
    path = Path(path)
    with atomic_writer(path) as tmp:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_copy(src: str | os.PathLike, dest: str | os.PathLike, chunk: int = 16 << 20,
                on_chunk=None) -> Path:
    """Copies a file atomically; `on_chunk(copied_bytes)` after each chunk may raise to stop
    (nothing is left behind then)."""
    dest = Path(dest)
    with atomic_writer(dest) as tmp:
        with open(src, "rb") as fin, open(tmp, "xb") as fout:
            copied = 0
            while True:
                block = fin.read(chunk)
                if not block:
                    break
                fout.write(block)
                copied += len(block)
                if on_chunk is not None:
                    on_chunk(copied)
    return dest


def remove_stale_temp_files(folder: Path, older_than: float = 3600.0) -> None:
    """Deletes temporary files a crash left in `folder` (only ours, only old ones: a writer in
    another process may still be busy with a fresh one)."""
    now = time.time()
    try:
        candidates = list(Path(folder).glob(f".*{TMP_SUFFIX}"))
    except OSError:
        return
    for p in candidates:
        with contextlib.suppress(OSError):
            if p.is_file() and now - p.stat().st_mtime > older_than:
                p.unlink()
