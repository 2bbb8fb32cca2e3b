"""The voice library: saved voices in the user data folder (paths.voices_dir()).

One voice is one file, `<id>.safetensors`, in the format of voice.Voice (tensors and string
metadata), with one more metadata key, "created" (ISO 8601, UTC); the name is the file's "name".
The files are the library: there is no index to go stale.

Files are never trusted: only safetensors (a JSON header and raw numbers, nothing executable)
is read, its size is bounded before anything is parsed, the metadata must say it is a Vocable
voice, and the tensors must have the expected names, types, shapes and finite values. A file that
fails any check raises VoiceError (load, import) or is skipped and logged (listing). An import
writes a fresh file from the checked values, never a copy of the bytes it was given.

    library = VoiceLibrary()
    entry = library.save(voice, "Grandma, 2024")
    voice = library.load(entry.id)
"""
from __future__ import annotations

import contextlib
import logging
import math
import re
import secrets
import unicodedata
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from . import paths
from .errors import VocableError, VoiceError
from .voice import VOICE_FORMAT, VOICE_FORMAT_VERSION, Voice

log = logging.getLogger("vocable.library")

SUFFIX = ".safetensors"
MAX_FILE_BYTES = 8 << 20          # a voice is ~10 KB (embedding) + 64 B per second of codes
MAX_NAME_CHARS = 200
MAX_REF_TEXT_CHARS = 20000
MAX_EMBEDDING = 16384             # speaker embedding length (the models use 1024 and 2048)
MAX_CODE_FRAMES = 4096            # 5.5 min at 12.5 frames/s (references are capped at 60 s)
MAX_CODEBOOKS = 64
MAX_CODE_VALUE = 1 << 16
MAX_METADATA_CHARS = 4 * MAX_REF_TEXT_CHARS
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


def _metadata(voice: Voice, name: str, created: datetime) -> dict[str, str]:
    # the keys of voice.Voice.save, plus "created"
    return {"format": VOICE_FORMAT, "version": str(VOICE_FORMAT_VERSION), "name": name,
            "ref_text": voice.ref_text or "", "has_ref_text": "true" if voice.ref_text is not None else "false",
            "model_variant": voice.model_variant, "reference_seconds": repr(float(voice.reference_seconds)),
            "created": created.astimezone(timezone.utc).isoformat(timespec="seconds")}


def _check_voice(voice: Voice, what: str) -> None:
    """The limits a file must meet to be read back, checked before it is written."""
    emb = voice.speaker_embedding
    if not 1 <= emb.size <= MAX_EMBEDDING:
        raise VoiceError(f"{what}: the speaker embedding has {emb.size} values (1 to {MAX_EMBEDDING} expected)")
    if not np.all(np.isfinite(emb)):
        raise VoiceError(f"{what}: the speaker embedding has NaN or infinite values")
    if voice.codes is not None:
        c = voice.codes
        if not (1 <= c.shape[0] <= MAX_CODE_FRAMES and 1 <= c.shape[1] <= MAX_CODEBOOKS):
            raise VoiceError(f"{what}: reference codes of shape {list(c.shape)} (at most "
                             f"[{MAX_CODE_FRAMES}, {MAX_CODEBOOKS}])")
        if c.size and (int(c.min()) < 0 or int(c.max()) >= MAX_CODE_VALUE):
            raise VoiceError(f"{what}: reference codes out of range")
    if voice.ref_text is not None and len(voice.ref_text) > MAX_REF_TEXT_CHARS:
        raise VoiceError(f"{what}: the reference transcript is longer than {MAX_REF_TEXT_CHARS} characters")
    if len(voice.model_variant) > 64:
        raise VoiceError(f"{what}: the model name is too long")
    if not (math.isfinite(voice.reference_seconds) and 0 <= voice.reference_seconds <= 24 * 3600):
        raise VoiceError(f"{what}: invalid reference length {voice.reference_seconds!r}")


