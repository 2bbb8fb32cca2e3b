"""The model store: converted models (GGUF) in paths.models_dir(), and getting them there.

    store = ModelStore()
    store.entries()                                   # what is installed
    store.add_converted(Path("~/model-q8_0.gguf"))    # copy a converted model in
    store.import_hf_folder(folder, "q8_0", progress, cancel)   # convert a downloaded HF folder
    store.download()                                  # fetch from Hugging Face, then convert

A model is described from its GGUF header alone (architecture, size, weight type, format
version, and that every tensor lies inside the file), read with bounds on every length, so any
file, however damaged or hostile, gives a ModelError and never a crash; the engine checks the
rest (shapes, checksums) when it loads the model.

Long operations take `progress(fraction, message)` (fraction 0..1, called from the calling
thread) and `cancel` (a threading.Event): when it is set the operation stops within one block of
work and raises convert.ConversionCancelled, leaving no partial model behind.
"""
from __future__ import annotations

import contextlib
import glob
import logging
import os
import re
import shutil
import socket
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import ConversionCancelled, ConversionError, ModelError
from ..library import paths
from ..store import FileFolder, atomic_copy
from .convert import ARCH, FORMAT_VERSION, WEIGHT_TYPES
from .gguf_header import read_gguf_header

log = logging.getLogger(__name__)

ProgressFn = Callable[[float, str], None]

DEFAULT_REPO = "Qwen/Qwen3-TTS-12Hz-0.6B-Base"
REPOS = ("Qwen/Qwen3-TTS-12Hz-0.6B-Base", "Qwen/Qwen3-TTS-12Hz-1.7B-Base")
SUFFIX = ".gguf"
MAX_NAME_BYTES = 200   # of a model file's stem: file systems take 255 bytes, with room for ".gguf.<random>.partial"
FILE_TYPES = {0: "f32", 1: "f16", 7: "q8_0", 14: "q4_k"}   # general.file_type, as convert writes it
# Output size relative to the bf16 checkpoint, for the free-space check before a conversion.
_SIZE_FACTOR = {"f32": 2.1, "f16": 1.1, "q8_0": 0.7, "q4_k": 0.5}
_DOWNLOAD_SHARE = 0.8   # share of download()'s progress taken by the download (the rest: converting)
# faster-whisper's CTranslate2 conversions of Whisper, by the name the user picks
WHISPER_REPOS = {name: f"Systran/faster-whisper-{name}" for name in ("tiny", "tiny.en", "base", "base.en", "small",
                                                                      "small.en")}
DEFAULT_WHISPER = "base"
_WHISPER_FILES = re.compile(r"^(model\.bin|config\.json|tokenizer\.json|vocabulary\.(txt|json)|"
                            r"preprocessor_config\.json|README\.md|LICENSE)$")
_DOWNLOAD_FILES = re.compile(r"^((speech_tokenizer/)?[^/]+\.(json|txt|safetensors)|README\.md|LICENSE)$")


@dataclass(frozen=True)
class ModelEntry:
    path: Path
    name: str             # general.name with the size spelt out: "Qwen3-TTS 12Hz 0.6B Base (q8_0)"
    variant: str          # "0.6B", "1.7B" or the converter's tag
    weight_type: str      # f32, f16, q8_0, q4_k
    size_bytes: int
    license: str | None = None   # general.license: what the model card declared when it was converted


def variant_name(tag: str) -> str:
    """The model size as people write it: "0b6" -> "0.6B" (other tags unchanged)."""
    m = re.fullmatch(r"(\d+)b(\d+)", tag or "")
    return f"{m[1]}.{m[2]}B" if m else (tag or "unknown")


_WANTED = {"general.architecture", "general.name", "general.file_type", "general.alignment", "general.license",
           f"{ARCH}.model_type", f"{ARCH}.model_size", f"{ARCH}.format_version"}


# ---- the store --------------------------------------------------------------------------------

