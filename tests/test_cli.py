"""The command line, driven as a user would: through a subprocess."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from conftest import cosine, fixture_dir, portaudio_loads, reference, without_portaudio
from vocable import Voice


def vocable(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "vocable", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout)


def test_help_lists_commands(cli_env):
    proc = vocable("--help", env=cli_env)
    assert proc.returncode == 0
    for cmd in ("convert", "embed", "say", "bench"):
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


# -- vocable say -----------------------------------------------------------------------------------

REF = fixture_dir("0.6b") / "reference" / "ref_24k.wav"


def say(model, *args, env, timeout=300):
    return vocable("say", "--model", model, *args, env=env, timeout=timeout)


def test_say_writes_audio(tmp_path, cli_env, converted):
    import soundfile as sf
    out = tmp_path / "hello.wav"
    proc = say(converted("0.6b", "f32"), "--ref", REF, "--ref-text", "Okay. Yeah.", "--text", "Hello world.",
               "--max-frames", "9", "--seed", "5", "--out", out, env=cli_env)
    assert proc.returncode == 0, proc.stderr
    info = sf.info(str(out))
    assert info.samplerate == 24000 and info.channels == 1 and info.frames == 9 * 1920
    assert "s of audio at 24000 Hz" in proc.stderr and "real-time factor" in proc.stderr
    assert "first audio after" in proc.stderr and "in-context" in proc.stderr and "seed 5" in proc.stderr
    # the same seed gives the same file
    again = tmp_path / "again.wav"
    proc = say(converted("0.6b", "f32"), "--ref", REF, "--ref-text", "Okay. Yeah.", "--text", "Hello world.",
               "--max-frames", "9", "--seed", "5", "--out", again, env=cli_env)
    assert proc.returncode == 0, proc.stderr
    assert again.read_bytes() == out.read_bytes()


def test_say_with_voice_file_and_text_file(tmp_path, cli_env, converted):
    import soundfile as sf
    model = converted("0.6b", "f32")
    voice = tmp_path / "v.voice"
    assert vocable("embed", "--model", model, "--ref", REF, "--out", voice, env=cli_env).returncode == 0
    text = tmp_path / "text.txt"
    paragraphs = [" ".join(f"Paragraph {p} sentence {i} has some words in it." for i in range(6)) for p in range(3)]
    text.write_text("\n\n".join(paragraphs), encoding="utf-8")
    out = tmp_path / "long.flac"
    proc = say(model, "--voice", voice, "--text-file", text, "--greedy", "--max-frames", "3", "--language", "English",
               "--out", out, env=cli_env)
    assert proc.returncode == 0, proc.stderr
    assert "x-vector" in proc.stderr and "3 segments" in proc.stderr
    data, rate = sf.read(str(out))
    assert rate == 24000 and data.shape == (3 * 3 * 1920,)
    # the segments went side by side (4 at a time by default); one by one gives the same file
    assert "3 segment(s), up to 4 at a time" in vocable("-v", "say", "--model", model, "--voice", voice, "--text-file",
                                                        text, "--greedy", "--max-frames", "3", "--out",
                                                        tmp_path / "again.flac", env=cli_env).stderr
    proc = say(model, "--voice", voice, "--text-file", text, "--greedy", "--max-frames", "3", "--language", "English",
               "--batch", "1", "--out", tmp_path / "one_by_one.flac", env=cli_env)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "one_by_one.flac").read_bytes() == out.read_bytes()
    for bad in ("0", "17", "four"):
        proc = say(model, "--voice", voice, "--text", "Hi.", "--batch", bad, "--out", tmp_path / "x.wav", env=cli_env)
        assert proc.returncode == 2 and "--batch: must be a whole number from 1 to 16" in proc.stderr


@pytest.mark.parametrize("portaudio", ["as installed", "missing"])
def test_say_play_without_audio_device(tmp_path, cli_env, converted, portaudio):
    """--play where PortAudio finds no output device, or where the PortAudio library itself is
    missing: a clear message, and the file anyway."""
    env = dict(cli_env, PULSE_SERVER="unix:/nonexistent/pulse")
    env.pop("XDG_RUNTIME_DIR", None)
    if portaudio == "missing":
        env = without_portaudio(env, tmp_path / "site")
    out = tmp_path / "o.wav"
    proc = say(converted("0.6b", "f32"), "--ref", REF, "--text", "Hello.", "--max-frames", "4", "--out", out,
               "--play", env=env)
    assert proc.returncode == 0, proc.stderr
    if portaudio == "missing" or not portaudio_loads():
        assert "cannot play audio: the PortAudio library is not installed (on Debian or Ubuntu: apt install " \
               "libportaudio2)" in proc.stderr
    else:
        assert "cannot play audio: no audio output device was found" in proc.stderr
    assert f"writing {out} only" in proc.stderr
    assert out.exists() and "Traceback" not in proc.stderr


def test_say_progress_on_a_terminal(tmp_path, cli_env, converted):
    """On a terminal the progress is one line rewritten in place."""
    import os
    import pty
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "vocable", "say", "--model", str(converted("0.6b", "f32")),
                             "--ref", str(REF), "--text", "Hello world, this is a test.", "--max-frames", "150",
                             "--out", str(tmp_path / "o.wav")], stdout=subprocess.DEVNULL, stderr=slave, env=cli_env)
    os.close(slave)
    data = b""
    while True:
        try:
            block = os.read(master, 4096)
        except OSError:  # the child closed its end
            break
        if not block:
            break
        data += block
    assert proc.wait(300) == 0, data.decode(errors="replace")
    os.close(master)
    text = data.decode()
    assert "\rspeaking:" in text and "s of audio" in text and "real-time factor" in text
    assert "o.wav: 12.00 s of audio" in text


@pytest.mark.parametrize("case,expected", [
    ("empty-text", "the text is empty"),
    ("empty-text-file", "holds none"),
    ("missing-text-file", "text file not found"),
    ("missing-voice", "voice file not found"),
    ("bad-voice", "not a Vocable voice file"),
    ("invisible-text", "only invisible characters"),
    ("punctuation-text", "nothing to speak"),
    ("bad-ref", "not a readable audio file"),
    ("language", "unknown language 'klingon'"),
    ("out-type", "unknown audio file type '.mp4'"),
    ("out-folder", "does not exist"),
    ("missing-model", "model file not found"),
])
def test_say_errors_are_clear(tmp_path, cli_env, converted, case, expected):
    model, out = converted("0.6b", "f32"), tmp_path / "o.wav"
    args = ["--ref", REF, "--text", "Hello."]
    if case == "empty-text":
        args = ["--ref", REF, "--text", "  \n"]
    elif case == "invisible-text":
        args = ["--ref", REF, "--text", "\u200b" * 20]
    elif case == "punctuation-text":
        args = ["--ref", REF, "--text", "... !?"]
    elif case == "empty-text-file":
        (tmp_path / "t.txt").write_text("\n\n")
        args = ["--ref", REF, "--text-file", tmp_path / "t.txt"]
    elif case == "missing-text-file":
        args = ["--ref", REF, "--text-file", tmp_path / "none.txt"]
    elif case == "missing-voice":
        args = ["--voice", tmp_path / "none.voice", "--text", "Hello."]
    elif case == "bad-voice":
        (tmp_path / "bad.voice").write_text("not a voice")
        args = ["--voice", tmp_path / "bad.voice", "--text", "Hello."]
    elif case == "bad-ref":
        (tmp_path / "bad.wav").write_text("not audio")
        args = ["--ref", tmp_path / "bad.wav", "--text", "Hello."]
    elif case == "language":
        args += ["--language", "klingon"]
    elif case == "out-type":
        out = tmp_path / "o.mp4"
    elif case == "out-folder":
        out = tmp_path / "none" / "o.wav"
    elif case == "missing-model":
        model = tmp_path / "none.gguf"
    proc = say(model, *args, "--out", out, env=cli_env)
    assert proc.returncode == 1, proc.stderr
    assert expected in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()


def test_version_names_app_engine_abi_and_ggml():
    from vocable import _engine
    proc = subprocess.run([sys.executable, "-m", "vocable", "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (
        f"vocable {_engine.__version__}; engine {_engine.version()} (ABI {_engine.ABI_VERSION}, accepts "
        f"{_engine.ABI_MIN_VERSION} to {_engine.ABI_VERSION}); ggml {_engine.ggml_version()}\n"
        f"CPU backend: {_engine.system_info()}")
    assert _engine.ggml_version()


# -- the reference is checked as the app checks it --------------------------------------------------

def reference_variant(tmp_path, name, change) -> str:
    import soundfile as sf
    clip, rate = sf.read(str(REF), dtype="float32")
    path = tmp_path / f"{name}.wav"
    sf.write(path, change(clip), rate, subtype="FLOAT")
    return path


@pytest.mark.parametrize("name, change, warning", [
    ("clipped", lambda x: np.clip(20 * x, -1, 1), "warning: clipping:"),
    ("quiet", lambda x: 0.01 / np.abs(x).max() * x, "warning: too quiet:"),  # peaks at -40 dBFS
    ("long", lambda x: np.tile(x, -(-70 * 24000 // x.size)), "warning: too long: the reference is 7"),
])
def test_embed_warns_as_the_app_does(tmp_path, cli_env, converted, name, change, warning):
    ref = reference_variant(tmp_path, name, change)
    proc = vocable("embed", "--model", converted("0.6b", "f32"), "--ref", ref, "--out", tmp_path / "v.voice",
                   env=cli_env)
    assert proc.returncode == 0, proc.stderr
    assert warning in proc.stderr
    assert (tmp_path / "v.voice").exists()


def test_say_warns_about_its_reference_too(tmp_path, cli_env, converted):
    ref = reference_variant(tmp_path, "clipped", lambda x: np.clip(20 * x, -1, 1))
    proc = say(converted("0.6b", "f32"), "--ref", ref, "--text", "Hello.", "--max-frames", "2",
               "--out", tmp_path / "o.wav", env=cli_env)
    assert proc.returncode == 0, proc.stderr
    assert "warning: clipping:" in proc.stderr


def test_embed_refuses_a_silent_reference(tmp_path, cli_env, converted):
    ref = reference_variant(tmp_path, "silent", lambda x: np.zeros_like(x))
    out = tmp_path / "v.voice"
    proc = vocable("embed", "--model", converted("0.6b", "f32"), "--ref", ref, "--out", out, env=cli_env)
    assert proc.returncode == 1
    assert "the reference is silent" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()


# -- a failed write names the file and its cause -----------------------------------------------------

def run_with_size_limit(args, env, max_bytes: int):
    """`python -m vocable ARGS` where writing past `max_bytes` in any file fails (EFBIG), as on a
    full disk."""
    import resource
    import signal

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))

    return subprocess.run([sys.executable, "-m", "vocable", *map(str, args)], capture_output=True, text=True,
                          env=dict(env, PYTHONDONTWRITEBYTECODE="1"), timeout=300, preexec_fn=limit)


def test_say_on_a_full_disk(tmp_path, cli_env, converted):
    import errno
    import os
    out = tmp_path / "o.wav"
    proc = run_with_size_limit(["say", "--model", converted("0.6b", "f32"), "--ref", REF, "--text", "Hello.",
                                "--max-frames", "9", "--out", out], cli_env, 4096)
    assert proc.returncode == 1, proc.stderr
    assert f"vocable: error: cannot write {out}: {os.strerror(errno.EFBIG)}" in proc.stderr
    assert "Traceback" not in proc.stderr and list(tmp_path.glob("*o.wav*")) == []


def test_embed_on_a_full_disk_and_into_a_fifo(tmp_path, cli_env, converted):
    import errno
    import os
    model = converted("0.6b", "f32")
    out = tmp_path / "v.voice"
    proc = run_with_size_limit(["embed", "--model", model, "--ref", REF, "--out", out], cli_env, 1024)
    assert proc.returncode == 1, proc.stderr
    assert f"cannot write the voice file {out}: {os.strerror(errno.EFBIG)}" in proc.stderr
    assert "Traceback" not in proc.stderr and list(tmp_path.glob("*v.voice*")) == []
    fifo = tmp_path / "fifo.voice"
    os.mkfifo(fifo)
    proc = vocable("embed", "--model", model, "--ref", REF, "--out", fifo, env=cli_env)
    assert proc.returncode == 1 and f"{fifo}: it exists and is not a regular file" in proc.stderr
    assert fifo.is_fifo()


def test_convert_of_a_malformed_folder_is_an_error_not_a_traceback(tmp_path, cli_env):
    import json
    import shutil
    src = tmp_path / "hf"
    shutil.copytree(fixture_dir("0.6b") / "model", src)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "talker_config": {**config["talker_config"],
                                                                             "codec_language_id": [1, 2]}}))
    proc = vocable("convert", src, tmp_path / "o.gguf", env=cli_env)
    assert proc.returncode == 1 and "its configuration is malformed" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "o.gguf").exists()


@pytest.mark.parametrize("args,expected", [
    (["say", "--max-frames", "0"], "--max-frames: must be a whole number of at least 1, not '0'"),
    (["say", "--threads", "0"], "--threads: must be a whole number of at least 1, not '0'"),
    (["say", "--seed", "-1"], "--seed: must be a whole number from 0 to"),
    (["serve", "--queue", "-1"], "--queue: must be a whole number of at least 0, not '-1'"),
    (["serve", "--port", "70000"], "--port: must be a whole number from 0 to 65535"),
    (["bench", "--frames", "ten"], "--frames: must be a whole number of at least 1, not 'ten'"),
])
def test_bad_numbers_are_refused_before_any_work(tmp_path, cli_env, args, expected):
    """Refused by the parser, before a model loads: no traceback, and the range in the message."""
    proc = vocable(*args, "--model", tmp_path / "none.gguf", env=cli_env, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert expected in proc.stderr and "Traceback" not in proc.stderr


def test_standard_input_is_read_as_utf8_whatever_the_locale(monkeypatch):
    import argparse
    import io

    from vocable.cli import _read_text
    from vocable.errors import VocableError

    text = "Café, naïve — 東京."
    args = argparse.Namespace(text=None, text_file="-")
    # what a Windows pipe is without PYTHONUTF8: a cp1252 text stream over UTF-8 bytes
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(("\ufeff" + text).encode("utf-8")), encoding="cp1252"))
    assert _read_text(args) == text
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO("Café".encode("latin-1")), encoding="utf-8"))
    with pytest.raises(VocableError, match="standard input is not UTF-8 text"):
        _read_text(args)