def read_voice_file(path: Path) -> tuple[Voice, dict[str, str]]:
    """Reads and checks an untrusted voice file: (the voice, its metadata). VoiceError with the
    reason when it is not a well-formed Vocable voice."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    what = path.name
    try:
        if not path.exists():
            raise VoiceError(f"voice file not found: {path}")
        if not path.is_file():
            raise VoiceError(f"{path} is not a file")
        size = path.stat().st_size
    except OSError as e:
        raise VoiceError(f"cannot read {path}: {e.strerror or e}") from e
    if size > MAX_FILE_BYTES:
        raise VoiceError(f"{what} is {size / 2**20:.1f} MiB; a voice file is far smaller "
                         f"(at most {MAX_FILE_BYTES >> 20} MiB): it is not a Vocable voice")
    if size < 16:
        raise VoiceError(f"{what} is not a Vocable voice file (only {size} bytes)")
    try:
        with open(path, "rb") as f:
            head = f.read(9)
        header_len = int.from_bytes(head[:8], "little")
        if header_len > size - 8 or head[8:9] != b"{":
            raise VoiceError(f"{what} is not a Vocable voice file (not a safetensors file)")
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            if not isinstance(meta, dict) or meta.get("format") != VOICE_FORMAT:
                raise VoiceError(f"{what} is not a Vocable voice file (no Vocable voice metadata)")
            if sum(len(k) + len(v) for k, v in meta.items()) > MAX_METADATA_CHARS:
                raise VoiceError(f"{what} has oversized metadata: it is not a Vocable voice")
            version = meta.get("version", "")
            if not version.isdigit():
                raise VoiceError(f"{what} has an invalid voice format version {version[:20]!r}")
            if int(version) > VOICE_FORMAT_VERSION:
                raise VoiceError(f"{what} was written by a newer Vocable (voice format {version}); update Vocable")
            keys = set(f.keys())
            if "speaker_embedding" not in keys:
                raise VoiceError(f"{what} has no speaker embedding")
            unexpected = keys - {"speaker_embedding", "codes"}
            if unexpected:
                raise VoiceError(f"{what} has unexpected tensors ({', '.join(sorted(unexpected))[:200]})")
            expected = {"speaker_embedding": ("F32", 1), "codes": ("I32", 2)}
            for key in keys:
                sl = f.get_slice(key)
                dtype, shape = sl.get_dtype(), sl.get_shape()
                if (dtype, len(shape)) != expected[key]:
                    raise VoiceError(f"{what}: {key} is {dtype} {list(shape)}, expected {expected[key][0]} with "
                                     f"{expected[key][1]} dimension(s)")
            embedding = f.get_tensor("speaker_embedding")
            codes = f.get_tensor("codes") if "codes" in keys else None
    except VoiceError:
        raise
    except (SafetensorError, OSError, ValueError, TypeError, KeyError, OverflowError) as e:
        raise VoiceError(f"{what} is not a readable voice file ({e})") from e
    try:
        seconds = float(meta.get("reference_seconds", "0") or 0)
    except ValueError:
        raise VoiceError(f"{what} has an invalid reference length") from None
    ref_text = meta.get("ref_text", "") if meta.get("has_ref_text") == "true" else None
    try:
        voice = Voice(embedding, codes, ref_text, meta.get("name", ""), meta.get("model_variant", ""), seconds)
    except VoiceError as e:
        raise VoiceError(f"{what}: {e}") from None
    _check_voice(voice, what)
    return voice, meta


def _write_voice_file(path: Path, voice: Voice, name: str, created: datetime) -> None:
    from safetensors import SafetensorError
    from safetensors.numpy import save_file

    tensors = {"speaker_embedding": voice.speaker_embedding}
    if voice.codes is not None:
        tensors["codes"] = voice.codes
    try:
        with paths.atomic_writer(path) as tmp:
            save_file(tensors, str(tmp), metadata=_metadata(voice, name, created))
    except (OSError, SafetensorError) as e:  # safetensors reports I/O errors (a full disk) as its own
        reason = getattr(e, "strerror", None) or str(e).removeprefix("Error while serializing: ")
        raise VoiceError(f"cannot write the voice file {path}: {reason}") from e


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
        try:
            self.root = paths.ensure_dir(Path(root)) if root is not None else paths.voices_dir()
        except VocableError as e:
            raise VoiceError(f"cannot open the voice library: {e}") from None
        paths.remove_stale_temp_files(self.root)
        self._cache: dict[Path, tuple[tuple[int, int], VoiceEntry]] = {}

    # -- reading ---------------------------------------------------------------------------------

    def entries(self) -> list[VoiceEntry]:
        """Every readable voice, by name (then date); unreadable files are skipped and logged."""
        out = []
        try:
            files = sorted(p for p in self.root.glob("*" + SUFFIX) if not p.name.startswith("."))
        except OSError as e:
            raise VoiceError(f"cannot list the voice library {self.root}: {e.strerror or e}") from e
        for path in files:
            if not _ID.match(path.stem):
                log.warning("skipping %s in the voice library: not a name Vocable gives voice files", path.name)
                continue
            try:
                st = path.stat()
                stamp = (st.st_mtime_ns, st.st_size)
                cached = self._cache.get(path)
                if cached is None or cached[0] != stamp:
                    voice, meta = read_voice_file(path)
                    cached = (stamp, self._entry(path, voice, meta))
                    self._cache[path] = cached
                out.append(cached[1])
            except (VoiceError, OSError) as e:
                log.warning("skipping an unreadable voice file: %s", e)
        return sorted(out, key=lambda e: (e.name.casefold(), e.created, e.id))

    def entry(self, voice_id: str) -> VoiceEntry:
        voice, meta = read_voice_file(self._path(voice_id))
        return self._entry(self._path(voice_id), voice, meta)

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
        _check_voice(voice, "cannot save the voice")
        path = self._new_path(name)
        created = datetime.now(timezone.utc).replace(microsecond=0)
        _write_voice_file(path, voice, name, created)
        log.info("saved voice %r as %s", name, path.name)
        return self.entry(path.stem)

    def rename(self, voice_id: str, name: str) -> VoiceEntry:
        name = check_name(name)
        path = self._path(voice_id)
        voice, meta = read_voice_file(path)
        _write_voice_file(path, voice, name, _parse_created(meta, path))
        return self.entry(voice_id)

    def delete(self, voice_id: str) -> None:
        path = self._path(voice_id)
        try:
            path.unlink()
        except FileNotFoundError:
            raise VoiceError(f"there is no voice {voice_id!r} in the library (deleted already?)") from None
        except OSError as e:
            raise VoiceError(f"cannot delete the voice file {path}: {e.strerror or e}") from e
        self._cache.pop(path, None)

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
        _write_voice_file(dest, voice, meta.get("name") or voice_id, _parse_created(meta, path))
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
    def _entry(path: Path, voice: Voice, meta: dict[str, str]) -> VoiceEntry:
        return VoiceEntry(path.stem, meta.get("name") or path.stem, path, _parse_created(meta, path),
                          float(voice.reference_seconds), voice.codes is not None, voice.ref_text,
                          voice.model_variant)
