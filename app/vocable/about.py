"""What Vocable is made of: its versions, the components it carries and their licenses.

    versions()          [("Vocable", "0.1.0"), ("Engine", "0.1.0 (ABI 3, accepts 3 to 3)"), ...]
    components()        every component Vocable runs with, with its license and license texts
    model_license(entry)  the license recorded in a converted model, or what is known about it

The same text backs `vocable about` and the about dialog. Components are found, not listed by
hand: the Python distributions Vocable requires (walked from its own metadata, so a new
dependency appears by itself), plus what those carry without metadata of their own (Qt inside
PySide6, libsndfile inside soundfile), Python itself, and in a bundle the system libraries the
bundle copied from the build machine with their distribution's copyright files.
"""
from __future__ import annotations

import importlib.metadata as metadata
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
LICENSE_NAME = re.compile(r"(^|/)(LICEN[CS]E|COPYING|NOTICE|COPYRIGHT)[^/]*$", re.IGNORECASE)
# Where a bundle keeps license texts that have no Python distribution to live in (packaging/vocable.spec).
BUNDLE_LICENSES = "licenses"
BUNDLE_PYTHON_LICENSE = f"{BUNDLE_LICENSES}/python/LICENSE.txt"
BUNDLE_SYSTEM_LICENSES = f"{BUNDLE_LICENSES}/system"
MODEL_CARD = "https://huggingface.co/{repo}"
CLASSIFIER_SPDX = {"Apache Software License": "Apache-2.0", "MIT License": "MIT"}


@dataclass(frozen=True)
class LicenseText:
    title: str      # the file's name within its component: "LICENSE", "_soundfile_data/COPYING"
    text: str


@dataclass(frozen=True)
class Component:
    name: str
    version: str
    license: str                         # an SPDX expression where the component gives one
    role: str                            # what it is, in a few words
    texts: tuple[LicenseText, ...] = field(default=(), repr=False)


def _key(name: str) -> str:
    """A distribution name normalised as pip compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


# What each distribution is to Vocable, by normalised name; others are described by their own summary.
ROLES = {_key(name): role for name, role in {
    "vocable": "this app",
    "PySide6-Essentials": "the Qt 6 user interface (Qt's libraries and plugins are inside)",
    "shiboken6": "PySide6's binding runtime",
    "soundfile": "reading and writing audio files (libsndfile is inside)",
    "sounddevice": "audio playback and recording through PortAudio",
    "soxr": "resampling reference audio",
    "tokenizers": "the text tokenizer",
    "gguf": "writing converted models",
    "safetensors": "reading model checkpoints and voice files",
    "huggingface_hub": "downloading models",
    "platformdirs": "where models, voices and history are kept",
    "numpy": "arrays",
    "fastapi": "the speech API's routes (vocable serve)",
    "uvicorn": "the speech API's HTTP server",
    "python-multipart": "voice uploads to the speech API",
}.items()}


def _frozen_root() -> Path | None:
    root = getattr(sys, "_MEIPASS", None)
    return Path(root) if getattr(sys, "frozen", False) and root else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _spdx(dist: metadata.Distribution) -> str:
    meta = dist.metadata
    expression = meta.get("License-Expression")
    if expression:
        return expression
    text = (meta.get("License") or "").strip()
    if text and "\n" not in text and len(text) < 80:
        return text
    classifiers = [c.split(" :: ")[-1] for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    return " OR ".join(CLASSIFIER_SPDX.get(c, c) for c in classifiers) or "see its license text"


def license_files(dist: metadata.Distribution) -> list[str]:
    """The distribution's license files, as paths relative to where it is installed."""
    names = (str(f) for f in dist.files or () if LICENSE_NAME.search(str(f)) and not str(f).endswith(".py"))
    return sorted(set(names))


