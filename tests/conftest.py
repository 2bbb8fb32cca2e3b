"""Shared test fixtures: the committed tiny reference models and their converted GGUFs."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

FIXTURES = Path(__file__).parent / "fixtures"
VARIANTS = ("0.6b", "1.7b")
REPO = Path(__file__).resolve().parents[1]


def fixture_dir(variant: str) -> Path:
    return FIXTURES / f"tiny-{variant}"


def reference(variant: str, name: str) -> np.ndarray:
    return np.load(fixture_dir(variant) / "reference" / f"{name}.npy")


def manifest(variant: str) -> dict:
    return json.loads((fixture_dir(variant) / "reference" / "manifest.json").read_text())


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="session")
def converted(tmp_path_factory):
    """converted(variant, weight_type) -> path of the tiny fixture model as GGUF (cached)."""
    from vocable.engine.convert import convert

    cache: dict[tuple[str, str], Path] = {}

    def get(variant: str = "0.6b", weight_type: str = "f32") -> Path:
        key = (variant, weight_type)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"model-{variant}-{weight_type}") / "model.gguf"
            cache[key] = convert(fixture_dir(variant) / "model", out, weight_type)
        return cache[key]

    return get


@pytest.fixture(scope="module")
def engine(converted):
    """The tiny 0.6B-like fixture model (f32) on two threads, one per test module."""
    from vocable import Engine
    with Engine(converted("0.6b", "f32"), threads=2) as e:
        yield e


@pytest.fixture(scope="module")
def voice():
    """The fixture reference's speaker embedding, as an x-vector voice."""
    from vocable import Voice
    return Voice(reference("0.6b", "speaker_embedding"))


@pytest.fixture(scope="module")
def reference_clip() -> np.ndarray:
    """The fixture reference clip, mono 24 kHz float32."""
    return reference("0.6b", "ref_wav_24k")


@pytest.fixture
def cli_env(tmp_path):
    """Environment for running `python -m vocable` in a subprocess."""
    env = dict(os.environ)
    env["HOME"] = str(tmp_path / "home")
    env["XDG_DATA_HOME"] = str(tmp_path / "data")
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    return env


@pytest.fixture(scope="session")
def qapp():
    """pytest-qt's application, made the way the app makes it (names, window icon, palette)."""
    from vocable.gui.app import make_application
    return make_application([])


def portaudio_loads() -> bool:
    """Whether sounddevice finds the PortAudio library (Debian: libportaudio2) here."""
    try:
        import sounddevice  # noqa: F401
    except OSError:
        return False
    return True


def without_portaudio(env: dict, folder: Path) -> dict:
    """`env` for a Python subprocess that behaves as on a machine without the PortAudio library:
    a sitecustomize makes ctypes.util.find_library miss it, as sounddevice then does."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        "import ctypes.util\n"
        "_find = ctypes.util.find_library\n"
        "ctypes.util.find_library = lambda name: None if 'portaudio' in name else _find(name)\n")
    return dict(env, PYTHONPATH=os.pathsep.join(filter(None, [str(folder), env.get("PYTHONPATH")])))
