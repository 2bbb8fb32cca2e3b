"""The voice library: saved voices in the user data folder (paths.voices_dir()).

One voice is one file, `<id>.safetensors`, in the format of voice.Voice (tensors and string
metadata), with one more metadata key, "created" (ISO 8601, UTC); the name is the file's "name".
The files are the library: there is no index to go stale.

Files are never trusted: every read goes through voice.read_voice_file, which checks them. A file
that fails a check raises VoiceError (load, import) or is skipped and logged (listing). An import
writes a fresh file from the checked values, never a copy of the bytes it was given.

    library = VoiceLibrary()
    entry = library.save(voice, "Grandma, 2024")
    voice = library.load(entry.id)
"""
from __future__ import annotations

import contextlib
import logging
import re
import secrets
import unicodedata
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from . import paths
from ..errors import VoiceError
from ..store import FileFolder
from .voice import Voice, read_voice_file, write_voice_file

log = logging.getLogger(__name__)

SUFFIX = ".safetensors"
MAX_NAME_CHARS = 200
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,95}$")


@dataclass(frozen=True)
class VoiceEntry:
    id: str              # the file stem: letters, digits, '-' and '_' only
    name: str            # free text (any script)
    path: Path
    created: datetime    # timezone-aware (UTC); .astimezone() for local time
    seconds: float       # reference length
    has_codes: bool      # reference codes kept (in-context cloning possible with ref_text)
    ref_text: str | None
    model_variant: str
    clips: int = 1       # reference clips the speaker embedding averages


def check_name(name: object) -> str:
    """The name with surrounding blanks removed; VoiceError when it cannot be a voice name."""
    if not isinstance(name, str):
        raise VoiceError(f"a voice name must be text, got {type(name).__name__}")
    name = unicodedata.normalize("NFC", name).strip()
    if not name:
        raise VoiceError("the voice needs a name")
    if len(name) > MAX_NAME_CHARS:
        raise VoiceError(f"the voice name is {len(name)} characters long; at most {MAX_NAME_CHARS} are allowed")
    if any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn") and c not in "\u200d\u200c" for c in name):
        raise VoiceError("the voice name contains control or unassigned characters; use visible text")
    return name


