"""The import rules of ARCHITECTURE.md, read from the source: every import statement of the
package, also those inside functions, resolved to the module it names."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "app" / "vocable"

QT = ("PySide6", "shiboken6", "PyQt5", "PyQt6")
AUDIO_DEVICES = ("sounddevice", "vocable.audio.devices", "vocable.audio.playback", "vocable.audio.recorder")
ENGINE = ("vocable.engine", "vocable._engine")

# (the modules a rule covers, what they must not import, why)
RULES = [
    ("vocable.engine", AUDIO_DEVICES + ("vocable.gui", "vocable.bench", "vocable.cli"),
     "the engine reads and writes audio files but never touches a device, and knows no front end"),
    ("vocable.library", ENGINE + AUDIO_DEVICES + ("vocable.gui", "vocable.bench", "vocable.cli"),
     "the library keeps the user's files; it runs no engine"),
    ("vocable.audio", ENGINE + ("vocable.library", "vocable.gui", "vocable.bench", "vocable.cli"),
     "audio is the bottom layer above the shared modules"),
    ("vocable.bench", ("vocable.gui", "vocable.cli"), "the bench runs headless"),
    ("vocable.gui", ("vocable.bench", "vocable.cli"), "the GUI is a front end beside the CLI"),
    ("vocable.server", QT + AUDIO_DEVICES + ("vocable.gui", "vocable.bench", "vocable.cli"),
     "the speech API is a headless front end: the engine and the library, never Qt or a sound device"),
    ("vocable.errors", ("vocable.",), "shared by every layer"),
    ("vocable.untrusted", ("vocable.",), "shared by every layer"),
    ("vocable.store", ENGINE + ("vocable.audio", "vocable.library", "vocable.gui", "vocable.bench"),
     "shared by every layer"),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports_of(path: Path) -> set[str]:
    """The modules `path` imports; `from . import x` counts as the module x where x is one."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = ".".join(base[: len(base) - (node.level - 1)] + ([node.module] if node.module else []))
            else:
                base = node.module
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names if is_module(f"{base}.{alias.name}"))
    return found


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def names(prefixes: tuple[str, ...], imported: set[str]) -> list[str]:
    return sorted(m for m in imported if any(m == p or m.startswith(p if p.endswith(".") else p + ".")
                                             for p in prefixes))


def test_the_rules_see_the_imports():
    imports = {module_name(p): imports_of(p) for p in sources()}
    assert "vocable.audio.files" in imports["vocable.engine.engine"] or any(
        "vocable.audio.files" in found for name, found in imports.items() if name.startswith("vocable.engine"))
    assert any(names(QT, found) for name, found in imports.items() if name.startswith("vocable.gui"))
    assert names(("vocable.library",), imports["vocable.engine.models"])  # a relative import resolved


def test_nothing_outside_the_gui_imports_qt():
    offenders = {module_name(p): names(QT, imports_of(p)) for p in sources()
                 if not module_name(p).startswith("vocable.gui")}
    assert {m: found for m, found in offenders.items() if found} == {}


@pytest.mark.parametrize("layer, forbidden, why", RULES, ids=[rule[0] for rule in RULES])
def test_layer_imports(layer, forbidden, why):
    covered = [p for p in sources() if module_name(p) == layer or module_name(p).startswith(layer + ".")]
    assert covered, f"no module in {layer}"
    offenders = {module_name(p): names(forbidden, imports_of(p)) for p in covered}
    assert {m: found for m, found in offenders.items() if found} == {}, why


def test_every_module_says_its_job_and_stays_readable():
    """An opening docstring in every module; none over ~500 lines without the reason in it."""
    missing, long = [], []
    for path in sources():
        text = path.read_text(encoding="utf-8")
        doc = ast.get_docstring(ast.parse(text))
        if not doc and path.name != "__main__.py":
            missing.append(module_name(path))
        lines = text.count("\n")
        if lines > 550 and "over 500 lines" not in (doc or ""):
            long.append(f"{module_name(path)} ({lines} lines)")
    assert missing == []
    assert long == []


PUBLIC_API = ("IN_CONTEXT", "X_VECTOR", "AudioChunk", "AudioDeviceError", "AudioError", "Engine", "EngineError",
              "ModelError", "Progress", "Synthesis", "SynthesisCancelled", "SynthesisResult", "VocableError", "Voice",
              "VoiceError", "__version__")


def test_the_public_api_stays_where_users_import_it():
    """`from vocable import ...` gives the same objects whatever folder they live in now."""
    import vocable
    import vocable.engine
    import vocable.errors
    import vocable.library.voice

    assert sorted(vocable.__all__) == sorted(PUBLIC_API)
    for name in PUBLIC_API:
        assert getattr(vocable, name) is not None, name
    assert vocable.Engine is vocable.engine.Engine and vocable.Synthesis is vocable.engine.Synthesis
    assert vocable.Voice is vocable.library.voice.Voice and vocable.VocableError is vocable.errors.VocableError
    for name in vocable.engine.__all__:
        assert getattr(vocable.engine, name) is not None, name