def _standard_texts(expression: str) -> tuple[LicenseText, ...]:
    """The standard texts of the licenses an expression names, for components that ship none."""
    return tuple(LicenseText(p.stem, _read(p) or "") for p in sorted((DATA / "licenses").glob("*.txt"))
                 if re.search(rf"(^|[^A-Za-z]){re.escape(p.stem)}($|[^.\d])", expression))


def _texts(dist: metadata.Distribution) -> tuple[LicenseText, ...]:
    texts = []
    for name in license_files(dist):
        text = _read(Path(dist.locate_file(name)))
        if text is not None:
            title = name.split(".dist-info/", 1)[-1].removeprefix("licenses/")
            texts.append(LicenseText(title, text))
    return tuple(texts)


def _requirement_name(requirement: str) -> str | None:
    """The distribution a Requires-Dist line names, or None for an optional (extra) one."""
    name, _, marker = requirement.partition(";")
    if "extra" in marker:
        return None
    return re.match(r"[A-Za-z0-9._-]+", name.strip())[0]


def distributions(root: str = "vocable") -> list[metadata.Distribution]:
    """`root` and every distribution it requires, installed here, each once, in walk order."""
    found: dict[str, metadata.Distribution] = {}
    pending = [root]
    while pending:
        name = pending.pop(0)
        key = _key(name)
        if key in found:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # a requirement whose marker excludes this platform
        found[key] = dist
        pending += [n for n in map(_requirement_name, dist.requires or []) if n]
    return list(found.values())


def _ggml() -> Component:
    """ggml, built into Vocable from its source (cmake/ggml.cmake): the libraries and CPU variants
    in vocable/lib/ beside the engine module, with their license."""
    from . import _engine
    text = _read(Path(_engine.__file__).resolve().parent / "lib" / "ggml-LICENSE")
    return Component("ggml", _engine.ggml_version(), "MIT", "the tensor library the engine runs on, built with Vocable",
                     (LicenseText("LICENSE", text),) if text else ())


def _bundled_libraries() -> list[Component]:
    """Libraries the Python distributions carry without metadata of their own."""
    extra = [_ggml()]
    if (DATA / "qwen-tokenizer" / "SOURCE.md").is_file():
        extra.append(Component("Qwen text tokenizer", "Qwen2.5/Qwen3", "Apache-2.0",
                               "the vocabulary of the benchmark's random model, in data/qwen-tokenizer",
                               _standard_texts("Apache-2.0")))
    try:
        import soundfile
        copying = tuple(t for t in _texts(metadata.distribution("soundfile")) if t.title.startswith("_soundfile_data/"))
        extra.append(Component("libsndfile", soundfile.__libsndfile_version__, "LGPL-2.1-or-later",
                               "audio file formats, inside soundfile", copying))
    except (ImportError, OSError, metadata.PackageNotFoundError):
        pass
    pyside = _pyside_version()
    if pyside:
        # LGPL-3.0 is a set of permissions added to GPL-3.0, so both texts go with it.
        extra.append(Component("Qt", _qt_version(pyside), "LGPL-3.0-only",
                               "user interface libraries, inside PySide6", _standard_texts("LGPL-3.0 GPL-3.0")))
    try:
        import sounddevice
        text = _read(DATA / "licenses" / "PortAudio.txt")
        described = sounddevice.get_portaudio_version()[1]  # "PortAudio V19.6.0-devel, revision ..."
        version = re.search(r"V?(\d+[.\d]*[-\w]*)", described)
        extra.append(Component("PortAudio", version[1] if version else described, "MIT",
                               "audio devices, used by sounddevice", (LicenseText("LICENSE", text),) if text else ()))
    except (ImportError, OSError):
        pass
    return extra


def _python() -> Component:
    frozen = _frozen_root()
    path = frozen / BUNDLE_PYTHON_LICENSE if frozen else python_license_file()
    text = _read(path) if path else None
    version = ".".join(map(str, sys.version_info[:3]))
    return Component("Python", version, "PSF-2.0", "the interpreter" + (", inside this bundle" if frozen else ""),
                     (LicenseText("LICENSE.txt", text),) if text else ())