def slug(text: str, limit: int = 40) -> str:
    """An ASCII file-name fragment from free text ('' when nothing of it is ASCII)."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    return re.sub(r"[^a-z0-9]+", "-", ascii_text.lower()).strip("-")[:limit].strip("-")


def _write(path: Path, voice: Voice, name: str, created: datetime) -> None:
    write_voice_file(path, voice, {"name": name,
                                   "created": created.astimezone(timezone.utc).isoformat(timespec="seconds")})


def _parse_created(meta: dict[str, str], path: Path) -> datetime:
    try:
        created = datetime.fromisoformat(meta.get("created", ""))
        return created if created.tzinfo else created.replace(tzinfo=timezone.utc)
    except ValueError:
        try:
            return datetime.fromtimestamp(path.stat().st_mtime, timezone.utc)
        except OSError:
            return datetime.now(timezone.utc)


class VoiceLibrary:
    """The saved voices in a folder (default: paths.voices_dir()). Not shared between threads
    without a lock of the caller's; separate instances on one folder are safe (each write is an
    atomic rename)."""

    def __init__(self, root: Path | None = None):
        self._files = FileFolder(root, paths.voices_dir, self._read_entry, VoiceError, "the voice library")
        self.root = self._files.root

    # -- reading ---------------------------------------------------------------------------------

    def entries(self) -> list[VoiceEntry]:
        """Every readable voice, by name (then date); unreadable files are skipped and logged."""
        files = []
        for path in sorted(self._files.files("*" + SUFFIX)):
            if _ID.match(path.stem):
                files.append(path)
            else:
                log.warning("skipping %s in the voice library: not a name Vocable gives voice files", path.name)
        out = self._files.read_each(files, lambda path, e: log.warning("skipping an unreadable voice file: %s", e))
        return sorted(out, key=lambda e: (e.name.casefold(), e.created, e.id))

    def entry(self, voice_id: str) -> VoiceEntry:
        return self._read_entry(self._path(voice_id))

    def load(self, voice_id: str) -> Voice:
        """The voice, named as in the library."""
        path = self._path(voice_id)
        voice, meta = read_voice_file(path)
        voice.name = meta.get("name") or path.stem
        return voice

    # -- writing ---------------------------------------------------------------------------------

    def save(self, voice: Voice, name: str) -> VoiceEntry:
        """Adds the voice under `name` (names need not be unique: each voice gets its own id)."""
        name = check_name(name)
        path = self._new_path(name)
        created = datetime.now(timezone.utc).replace(microsecond=0)
        _write(path, voice, name, created)
        log.info("saved voice %r as %s", name, path.name)
        return self.entry(path.stem)

    def rename(self, voice_id: str, name: str) -> VoiceEntry:
        name = check_name(name)
        path = self._path(voice_id)
        voice, meta = read_voice_file(path)
        _write(path, voice, name, _parse_created(meta, path))
        return self.entry(voice_id)

    def replace(self, voice_id: str, voice: Voice) -> VoiceEntry:
        """Stores a new version of the voice (another clip averaged in), keeping its name and date."""
        path = self._path(voice_id)
        _old, meta = read_voice_file(path)
        _write(path, voice, meta.get("name") or voice_id, _parse_created(meta, path))
        return self.entry(voice_id)

    def delete(self, voice_id: str) -> None:
        self._files.delete(self._path(voice_id), f"the voice {voice_id!r}")

    def export(self, voice_id: str, dest: Path) -> Path:
        """Copies the voice to `dest` (a file, or a folder to put `<name>.safetensors` in);
        atomically, from the checked contents. Returns the file written."""
        path = self._path(voice_id)
        voice, meta = read_voice_file(path)
        dest = Path(dest)
        if dest.is_dir():
            dest = dest / ((slug(meta.get("name", "")) or voice_id) + SUFFIX)
        if not dest.parent.is_dir():
            raise VoiceError(f"cannot export to {dest}: the folder {dest.parent} does not exist")
        if dest.suffix.lower() != SUFFIX:
            raise VoiceError(f"a voice file name ends in {SUFFIX} (got {dest.name!r})")
        with contextlib.suppress(OSError):
            if dest.resolve() == path.resolve():
                return dest
        _write(dest, voice, meta.get("name") or voice_id, _parse_created(meta, path))
        return dest

    def import_file(self, src: Path, name: str | None = None) -> VoiceEntry:
        """Adds a voice file made elsewhere, after checking it (VoiceError says what is wrong);
        named `name`, else the name inside the file, else the file's name."""
        src = Path(src)
        voice, meta = read_voice_file(src)
        if name is None:
            name = (meta.get("name") or "").strip() or src.name.removesuffix(SUFFIX) or "Imported voice"
            try:
                name = check_name(name)
            except VoiceError:
                name = "Imported voice"
        return self.save(voice, name)

    # -- helpers ---------------------------------------------------------------------------------

    def _path(self, voice_id: str) -> Path:
        if not isinstance(voice_id, str) or not _ID.match(voice_id):
            raise VoiceError(f"invalid voice id {voice_id!r}")
        path = self.root / (voice_id + SUFFIX)
        if not path.is_file():
            raise VoiceError(f"there is no voice {voice_id!r} in the library (deleted?)")
        return path

    def _new_path(self, name: str) -> Path:
        stem = slug(name, 40) or "voice"
        while True:
            path = self.root / f"{stem}-{secrets.token_hex(4)}{SUFFIX}"
            if not path.exists():
                return path

    @staticmethod
    def _read_entry(path: Path) -> VoiceEntry:
        voice, meta = read_voice_file(path)
        return VoiceEntry(path.stem, meta.get("name") or path.stem, path, _parse_created(meta, path),
                          float(voice.reference_seconds), voice.codes is not None, voice.ref_text,
                          voice.model_variant, voice.clips)
