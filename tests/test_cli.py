"""The command line, driven as a user would: through a subprocess."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from conftest import cosine, fixture_dir, reference
from vocable import Voice


def vocable(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "vocable", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout)


def test_help_lists_commands(cli_env):
    proc = vocable("--help", env=cli_env)
    assert proc.returncode == 0
    for cmd in ("convert", "embed", "bench"):
        assert cmd in proc.stdout


def test_convert_then_embed(tmp_path, cli_env):
    model = tmp_path / "tiny.gguf"
    proc = vocable("convert", fixture_dir("0.6b") / "model", model, "--type", "q8_0", env=cli_env)
    assert proc.returncode == 0, proc.stderr
    assert model.exists() and "100.0%" in proc.stderr

    voice_path = tmp_path / "ada.voice"
    proc = vocable("embed", "--model", model, "--ref", fixture_dir("0.6b") / "reference" / "ref_24k.wav",
                   "--ref-text", "Okay. Yeah.", "--out", voice_path, env=cli_env)
    assert proc.returncode == 0, proc.stderr
    assert "in-context" in proc.stderr
    voice = Voice.load(voice_path)
    assert voice.ref_text == "Okay. Yeah." and voice.name == "ref_24k"
    assert voice.codes.shape == reference("0.6b", "ref_codes").shape
    assert cosine(voice.speaker_embedding, reference("0.6b", "speaker_embedding")) > 0.99


def test_embed_dump_dir(tmp_path, cli_env, converted):
    dump = tmp_path / "dump"
    proc = vocable("embed", "--model", converted("0.6b", "f32"), "--ref",
                   fixture_dir("0.6b") / "reference" / "ref_24k.wav", "--out", tmp_path / "v.voice",
                   "--dump-dir", dump, env=cli_env)
    assert proc.returncode == 0, proc.stderr
    assert "x-vector only" in proc.stderr
    names = {p.stem for p in dump.glob("*.npy")}
    assert {"mel", "spk_asp", "speaker_embedding", "enc_seanet", "enc_latent", "ref_codes"} <= names
    assert np.load(dump / "ref_codes.npy").dtype == np.int32


@pytest.mark.parametrize("case", ["missing-model", "missing-ref", "bad-ref", "convert-bad-folder"])
def test_errors_are_clear(tmp_path, cli_env, converted, case):
    ref = fixture_dir("0.6b") / "reference" / "ref_24k.wav"
    if case == "missing-model":
        proc = vocable("embed", "--model", tmp_path / "none.gguf", "--ref", ref, "--out", tmp_path / "v", env=cli_env)
        expected = "model file not found"
    elif case == "missing-ref":
        proc = vocable("embed", "--model", converted("0.6b", "f32"), "--ref", tmp_path / "none.wav",
                       "--out", tmp_path / "v", env=cli_env)
        expected = "audio file not found"
    elif case == "bad-ref":
        bad = tmp_path / "bad.wav"
        bad.write_text("not audio")
        proc = vocable("embed", "--model", converted("0.6b", "f32"), "--ref", bad, "--out", tmp_path / "v", env=cli_env)
        expected = "not a readable audio file"
    else:
        proc = vocable("convert", tmp_path, tmp_path / "o.gguf", env=cli_env)
        expected = "config.json is missing"
    assert proc.returncode == 1
    assert expected in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "v").exists()