class ModelStore:
    """The converted models in a folder (default: paths.models_dir())."""

    def __init__(self, root: Path | None = None):
        self._files = FileFolder(root, paths.models_dir, self.describe, ModelError, "the models folder")
        self.root = self._files.root
        now = time.time()
        for partial in self.root.glob("*.partial"):  # convert()'s file, left by a crash
            with contextlib.suppress(OSError):
                if now - partial.stat().st_mtime > 3600:
                    partial.unlink()

    def entries(self) -> list[ModelEntry]:
        """The models in the store, by name; files that are not usable models are skipped and
        logged."""
        out = self._files.read_each(self._files.files("*" + SUFFIX),
                                    lambda path, e: log.warning("skipping %s in the models folder: %s", path.name, e))
        return sorted(out, key=lambda e: (e.name.casefold(), e.path.name))

    def describe(self, gguf: Path) -> ModelEntry:
        """What a model file is; ModelError saying why when it is not a usable Vocable model."""
        gguf = Path(gguf)
        if not gguf.exists():
            raise ModelError(f"model file not found: {gguf}")
        if gguf.is_dir():
            raise ModelError(f"{gguf} is a folder; to use a downloaded Hugging Face model folder, import it "
                             "(it is converted then)")
        if not gguf.is_file():
            raise ModelError(f"{gguf} is not a regular file")
        meta = read_gguf_header(gguf, _WANTED)
        arch = meta.get("general.architecture")
        if arch != ARCH:
            raise ModelError(f"{gguf.name} is a GGUF model for {arch!r}, not a Qwen3-TTS model converted by Vocable")
        model_type = meta.get(f"{ARCH}.model_type")
        if model_type != "base":
            raise ModelError(f"{gguf.name} is a Qwen3-TTS '{model_type}' model; Vocable needs a Base model")
        version = meta.get(f"{ARCH}.format_version")
        if version != FORMAT_VERSION:
            raise ModelError(f"{gguf.name} was converted for model format {version}, this Vocable needs format "
                             f"{FORMAT_VERSION}: convert the Hugging Face folder again")
        if meta["data_end"] > meta["file_size"]:
            raise ModelError(f"{gguf.name} is truncated ({meta['file_size']} of {meta['data_end']} bytes): "
                             "copy or download it again")
        file_type = meta.get("general.file_type")
        weight_type = FILE_TYPES.get(file_type) if isinstance(file_type, int) else None
        weight_type = weight_type or f"type {str(file_type)[:20]}"
        tag = str(meta.get(f"{ARCH}.model_size") or "")
        variant = variant_name(tag)
        name = str(meta.get("general.name") or gguf.stem)
        if tag:
            name = name.replace(tag, variant)  # "Qwen3-TTS 12Hz 0b6 Base (q8_0)" -> "... 0.6B ..."
        license = meta.get("general.license")
        return ModelEntry(gguf, name, variant, weight_type, meta["file_size"],
                          license if isinstance(license, str) and license.strip() else None)

    def add_converted(self, gguf: Path) -> ModelEntry:
        """Copies a converted model into the store (checked first; atomically)."""
        gguf = Path(gguf)
        entry = self.describe(gguf)
        with contextlib.suppress(OSError):
            if gguf.resolve().parent == self.root.resolve():
                return entry
        self._check_space(entry.size_bytes, f"copy {gguf.name}")
        dest = self._unique(gguf.name if gguf.suffix.lower() == SUFFIX else gguf.stem + SUFFIX)
        try:
            atomic_copy(gguf, dest)
        except OSError as e:
            raise ModelError(f"cannot copy {gguf} to {dest}: {e.strerror or e}") from e
        log.info("model %s added as %s", gguf, dest.name)
        return self.describe(dest)

    def delete(self, gguf: Path) -> None:
        """Removes a model from the store (only files inside it)."""
        gguf = Path(gguf)
        if gguf.resolve().parent != self.root.resolve():
            raise ModelError(f"{gguf} is not in the models folder {self.root}")
        self._files.delete(gguf, gguf.name)

    def import_hf_folder(self, folder: Path, weight_type: str, progress: ProgressFn | None = None,
                         cancel: threading.Event | None = None) -> ModelEntry:
        """Converts a downloaded Hugging Face Qwen3-TTS 12 Hz Base folder into the store.
        ModelError for a folder that is not one (or when writing fails); ConversionCancelled
        when `cancel` is set. No partial file is left either way."""
        from .convert import convert
        from .model_folder import read_model_folder

        if weight_type not in WEIGHT_TYPES:
            raise ModelError(f"unknown weight type {weight_type!r}; choose one of {', '.join(WEIGHT_TYPES)}")
        folder = Path(folder)
        try:
            info = read_model_folder(folder)
        except ConversionError as e:
            raise ModelError(str(e)) from None
        checkpoint = sum(p.stat().st_size for p in folder.rglob("*.safetensors") if p.is_file())
        self._check_space(int(checkpoint * _SIZE_FACTOR[weight_type]), "convert the model")
        variant = variant_name(str(info.config.get("tts_model_size", "")))
        out = self._unique(f"Qwen3-TTS-12Hz-{variant}-Base-{weight_type}{SUFFIX}")

        def report(done: int, total: int, name: str) -> bool:
            if cancel is not None and cancel.is_set():
                return False
            if progress is not None:
                progress(min(1.0, done / max(total, 1)), f"converting {name}")
            return True

        if cancel is not None and cancel.is_set():
            raise ConversionCancelled("conversion cancelled")
        if progress is not None:
            progress(0.0, f"converting {folder.name} to {weight_type}")
        try:
            convert(folder, out, weight_type, report)
        except ConversionCancelled:
            log.info("conversion of %s cancelled", folder)
            raise
        except ConversionError as e:
            raise ModelError(str(e)) from None
        try:
            entry = self.describe(out)
        except ModelError:
            with contextlib.suppress(OSError):
                out.unlink()
            raise
        if progress is not None:
            progress(1.0, f"converted to {out.name}")
        log.info("converted %s to %s", folder, out)
        return entry

    def download(self, repo_id: str = DEFAULT_REPO, weight_type: str = "q8_0", progress: ProgressFn | None = None,
                 cancel: threading.Event | None = None, keep_download: bool = True) -> ModelEntry:
        """Downloads a Qwen3-TTS Base model from Hugging Face (huggingface_hub; HF_ENDPOINT is
        honoured) into paths.downloads_dir(), then converts it into the store.

        Offline, this fails within seconds with ModelError("cannot reach <host>: ..."). A
        cancelled download keeps what it fetched in the downloads folder, and the next one
        resumes from there; the store gets a model only once it is whole. `keep_download`:
        keep the Hugging Face folder after converting (to convert again to another type)."""
        if weight_type not in WEIGHT_TYPES:
            raise ModelError(f"unknown weight type {weight_type!r}; choose one of {', '.join(WEIGHT_TYPES)}")
        if not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", repo_id or "") or ".." in repo_id:
            raise ModelError(f"{repo_id!r} is not a Hugging Face model name (owner/name)")

        def report(fraction: float, message: str) -> None:
            if progress is not None:
                progress(fraction, message)

        local_dir = self._fetch(repo_id, _DOWNLOAD_FILES, "config.json", "a Qwen3-TTS model repository",
                                lambda total, have: total - have + int(total * _SIZE_FACTOR[weight_type]),
                                lambda fraction, message: report(_DOWNLOAD_SHARE * fraction, message), cancel,
                                "; download the model folder elsewhere and import it")
        report(_DOWNLOAD_SHARE, f"downloaded {repo_id}")
        entry = self.import_hf_folder(
            local_dir, weight_type,
            lambda f, m: report(_DOWNLOAD_SHARE + (1 - _DOWNLOAD_SHARE) * f, m), cancel)
        if not keep_download:
            shutil.rmtree(local_dir, ignore_errors=True)
        return entry

    def download_whisper(self, name: str = DEFAULT_WHISPER, progress: ProgressFn | None = None,
                         cancel: threading.Event | None = None) -> Path:
        """Downloads a Whisper model for speech recognition (faster-whisper's conversion, from
        Hugging Face) into paths.whisper_dir()/name and returns that folder. Offline, cancelled
        and resumed as download() is."""
        if name not in WHISPER_REPOS:
            raise ModelError(f"unknown Whisper model '{name}'; choose one of {', '.join(WHISPER_REPOS)}")
        repo_id = WHISPER_REPOS[name]
        report = progress or (lambda fraction, message: None)
        local_dir = self._fetch(repo_id, _WHISPER_FILES, "model.bin", "a faster-whisper model repository",
                                lambda total, have: 2 * (total - have), report, cancel)
        dest = paths.whisper_dir() / name
        partial = dest.with_name(dest.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(local_dir, partial, ignore=shutil.ignore_patterns(".cache"))
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(partial, dest)
        shutil.rmtree(local_dir, ignore_errors=True)
        report(1.0, f"speech recognition model {name} ready")
        log.info("downloaded %s into %s", repo_id, dest)
        return dest

    # -- helpers ---------------------------------------------------------------------------------

    def _fetch(self, repo_id: str, wanted: re.Pattern, required: str, kind: str,
               space_needed: Callable[[int, int], int], report: ProgressFn, cancel: threading.Event | None,
               offline_advice: str = "") -> Path:
        """The files of a Hugging Face repository that `wanted` matches, into its folder in
        paths.downloads_dir() (resuming what is there), reporting fractions 0 to 1. Offline, it
        fails within seconds; `space_needed(total, have)` bytes must be free first."""
        if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
            raise ModelError("downloads are switched off (HF_HUB_OFFLINE is set)" + offline_advice)
        endpoint = (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
        host = _check_reachable(endpoint)
        report(0.0, f"asking {host} for {repo_id}")
        files = _list_files(repo_id, endpoint, host, wanted, required, kind)
        total = sum(size for _, size in files) or 1
        local_dir = paths.downloads_dir() / repo_id.replace("/", "--")
        have = sum(_local_size(local_dir / name) for name, _ in files)
        self._check_space(space_needed(total, have), f"download {repo_id}", local_dir)
        done_before = 0
        for name, size in files:
            if cancel is not None and cancel.is_set():
                raise ConversionCancelled("download cancelled")
            _download_file(repo_id, name, local_dir, endpoint, host,
                           lambda n, base=done_before, name=name: report(
                               min(1.0, (base + n) / total),
                               f"downloading {name} ({(base + n) / 2**20:.0f} of {total / 2**20:.0f} MiB)"),
                           cancel)
            done_before += size
        return local_dir

    def _unique(self, name: str) -> Path:
        name = Path(re.sub(r"[^\w.+-]+", "-", name).lstrip(".") or "model" + SUFFIX)
        suffix = name.suffix
        # a name a file system takes (255 bytes), the suffix kept
        stem = name.stem.encode("utf-8")[:MAX_NAME_BYTES].decode("utf-8", "ignore").rstrip("-.") or "model"
        path = self.root / (stem + suffix)
        n = 2
        while path.exists() or any(self.root.glob(glob.escape(path.name) + "*.partial")):
            path = self.root / f"{stem}-{n}{suffix}"
            n += 1
        return path

    def _check_space(self, needed: int, what: str, folder: Path | None = None) -> None:
        folder = folder if folder is not None and folder.exists() else self.root
        try:
            free = shutil.disk_usage(folder).free
        except OSError:
            return
        if needed > 0 and free < needed + (64 << 20):
            raise ModelError(f"not enough disk space to {what}: {needed / 2**30:.1f} GiB needed, "
                             f"{free / 2**30:.1f} GiB free in {folder}")


# ---- Hugging Face -----------------------------------------------------------------------------

def _check_reachable(endpoint: str, timeout: float = 5.0) -> str:
    """The endpoint's host; ModelError at once when it cannot be connected to (no network, no
    name resolution, a refused port). Skipped behind a proxy (huggingface_hub then reports)."""
    url = urllib.parse.urlsplit(endpoint)
    host = url.hostname or endpoint
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ModelError(f"HF_ENDPOINT {endpoint!r} is not an http(s) address")
    proxies = urllib.request.getproxies()
    if url.scheme in proxies and not urllib.request.proxy_bypass(url.hostname):
        return host
    port = url.port or (443 if url.scheme == "https" else 80)
    advice = "are you offline? Download the model folder on a connected computer and import it instead"
    # the name lookup has no timeout of its own (a dead resolver can take a minute): a thread's
    lookup: dict = {}

    def resolve() -> None:
        try:
            lookup["addresses"] = socket.getaddrinfo(url.hostname, port, type=socket.SOCK_STREAM)
        except OSError as e:
            lookup["error"] = e

    thread = threading.Thread(target=resolve, name="vocable-resolve", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise ModelError(f"cannot reach {host}: the name lookup timed out; {advice}")
    if "error" in lookup:
        e = lookup["error"]
        raise ModelError(f"cannot reach {host}: the name does not resolve ({e.strerror or e}); {advice}")
    error: OSError | None = None
    for family, kind, proto, _, address in lookup["addresses"][:4]:
        try:
            with socket.socket(family, kind, proto) as s:
                s.settimeout(timeout)
                s.connect(address)
            return host
        except OSError as e:
            error = e
    reason = "timed out" if isinstance(error, TimeoutError) else (getattr(error, "strerror", None) or str(error))
    raise ModelError(f"cannot reach {host}: {reason}; {advice}")


def _hub_error(e: Exception, repo_id: str, host: str) -> ModelError:
    from huggingface_hub import errors

    if isinstance(e, errors.RepositoryNotFoundError):
        return ModelError(f"{repo_id} was not found on {host}")
    if isinstance(e, errors.GatedRepoError):
        return ModelError(f"{repo_id} on {host} needs you to accept its terms and log in (huggingface-cli login)")
    if isinstance(e, errors.OfflineModeIsEnabled):
        return ModelError("downloads are switched off (HF_HUB_OFFLINE is set)")
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return ModelError(f"cannot download {repo_id} from {host}: {text[:300]}")


def _list_files(repo_id: str, endpoint: str, host: str, wanted: re.Pattern, required: str,
                kind: str) -> list[tuple[str, int]]:
    """(path, size) of the files `wanted` matches; ModelError when `required` is not among them."""
    from huggingface_hub import HfApi

    try:
        info = HfApi(endpoint=endpoint).model_info(repo_id, files_metadata=True)
    except Exception as e:  # network, HTTP and hub errors all become a message
        raise _hub_error(e, repo_id, host) from e
    files = [(s.rfilename, int(s.size or 0)) for s in (info.siblings or []) if wanted.match(s.rfilename)]
    if not any(name == required for name, _ in files):
        raise ModelError(f"{repo_id} has no {required}: not {kind}")
    return sorted(files)


def _local_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _download_file(repo_id: str, name: str, local_dir: Path, endpoint: str, host: str,
                   on_bytes: Callable[[int], None], cancel: threading.Event | None) -> None:
    """One file into local_dir (resuming a partial one), reporting bytes; ConversionCancelled
    from inside the transfer when `cancel` is set."""
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.utils import tqdm as hf_tqdm

    class Bar(hf_tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True
            kwargs.pop("name", None)
            self._count = int(kwargs.get("initial") or 0)
            super().__init__(*args, **kwargs)
            on_bytes(self._count)

        def update(self, n=1):
            self._count += int(n or 0)
            on_bytes(self._count)
            if cancel is not None and cancel.is_set():
                raise ConversionCancelled("download cancelled")

    # Plain HTTP rather than the Xet protocol: bytes are reported (and a cancel acts) as they
    # arrive, from this thread.
    xet = constants.HF_HUB_DISABLE_XET
    constants.HF_HUB_DISABLE_XET = True
    try:
        hf_hub_download(repo_id, name, local_dir=str(local_dir), endpoint=endpoint, tqdm_class=Bar)
    except ConversionCancelled:
        raise
    except Exception as e:  # network, HTTP and hub errors all become a message
        raise _hub_error(e, repo_id, host) from e
    finally:
        constants.HF_HUB_DISABLE_XET = xet
    on_bytes(_local_size(local_dir / name))