def python_license_file() -> Path | None:
    """The running interpreter's own LICENSE.txt (packaging copies it into a bundle)."""
    import sysconfig
    path = Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt"
    return path if path.is_file() else None


def _system_libraries() -> Component | None:
    """In a Linux bundle: the system libraries copied from the build machine (see packaging)."""
    frozen = _frozen_root()
    folder = frozen / BUNDLE_SYSTEM_LICENSES if frozen else None
    if folder is None or not folder.is_dir():
        return None
    texts = tuple(LicenseText(p.stem, _read(p) or "") for p in sorted(folder.glob("*.txt")))
    return Component("System libraries", "from the build machine", "various (each package's copyright file)",
                     "libraries the bundle carries so that it runs without them installed", texts)


def components() -> list[Component]:
    found = []
    for dist in distributions():
        name = dist.metadata["Name"]
        role = ROLES.get(_key(name)) or (dist.metadata.get("Summary") or "").strip().rstrip(".")
        expression = _spdx(dist)
        found.append(Component(name, dist.version, expression, role, _texts(dist) or _standard_texts(expression)))
    found += _bundled_libraries()
    found.append(_python())
    system = _system_libraries()
    if system:
        found.append(system)
    return found


def _pyside_version() -> str | None:
    """PySide6's version from its metadata: importing it here would load Qt outside the GUI."""
    for name in ("PySide6-Essentials", "PySide6"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _qt_version(pyside: str) -> str:
    """The Qt inside a PySide6 release: its first three numbers (6.8.0.2 is a rebuild on Qt 6.8.0)."""
    return ".".join(pyside.split(".")[:3])


def versions() -> list[tuple[str, str]]:
    from . import _engine
    rows = [("Vocable", _engine.__version__),
            ("Engine", f"{_engine.version()} (ABI {_engine.abi_version()}, accepts {_engine.abi_min_version()} "
                       f"to {_engine.abi_version()})"),
            ("ggml", _engine.ggml_version()),
            ("CPU backend", _engine.system_info()),
            ("Devices found", devices_text())]
    pyside = _pyside_version()
    if pyside:
        rows.append(("Qt", f"{_qt_version(pyside)} (PySide6 {pyside})"))
    rows.append(("Python", sys.version.split()[0]))
    return rows


def devices_text() -> str:
    """The devices ggml finds, the CPU first, with each GPU's memory; then why a device backend
    shipped with the engine found none (no Vulkan loader on this machine, say)."""
    from . import _engine
    parts = []
    for d in _engine.devices():
        memory = f", {d['memory_total'] / 2 ** 30:.1f} GiB" if d["kind"] != "cpu" and d["memory_total"] else ""
        parts.append(f"{d['id']} ({d['description']}{memory})")
    notes = _engine.device_notes().splitlines()
    return ", ".join(parts) + "".join(f"; {note}" for note in notes)


def model_license(license: str | None, repo: str | None = None) -> str:
    """What to tell a user about a model's license, from what its GGUF records."""
    if license:
        return license
    card = MODEL_CARD.format(repo=repo) if repo else "the model card of the Hugging Face repository it came from"
    return f"not recorded in this model file; see {card}"


def report(model: tuple[str, str | None] | None = None, with_texts: bool = False) -> str:
    """Plain text for `vocable about`: versions, the model's license, the components and, with
    `with_texts`, every license text."""
    lines = [f"{name}: {value}" for name, value in versions()]
    if model:
        lines.append(f"Model: {model[0]}; license: {model_license(model[1])}")
    lines += ["", "Components and their licenses:"]
    found = components()
    for c in found:
        lines.append(f"  {c.name} {c.version}: {c.license} ({c.role})"
                     + ("" if c.texts else "; no license text found"))
    if with_texts:
        for c in found:
            for t in c.texts:
                lines += ["", f"==== {c.name}: {t.title} ====", t.text.rstrip()]
    return "\n".join(lines)
