"""A synthesis written out: one audio file (files.write_audio), one file per chapter of its
text, or an M4B audiobook with chapter marks.

An M4B is AAC in an MP4 container with a chapter list, which players (Apple Books, VLC, most
podcast and audiobook apps) show for navigation. It needs FFmpeg's AAC encoder and MP4 muxer:
PyAV's, an optional dependency (`vocable[aac]`) that the bundle leaves out for the GPL code in
its wheels. One file per chapter works in any format, and everywhere.
"""
from __future__ import annotations

import importlib.util
import os
import re
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
_UNSAFE_IN_NAMES = re.compile(r'[<>:"/\\|?*\x00-\x1f\x7f]+')


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


def save_speech(path: str | os.PathLike, samples: np.ndarray, sample_rate: int,
                chapters: Sequence[ChapterSpan] = (), title: str = "") -> Path:
    """Writes a synthesis to `path` by its extension: an M4B with `chapters` as its chapter marks,
    or any of files.FILE_FORMATS (where chapters have no place)."""
    path = Path(path)
    if path.suffix.lower() == M4B:
        return write_m4b(path, samples, sample_rate, chapters, title)
    return write_audio(path, samples, sample_rate)


def chapter_file_name(index: int, count: int, title: str, suffix: str) -> str:
    """"03 The Storm.mp3": the chapter's number, zero-padded so that the files sort in order,
    and its title with the characters no file system takes left out."""
    number = f"{index + 1:0{max(2, len(str(count)))}d}"
    safe = " ".join(_UNSAFE_IN_NAMES.sub(" ", title).split()).strip(". ")[:80].rstrip(". ")
    return f"{number} {safe}{suffix}" if safe else f"{number}{suffix}"


def write_chapter_files(folder: str | os.PathLike, samples: np.ndarray, sample_rate: int,
                        chapters: Sequence[ChapterSpan], suffix: str) -> list[Path]:
    """One file per chapter (of `suffix`'s format) in `folder`, created if its parent exists;
    returns the files in order. A chapter without audio (the stream's cap stopped before it)
    gets no file."""
    folder = Path(folder)
    suffix = suffix.lower() if suffix.startswith(".") else "." + suffix.lower()
    if suffix not in FILE_FORMATS:
        raise AudioError(f"cannot write chapters as '{suffix}' files (use {', '.join(FILE_FORMATS)})")
    if not chapters:
        raise AudioError("there are no chapters to write")
    try:
        folder.mkdir(exist_ok=True)
    except OSError as e:
        raise AudioError(f"cannot make the folder {folder}: {e.strerror or e}") from e
    x = np.asarray(samples)
    written = []
    for i, chapter in enumerate(chapters):
        if chapter.end > chapter.start:
            name = chapter_file_name(i, len(chapters), chapter.title, suffix)
            written.append(write_audio(folder / name, x[chapter.start:chapter.end], sample_rate))
    if not written:
        raise AudioError("none of the chapters has audio")
    return written


def write_m4b(path: str | os.PathLike, samples: np.ndarray, sample_rate: int,
              chapters: Sequence[ChapterSpan] = (), title: str = "") -> Path:
    """An M4B audiobook (AAC-LC, mono) with a chapter mark per non-empty chapter, titled
    "Opening" where the text had none; written atomically."""
    path = Path(path)
    check_output(path)
    import av

    x = np.asarray(samples, dtype=np.float32).reshape(-1)
    if x.size == 0:
        raise AudioError(f"cannot write {path.name}: no audio")
    if not np.all(np.isfinite(x)):
        raise AudioError(f"cannot write {path.name}: the audio has NaN or infinite samples")
    x = np.clip(x, -1.0, 1.0)
    marks = [c for c in chapters if c.end > c.start]
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".part", dir=path.parent)
    os.close(fd)
    try:
        container = av.open(tmp, mode="w", format="ipod")
        try:
            if title:
                container.metadata["title"] = title
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
        finally:
            container.close()
        os.replace(tmp, path)
    except (av.FFmpegError, OSError, ValueError) as e:
        raise AudioError(f"cannot write {path}: {getattr(e, 'strerror', None) or e}") from e
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path
