"""A synthesis written out: one audio file (files.write_audio), one file per chapter of its
text, or an M4B audiobook with chapter marks.

An M4B is AAC in an MP4 container with a chapter list, which players (Apple Books, VLC, most
podcast and audiobook apps) show for navigation. It needs FFmpeg's AAC encoder and MP4 muxer:
PyAV's, an optional dependency (`vocable[aac]`) that the bundle leaves out for the GPL code in
its wheels. One file per chapter works in any format, and everywhere.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import AudioError
from .encoding import aac_available
from .files import FILE_FORMATS, _file_format, write_audio

M4B = ".m4b"
M4B_BITRATE = 64000   # AAC-LC, mono speech at 24 kHz: transparent for a voice, ~29 MB per hour
_AAC_FRAME = 1024
_MAX_TITLE_BYTES = 120
_UNSAFE_IN_NAMES = re.compile(r'[<>:"/\\|?*\x00-\x1f\x7f]+')
_CHAPTER_STEM = re.compile(r"\d{2,}( .*)?")   # what chapter_file_name makes, less the suffix


@dataclass(frozen=True)
class ChapterSpan:
    """Where a chapter of the text lies in a synthesis' audio: samples [start, end)."""
    title: str
    start: int
    end: int


def output_suffixes() -> tuple[str, ...]:
    """The file extensions a synthesis can be saved as here (M4B only with PyAV, looked up
    without importing it: the app's start should not wait for FFmpeg's libraries)."""
    return tuple(FILE_FORMATS) + ((M4B,) if importlib.util.find_spec("av") is not None else ())


def check_output(path: str | os.PathLike) -> None:
    """Raises AudioError now, before any work, when `path` cannot be written as audio: an unknown
    extension, a missing folder, or an M4B without PyAV."""
    path = Path(path)
    if path.suffix.lower() != M4B:
        _file_format(path)
        return
    if not path.parent.is_dir():
        raise AudioError(f"cannot write {path}: the folder {path.parent} does not exist")
    if not aac_available():
        raise AudioError(f"cannot write {path.name}: M4B audiobooks need PyAV (pip install av, or "
                         "vocable[aac]), which Vocable's bundle leaves out for the GPL code in its FFmpeg build; "
                         "save one file per chapter instead")
    import av
    if not hasattr(av.container.Container, "set_chapters"):
        raise AudioError(f"cannot write {path.name}: M4B chapter marks need PyAV 16 or newer (this is "
                         f"{av.__version__}): pip install -U av")


def save_speech(path: str | os.PathLike, samples: np.ndarray, sample_rate: int,
                chapters: Sequence[ChapterSpan] = (), voice: str = "") -> Path:
    """Writes a synthesis to `path` by its extension: an M4B with `chapters` as its chapter marks
    (titled after the file, read by `voice`), or any of files.FILE_FORMATS (where chapters have
    no place)."""
    path = Path(path)
    if path.suffix.lower() == M4B:
        return write_m4b(path, samples, sample_rate, chapters, title=path.stem, narrator=voice)
    return write_audio(path, samples, sample_rate)


def spoken_chapters(chapters: Sequence[ChapterSpan]) -> tuple[ChapterSpan, ...]:
    """The chapters that have audio (a stream's frame cap can leave the last ones unspoken)."""
    return tuple(c for c in chapters if c.end > c.start)


def chapter_file_name(index: int, count: int, title: str, suffix: str) -> str:
    """"03 The Storm.mp3": the chapter's number, zero-padded so that the files sort in order,
    and its title with the characters no file system takes left out."""
    number = f"{index + 1:0{max(2, len(str(count)))}d}"
    safe = " ".join(_UNSAFE_IN_NAMES.sub(" ", title).split()).strip(". ")
    # file systems count bytes (255 at most, with room kept for the writer's temporary name)
    safe = safe.encode("utf-8")[:_MAX_TITLE_BYTES].decode("utf-8", "ignore").rstrip(". ")
    return f"{number} {safe}{suffix}" if safe else f"{number}{suffix}"


