"""Files the app keeps: written atomically, and folders of them read once until they change.

A file is replaced atomically: written to a temporary file in the same folder, flushed to disk,
then renamed over the old one, so a crash or a full disk leaves the old file or the new one,
never half of one. A `FileFolder` is a folder of files of one kind (the voice library, the
history, the models), listed and read through a cache keyed by each file's modification time and
size, so that listing a large library again reads only what changed.
"""
from __future__ import annotations

import contextlib
import errno
import os
import secrets
import time
from pathlib import Path
from typing import Callable, Generic, Iterable, Iterator, TypeVar

from .errors import VocableError

TMP_SUFFIX = ".tmp"  # temporary files: ".<name>.<random>.tmp" next to their target

T = TypeVar("T")


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


class FileFolder(Generic[T]):
    """The files of one kind in a folder, each read by `read` once and then kept until it changes.

    `what` names the folder in errors ("the voice library"); `error` is the error type of the
    files' owner, raised for a folder that cannot be opened or listed."""

    def __init__(self, root: Path | None, default_root: Callable[[], Path], read: Callable[[Path], T],
                 error: type[VocableError], what: str):
        self.what, self.error, self._read = what, error, read
        try:
            self.root = ensure_dir(Path(root)) if root is not None else default_root()
        except VocableError as e:
            raise error(f"cannot open {what}: {e}") from None
        remove_stale_temp_files(self.root)
        self._cache: dict[Path, tuple[tuple[int, int], T]] = {}

    def files(self, pattern: str) -> list[Path]:
        """The folder's files matching the glob `pattern`, but not hidden ones (temporary files)."""
        try:
            return [p for p in self.root.glob(pattern) if not p.name.startswith(".")]
        except OSError as e:
            raise self.error(f"cannot list {self.what} {self.root}: {e.strerror or e}") from e

    def read(self, path: Path) -> T:
        """What `read` makes of `path`, from the cache while the file is unchanged."""
        st = path.stat()
        stamp = (st.st_mtime_ns, st.st_size)
        cached = self._cache.get(path)
        if cached is None or cached[0] != stamp:
            cached = (stamp, self._read(path))
            self._cache[path] = cached
        return cached[1]

    def read_each(self, files: Iterable[Path], skip: Callable[[Path, Exception], None]) -> list[T]:
        """Every file read; one that cannot be (the owner's error or OSError) goes to `skip`."""
        out = []
        for path in files:
            try:
                out.append(self.read(path))
            except (self.error, OSError) as e:
                skip(path, e)
        return out

    def delete(self, path: Path, what: str) -> None:
        """Removes one of the folder's files; `what` names it in the error ("the voice 'x'")."""
        try:
            path.unlink()
        except FileNotFoundError:
            raise self.error(f"{what} is not in {self.what} (deleted already?)") from None
        except OSError as e:
            raise self.error(f"cannot delete {what} ({path}): {e.strerror or e}") from e
        self.forget(path)

    def forget(self, path: Path) -> None:
        self._cache.pop(path, None)
