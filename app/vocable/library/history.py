"""The history of generations: text, voice, settings, date and audio, in paths.history_dir().

Each entry is two files with the same stem (its id): `<id>.flac`, the audio (24-bit FLAC, so an
export to another format loses nothing that matters), and `<id>.json`, what was said and how.
The audio is written first and the JSON last, both atomically: an entry exists once its JSON
does, so a crash never leaves a half entry in the list (an orphaned FLAC is removed later).

    history = History()
    entry = history.add("Hello.", "Grandma", {"language": "auto", "seed": 7}, audio, 24000)
    samples, rate = history.load_audio(entry.id)
    history.export(entry.id, Path("hello.mp3"))
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from . import paths
from ..audio.export import ChapterSpan, check_output, save_speech, spoken_chapters, write_chapter_files
from ..audio.files import check_sample_rate, read_audio, write_audio
from ..errors import AudioError, VocableError
from ..store import FileFolder, atomic_write_text
from ..untrusted import parse_json

log = logging.getLogger(__name__)

FORMAT = "vocable-history"
FORMAT_VERSION = 1
MAX_JSON_BYTES = 4 << 20
MAX_TEXT_CHARS = 1_000_000
MAX_CHAPTERS = 10_000
_ID = re.compile(r"^\d{8}-\d{6}-\d{6}-[0-9a-f]{6}$")


class HistoryError(VocableError):
    """A history entry cannot be found, read or written."""


@dataclass(frozen=True)
class HistoryEntry:
    id: str
    text: str
    voice_name: str
    settings: dict       # language, temperature, top_k, seed, greedy, mode, model, ... (JSON values)
    created: datetime    # timezone-aware (UTC); .astimezone() for local time
    seconds: float
    sample_rate: int
    audio_path: Path     # FLAC in the history folder
    chapters: tuple[ChapterSpan, ...] = ()   # of a text with headings (Engine.synthesize), else none


def _json_safe(value, depth: int = 0):
    """Settings as JSON values: numpy scalars and arrays become numbers and lists, paths and
    anything else their text."""
    if depth > 20:
        return str(value)
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else str(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.ndarray):
        return _json_safe(value.tolist(), depth + 1)
    if isinstance(value, dict):
        return {str(k): _json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v, depth + 1) for v in value]
    return str(value)


class History:
    """The generations kept in a folder (default: paths.history_dir())."""

    def __init__(self, root: Path | None = None):
        self._files = FileFolder(root, paths.history_dir, self._read, HistoryError, "the history")
        self.root = self._files.root
        self._remove_orphans()

    def add(self, text: str, voice_name: str, settings: dict, audio: np.ndarray, sample_rate: int,
            chapters: tuple[ChapterSpan, ...] = ()) -> HistoryEntry:
        """Keeps a generation, with its chapters where the text had several; returns its entry.
        AudioError for unusable audio, HistoryError when it cannot be written (nothing is left
        behind then)."""
        if not isinstance(text, str) or not isinstance(voice_name, str):
            raise HistoryError("the text and the voice name must be strings")
        if settings is not None and not isinstance(settings, dict):
            raise HistoryError(f"the settings must be a dict, got {type(settings).__name__}")
        if len(text) > MAX_TEXT_CHARS:
            raise HistoryError(f"the text is longer than {MAX_TEXT_CHARS} characters; too long to keep")
        x = np.asarray(audio)
        if x.ndim == 2 and x.shape[1] == 1:
            x = x[:, 0]
        if x.ndim != 1 or x.size == 0:
            raise AudioError(f"no audio to keep (shape {list(x.shape)})")
        check_sample_rate(sample_rate, "cannot keep the audio: ")
        created = datetime.now(timezone.utc)
        entry_id = f"{created:%Y%m%d-%H%M%S-%f}-{secrets.token_hex(3)}"
        audio_path = self.root / f"{entry_id}.flac"
        settings = _json_safe(dict(settings or {}))
        record = {"format": FORMAT, "version": FORMAT_VERSION, "id": entry_id, "text": text,
                  "voice_name": voice_name, "settings": settings, "created": created.isoformat(),
                  "seconds": x.size / float(sample_rate), "sample_rate": int(sample_rate), "audio": audio_path.name}
        spoken = spoken_chapters(chapters)[:MAX_CHAPTERS]
        if len(spoken) > 1:
            record["chapters"] = [[c.title, int(c.start), int(c.end)] for c in spoken]
        encoded = json.dumps(record, ensure_ascii=False, indent=1)
        if len(encoded.encode("utf-8")) > MAX_JSON_BYTES and "chapters" in record:
            # many long headings: the marks are kept, their titles not (the text still has them)
            record["chapters"] = [["", start, end] for _, start, end in record["chapters"]]
            encoded = json.dumps(record, ensure_ascii=False, indent=1)
        if len(encoded.encode("utf-8")) > MAX_JSON_BYTES:
            raise HistoryError("this generation's text and settings are too large to keep in the history")
        write_audio(audio_path, x, sample_rate, subtype="PCM_24")  # checks the samples and the rate
        json_path = self.root / f"{entry_id}.json"
        try:
            atomic_write_text(json_path, encoded)
            entry = self._read(json_path)
        except (OSError, HistoryError) as e:
            for path in (json_path, audio_path):
                with contextlib.suppress(OSError):
                    path.unlink()
            if isinstance(e, HistoryError):
                raise
            raise HistoryError(f"cannot write the history entry {json_path}: {e.strerror or e}") from e
        log.info("history: kept %s (%.1f s)", entry_id, record["seconds"])
        return entry

    def entries(self) -> list[HistoryEntry]:
        """Every entry, newest first; unreadable ones are skipped and logged."""
        files = [p for p in self._files.files("*.json") if _ID.match(p.stem)]
        out = self._files.read_each(files, lambda path, e: log.warning("skipping a history entry: %s", e))
        return sorted(out, key=lambda e: (e.created, e.id), reverse=True)

    def entry(self, entry_id: str) -> HistoryEntry:
        return self._read(self._json_path(entry_id))

    def load_audio(self, entry_id: str) -> tuple[np.ndarray, int]:
        """The entry's audio: float32 [samples] (mono) and its sample rate."""
        entry = self.entry(entry_id)
        try:
            data, rate = read_audio(entry.audio_path)
        except AudioError as e:
            raise HistoryError(f"the audio of this history entry cannot be read: {e}") from None
        return np.ascontiguousarray(data[:, 0] if data.shape[1] == 1 else data.mean(axis=1), dtype=np.float32), rate

    def export(self, entry_id: str, dest: Path) -> Path:
        """Writes the entry's audio to `dest`, in the format of its extension (.wav, .flac,
        .ogg, .opus, .mp3, or .m4b with its chapters marked); a folder gets `<text>-<id>.wav`.
        Returns the file written."""
        entry = self.entry(entry_id)
        dest = Path(dest)
        if dest.is_dir():
            from .voices import slug
            dest = dest / f"{slug(entry.text, 40) or 'speech'}-{entry.id}.wav"
        check_output(dest)  # a wrong extension or folder fails before the audio is read
        samples, rate = self.load_audio(entry_id)
        return save_speech(dest, samples, rate, entry.chapters, entry.voice_name)

    def export_chapters(self, entry_id: str, folder: Path, suffix: str) -> list[Path]:
        """One file per chapter of the entry (see audio.export.write_chapter_files)."""
        entry = self.entry(entry_id)
        if len(entry.chapters) < 2:
            raise HistoryError("this history entry has no chapters (its text had no headings)")
        samples, rate = self.load_audio(entry_id)
        return write_chapter_files(folder, samples, rate, entry.chapters, suffix)

    def delete(self, entry_id: str) -> None:
        self._files.delete(self._json_path(entry_id), f"the entry {entry_id!r}")
        with contextlib.suppress(OSError):
            (self.root / f"{entry_id}.flac").unlink()

    def clear(self) -> None:
        """Deletes every entry."""
        for entry in self.entries():
            with contextlib.suppress(HistoryError):
                self.delete(entry.id)

    # -- helpers ---------------------------------------------------------------------------------

    def _json_path(self, entry_id: str) -> Path:
        if not isinstance(entry_id, str) or not _ID.match(entry_id):
            raise HistoryError(f"invalid history entry id {entry_id!r}")
        path = self.root / f"{entry_id}.json"
        if not path.is_file():
            raise HistoryError(f"there is no history entry {entry_id!r} (deleted?)")
        return path

    def _read(self, path: Path) -> HistoryEntry:
        name = path.name
        try:
            if not path.is_file():
                raise HistoryError(f"{name} is not a regular file")
            if path.stat().st_size > MAX_JSON_BYTES:
                raise HistoryError(f"{name} is too large for a history entry")
            record = parse_json(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise HistoryError(f"{name} is unreadable ({e})") from e
        if not isinstance(record, dict) or record.get("format") != FORMAT:
            raise HistoryError(f"{name} is not a Vocable history entry")
        if not isinstance(record.get("version"), int) or record["version"] > FORMAT_VERSION:
            raise HistoryError(f"{name} was written by a newer Vocable")
        types = {"text": str, "voice_name": str, "settings": dict, "created": str, "seconds": (int, float),
                 "sample_rate": int}
        for key, kind in types.items():
            if not isinstance(record.get(key), kind) or isinstance(record.get(key), bool):
                raise HistoryError(f"{name}: '{key}' is missing or invalid")
        try:
            created = datetime.fromisoformat(record["created"])
        except ValueError:
            raise HistoryError(f"{name}: invalid date {record['created'][:40]!r}") from None
        if created.tzinfo is None:
            created = created.replace(tzinfo=timezone.utc)
        audio_path = self.root / f"{path.stem}.flac"
        if not audio_path.is_file():
            raise HistoryError(f"{name}: its audio {audio_path.name} is missing")
        return HistoryEntry(path.stem, record["text"], record["voice_name"], record["settings"], created,
                            float(record["seconds"]), record["sample_rate"], audio_path,
                            _chapters(name, record.get("chapters", []),
                                      round(record["seconds"] * record["sample_rate"])))

    def _remove_orphans(self, older_than: float = 3600.0) -> None:
        """Removes audio whose entry was never completed (a crash between the two writes)."""
        now = time.time()
        with contextlib.suppress(OSError):
            for flac in self.root.glob("*.flac"):
                if _ID.match(flac.stem) and not flac.with_suffix(".json").exists():
                    with contextlib.suppress(OSError):
                        if now - flac.stat().st_mtime > older_than:
                            flac.unlink()


def _chapters(name: str, value, samples: int) -> tuple[ChapterSpan, ...]:
    """An entry's chapters as written by add(): [title, start, end] in order within its audio."""
    if not isinstance(value, list) or len(value) > MAX_CHAPTERS:
        raise HistoryError(f"{name}: 'chapters' is invalid")
    spans, previous_end = [], 0
    for item in value:
        if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)
                and all(isinstance(v, int) and not isinstance(v, bool) for v in item[1:])
                and previous_end <= item[1] <= item[2] <= samples):
            raise HistoryError(f"{name}: 'chapters' is invalid")
        spans.append(ChapterSpan(item[0][:1000], item[1], item[2]))
        previous_end = item[2]
    return tuple(spans)