def write_chapter_files(folder: str | os.PathLike, samples: np.ndarray, sample_rate: int,
                        chapters: Sequence[ChapterSpan], suffix: str) -> list[Path]:
    """One file per chapter with audio (of `suffix`'s format) in `folder`, created if its parent
    exists; returns the files in order. The folder then holds this book alone: the numbered
    files of the same type that an earlier export left there ("02 Old Title.mp3") are removed,
    so that no player mixes two books. All or nothing: the files are written aside first, and a
    failure leaves the folder as it was."""
    folder = Path(folder)
    suffix = check_chapter_output(folder, suffix)
    chapters = spoken_chapters(chapters)
    if not chapters:
        raise AudioError("none of the chapters has audio")
    try:
        folder.mkdir(exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".vocable-chapters-", dir=folder))
    except OSError as e:
        raise AudioError(f"cannot make the folder {folder}: {e.strerror or e}") from e
    x = np.asarray(samples)
    try:
        names = [chapter_file_name(i, len(chapters), chapter.title, suffix) for i, chapter in enumerate(chapters)]
        for name, chapter in zip(names, chapters):
            write_audio(staging / name, x[chapter.start:chapter.end], sample_rate)
        try:
            for old in folder.iterdir():
                if (old.suffix.lower() == suffix and old.name not in names and _CHAPTER_STEM.fullmatch(old.stem)
                        and old.is_file()):
                    old.unlink()
            for name in names:
                os.replace(staging / name, folder / name)
        except OSError as e:
            raise AudioError(f"cannot write the chapters into {folder}: {e.strerror or e}") from e
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [folder / name for name in names]


def check_chapter_output(folder: str | os.PathLike, suffix: str) -> str:
    """The normalised suffix, or AudioError now, before any work, when files of that type
    cannot go into `folder` (made later if missing)."""
    folder = Path(folder)
    suffix = suffix.lower() if suffix.startswith(".") else "." + suffix.lower()
    if suffix not in FILE_FORMATS:
        raise AudioError(f"cannot write chapters as '{suffix}' files (use {', '.join(FILE_FORMATS)})")
    if folder.exists() and not folder.is_dir():
        raise AudioError(f"cannot write the chapters into {folder}: it is a file, not a folder")
    if not folder.parent.is_dir():
        raise AudioError(f"cannot make the folder {folder}: {folder.parent} does not exist")
    return suffix


def write_m4b(path: str | os.PathLike, samples: np.ndarray, sample_rate: int,
              chapters: Sequence[ChapterSpan] = (), title: str = "", narrator: str = "") -> Path:
    """An M4B audiobook (AAC-LC, mono) with a chapter mark per non-empty chapter, titled
    "Opening" where the text had none; its title and narrator (artist) tags where given;
    written atomically."""
    from ..store import atomic_writer

    path = Path(path)
    check_output(path)
    import av

    x = np.asarray(samples, dtype=np.float32).reshape(-1)
    if x.size == 0:
        raise AudioError(f"cannot write {path.name}: no audio")
    if not np.all(np.isfinite(x)):
        raise AudioError(f"cannot write {path.name}: the audio has NaN or infinite samples")
    x = np.clip(x, -1.0, 1.0)
    marks = spoken_chapters(chapters)
    try:
        with atomic_writer(path) as tmp:
            _encode_m4b(av, str(tmp), x, sample_rate, marks, {"title": title, "artist": narrator})
    except AudioError:
        raise
    except Exception as e:  # FFmpeg's, the file system's, or PyAV's own
        raise AudioError(f"cannot write {path}: {getattr(e, 'strerror', None) or e}") from e
    return path


def _encode_m4b(av, tmp: str, x: np.ndarray, sample_rate: int, marks: Sequence[ChapterSpan],
                tags: dict[str, str]) -> None:
    container = av.open(tmp, mode="w", format="ipod")
    try:
        for key, value in tags.items():
            if value:
                container.metadata[key] = value
        stream = container.add_stream("aac", rate=sample_rate, layout="mono")
        stream.bit_rate = M4B_BITRATE
        for start in range(0, x.size, _AAC_FRAME):
            frame = av.AudioFrame.from_ndarray(x[start:start + _AAC_FRAME].reshape(1, -1), format="fltp",
                                               layout="mono")
            frame.sample_rate, frame.pts = sample_rate, start
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
        if marks:
            container.set_chapters([{"id": i + 1, "start": c.start, "end": c.end,
                                     "time_base": Fraction(1, sample_rate),
                                     "metadata": {"title": c.title or "Opening"}}
                                    for i, c in enumerate(marks)])
    except BaseException:
        with contextlib.suppress(Exception):  # the first error is the one to report
            container.close()
        raise
    container.close()
