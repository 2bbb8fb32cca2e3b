"""What Vocable says about itself: versions, the licenses of what it carries (found from the
installed metadata, with their texts), the model's license from its model card through the
GGUF file, `vocable about` as a user runs it, and the about dialog."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import fixture_dir

ROOT = Path(__file__).resolve().parent.parent
CARD = """---
license: apache-2.0
language:
- en
pipeline_tag: text-to-speech
---
# Qwen3-TTS
"""


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_dependency_is_listed_with_a_license_text():
    from vocable import about

    found = {_key(c.name): c for c in about.components()}
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for requirement in declared:
        name = _key(re.match(r"[A-Za-z0-9._-]+", requirement)[0])
        assert name in found, f"{name} is a dependency but the about list lacks it"
    for name in ("vocable", "qt", "libsndfile", "python"):
        assert name in found
    try:
        import sounddevice  # noqa: F401
        assert "portaudio" in found
    except OSError:  # no PortAudio on this machine: nothing to list
        pass
    for component in found.values():
        assert component.license and component.version, component
        assert component.texts and all(t.text.strip() for t in component.texts), \
            f"{component.name} has no license text"
    assert found["vocable"].texts[0].text == (ROOT / "LICENSE").read_text()
    assert any("GNU LESSER GENERAL PUBLIC LICENSE" in t.text for t in found["qt"].texts)
    assert any("GNU LESSER GENERAL PUBLIC LICENSE" in t.text for t in found["libsndfile"].texts)


def test_versions_name_the_engine_abi_range_and_ggml():
    from vocable import _engine, about

    versions = dict(about.versions())
    assert versions["Vocable"] == _engine.__version__
    assert versions["Engine"] == (f"{_engine.version()} (ABI {_engine.abi_version()}, accepts "
                                  f"{_engine.abi_min_version()} to {_engine.abi_version()})")
    assert re.fullmatch(r"\d+\.\d+\.\d+", versions["ggml"])


@pytest.mark.parametrize("card, expected", [
    (CARD, "apache-2.0"),
    ("---\nlicense: 'mit'\n---\n", "mit"),
    ("---\nlicense: other\nlicense_name: qwen-research\nlicense_link: LICENSE\n---\n", "qwen-research"),
    ("---\nlanguage: en\n---\nlicense: not in the front matter\n", None),
    ("# no front matter\nlicense: apache-2.0\n", None),
    (None, None),
])
def test_model_card_license(tmp_path, card, expected):
    from vocable.engine.model_folder import model_card_license

    readme = tmp_path / "README.md"
    if card is not None:
        readme.write_text(card)
    assert model_card_license(readme) == expected


@pytest.fixture
def folder_with_card(tmp_path):
    folder = tmp_path / "Qwen3-TTS-12Hz-0.6B-Base"
    shutil.copytree(fixture_dir("0.6b") / "model", folder)
    (folder / "README.md").write_text(CARD)
    return folder


def test_the_model_license_goes_from_the_card_through_the_gguf(folder_with_card, tmp_path, monkeypatch, converted):
    from vocable.engine.models import ModelStore

    monkeypatch.setenv("VOCABLE_HOME", str(tmp_path / "home"))
    store = ModelStore()
    entry = store.import_hf_folder(folder_with_card, "f32")
    assert entry.license == "apache-2.0"
    assert store.describe(converted("0.6b", "f32")).license is None  # converted from a folder without a card


def test_vocable_about_on_the_command_line(folder_with_card, tmp_path, cli_env, converted):
    from vocable.engine.convert import convert

    model = convert(folder_with_card, tmp_path / "carded.gguf", "f32")
    cli_env["VOCABLE_HOME"] = str(tmp_path / "home")
    run = subprocess.run([sys.executable, "-m", "vocable", "about", "--model", str(model)],
                         capture_output=True, text=True, env=cli_env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "Engine: " in run.stdout and "accepts" in run.stdout
    assert "license: apache-2.0" in run.stdout
    assert "no license text found" not in run.stdout
    lines = [line for line in run.stdout.splitlines() if line.startswith("  ")]
    assert any(line.startswith("  Qt ") and "LGPL-3.0" in line for line in lines)

    full = subprocess.run([sys.executable, "-m", "vocable", "about", "--licenses", "--model",
                           str(converted("0.6b", "f32"))], capture_output=True, text=True, env=cli_env, timeout=120)
    assert full.returncode == 0, full.stderr
    assert "license: not recorded in this model file" in full.stdout
    assert full.stdout.count("==== ") >= len(lines)
    assert "Apache License" in full.stdout and "GNU LESSER GENERAL PUBLIC LICENSE" in full.stdout

    missing = subprocess.run([sys.executable, "-m", "vocable", "about", "--model", str(tmp_path / "none.gguf")],
                             capture_output=True, text=True, env=cli_env, timeout=120)
    assert missing.returncode == 1
    assert "model file not found" in missing.stderr


def test_the_package_icon_is_the_assets_icon():
    from vocable.gui.app import APP_ICON

    assert APP_ICON.read_bytes() == (ROOT / "assets" / "icons" / "vocable.png").read_bytes()
