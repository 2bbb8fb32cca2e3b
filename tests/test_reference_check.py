"""The reference check on real signals: espeak-ng speech (padded with silence, in noise, at other
rates and channel counts, cut short, made long, clipped, made quiet, with long pauses), sines,
noise and silence."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import soxr

from vocable.audio.files import read_audio
from vocable.errors import AudioError
from vocable.audio.reference import (CLIP_RUN, GOOD_SECONDS, MIN_SPEECH_RATIO, QUIET_PEAK_DBFS, ReferenceCheck,
                                     check_reference, clipped_samples, frame_levels)

TEXT = "The quick brown fox jumps over the lazy dog. Then a second sentence follows it, a little slower."


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> tuple[np.ndarray, int]:
    """espeak-ng's speech of TEXT, mono float32 at its own 22050 Hz, its own short silences
    at the ends cut off (so the test knows where the speech is)."""
    if not shutil.which("espeak-ng"):
        pytest.skip("needs espeak-ng (apt install espeak-ng)")
    wav = tmp_path_factory.mktemp("espeak") / "speech.wav"
    subprocess.run(["espeak-ng", "-w", str(wav), TEXT], check=True, capture_output=True, timeout=60)
    samples, rate = read_audio(wav)
    x = samples[:, 0]
    loud = np.nonzero(np.abs(x) > 1e-3)[0]
    x = x[loud[0]:loud[-1] + 1]
    return (0.7 * x / np.abs(x).max()).astype(np.float32), rate  # peaks at -3 dBFS


def silence(seconds: float, rate: int) -> np.ndarray:
    return np.zeros(int(round(seconds * rate)), dtype=np.float32)


def white_noise(seconds: float, rate: int, dbfs: float, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(int(round(seconds * rate)))
    return (x * 10 ** (dbfs / 20)).astype(np.float32)  # RMS at `dbfs`


def sine(seconds: float, rate: int, freq: float = 220.0, amplitude: float = 0.5) -> np.ndarray:
    return (amplitude * np.sin(2 * np.pi * freq * np.arange(int(round(seconds * rate))) / rate)).astype(np.float32)


def same_audio(check: ReferenceCheck, x: np.ndarray, rate: int) -> None:
    """`check.samples` holds all of `x` (at 24 kHz), in one piece."""
    ref = soxr.resample(x, rate, 24000).astype(np.float64)
    out = check.samples.astype(np.float64)
    corr = np.fft.irfft(np.fft.rfft(out, 1 << 22) * np.conj(np.fft.rfft(ref, 1 << 22)), 1 << 22)
    k = int(np.argmax(corr[:out.size]))
    assert k + ref.size <= out.size + 24, (k, ref.size, out.size)  # none of it cut away
    seg = out[k:k + ref.size]
    assert seg @ ref[:seg.size] / (np.linalg.norm(seg) * np.linalg.norm(ref[:seg.size])) > 0.99


def test_clean_speech_padded_with_silence(speech):
    x, rate = speech
    padded = np.concatenate([silence(1.0, rate), x, silence(1.5, rate)])
    check = check_reference(padded, rate)
    assert check.warnings == [] and check.ok, check.warnings
    assert check.sample_rate == 24000 and check.samples.dtype == np.float32 and check.samples.ndim == 1
    assert check.source_rate == rate and check.source_channels == 1
    # the silence goes, up to the 100 ms margin kept around the speech
    assert check.trimmed_start == pytest.approx(0.9, abs=0.04) and check.trimmed_end == pytest.approx(1.4, abs=0.04)
    assert check.seconds == pytest.approx(x.size / rate + 0.2, abs=0.05)
    same_audio(check, x, rate)
    assert check.peak_db == pytest.approx(20 * np.log10(0.7), abs=0.5)
    assert -30 < check.rms_db < -10
    assert check.speech_ratio > 0.7
    assert f"resampled from {rate} Hz to 24000 Hz" in check.notes
    assert (f"trimmed {check.trimmed_start:.2f} s of silence at the start and {check.trimmed_end:.2f} s at the end"
            in check.notes), check.notes


def test_untrimmed_keeps_everything(speech):
    x, rate = speech
    padded = np.concatenate([silence(1.0, rate), x, silence(1.0, rate)])
    check = check_reference(padded, rate, trim=False)
    assert check.trimmed_start == check.trimmed_end == 0
    assert check.seconds == pytest.approx(padded.size / rate, abs=1e-3)
    assert check.warnings == [] and not any("trimmed" in n for n in check.notes)


def test_stereo_48k_speech_in_room_noise(speech):
    """Speech over a -50 dBFS noise floor, with 1 s of that noise alone at each end, in stereo at
    48 kHz: the noise-only ends are trimmed like silence."""
    x, rate = speech
    x48 = soxr.resample(x, rate, 48000).astype(np.float32)
    mono = np.concatenate([silence(1.0, 48000), x48, silence(1.0, 48000)])
    left = mono + white_noise(mono.size / 48000, 48000, -50, seed=1)
    right = 0.5 * mono + white_noise(mono.size / 48000, 48000, -50, seed=2)
    check = check_reference(np.stack([left, right], axis=1), 48000)
    assert check.warnings == [], check.warnings
    assert "mixed 2 channels down to mono" in check.notes and check.source_channels == 2
    assert check.trimmed_start == pytest.approx(0.9, abs=0.05) and check.trimmed_end == pytest.approx(0.9, abs=0.05)
    same_audio(check, 0.75 * x, rate)


def test_integer_pcm(speech):
    x, rate = speech
    pcm = np.round(np.concatenate([silence(0.5, rate), x, silence(0.5, rate)]) * 32767).astype(np.int16)
    check = check_reference(pcm, rate)
    assert check.warnings == [] and check.trimmed_start == pytest.approx(0.4, abs=0.04)
    same_audio(check, x, rate)


def test_too_short(speech):
    x, rate = speech
    short = x[:int(2.0 * rate)]
    check = check_reference(np.concatenate([silence(1.0, rate), short, silence(1.0, rate)]), rate)
    assert len(check.warnings) == 1, check.warnings
    assert check.warnings[0].startswith("too short for a good clone: the reference is 2.")
    assert "after trimming the silence" in check.warnings[0] and f"{GOOD_SECONDS:.0f} to 10 s" in check.warnings[0]
    assert check_reference(x[:int(3.5 * rate)], rate).warnings == []
    # under the engine's 1 s: refused, saying how much is left
    with pytest.raises(AudioError, match=r"after trimming the silence only 0\.[5-8]\d s of the reference are left; "
                                         r"at least 1 s"):
        check_reference(np.concatenate([silence(1.0, rate), x[:int(0.5 * rate)], silence(1.0, rate)]), rate)
    with pytest.raises(AudioError, match=r"0\.[3-5]\d s .*; at least 1 s of speech is needed"):
        check_reference(x[:int(0.5 * rate)], rate)
    with pytest.raises(AudioError, match=r"the reference is 0\.50 s long; at least 1 s"):
        check_reference(x[:int(0.5 * rate)], rate, trim=False)


def test_too_long_says_what_is_kept(speech):
    x, rate = speech
    pause = silence(0.3, rate)
    repeats = int(np.ceil(70 / (x.size / rate + 0.3)))
    long = np.concatenate([np.concatenate([x, pause]) for _ in range(repeats)])[:int(70 * rate)]
    check = check_reference(long, rate)
    assert check.seconds == pytest.approx(60.0, abs=1e-3)
    (warning,) = check.warnings
    assert warning.startswith("too long: the reference is 70.0 s long;") and "only its first 60 s are used" in warning
    assert not any("60 s" in n for n in check.notes)


def test_clipping(speech):
    x, rate = speech
    hot = np.clip(4 * x, -1, 1)  # 12 dB too loud: the peaks flattened at full scale
    check = check_reference(hot, rate)
    expected = clipped_samples(hot, rate)
    assert expected > 100
    assert check.warnings == [f"clipping: {expected} samples ({1000 * expected / rate:.0f} ms) are at full scale, "
                              "so the voice is distorted and the clone copies it; record again with the input "
                              "level lower"]
    # clipped in one channel of two, as integer PCM: found too
    pcm = np.round(np.stack([hot, 0.5 * x], axis=1) * 32767).astype(np.int16)
    assert any(w.startswith("clipping") for w in check_reference(pcm, rate).warnings)
    # speech normalised to exactly full scale touches it at single samples: no clipping
    assert check_reference(x / np.abs(x).max(), rate).warnings == []
    # a 200 Hz tone peaking at full scale is not clipped; the same tone 6 dB too hot is, at any rate
    for r in (24000, 48000):
        assert check_reference(sine(3, r, 200, 1.0), r).warnings[0].startswith("mostly silence")  # (a steady tone)
        assert len(check_reference(sine(3, r, 200, 1.0), r).warnings) == 1
        assert check_reference(np.clip(sine(3, r, 200, 2.0), -1, 1), r).warnings[0].startswith("clipping")


def test_clip_runs():
    x = np.zeros(100, dtype=np.float32)
    x[10] = 1.0                      # a lone full-scale peak
    x[20:20 + CLIP_RUN - 1] = -1.0   # too short a run
    x[40:40 + CLIP_RUN] = 1.0        # clipped
    x[60:70] = 0.9995
    assert clipped_samples(x) == CLIP_RUN + 10
    stereo = np.stack([x, np.zeros_like(x)], axis=1)
    stereo[80:85, 1] = 1.0
    assert clipped_samples(stereo) == CLIP_RUN + 15
    assert clipped_samples(stereo, 48000) == 10  # runs as long in time: 6 samples at 48 kHz


def test_too_quiet(speech):
    x, rate = speech
    quiet = x * 10 ** (-37 / 20)  # peaks at -40 dBFS
    check = check_reference(np.concatenate([silence(0.5, rate), quiet, silence(0.5, rate)]), rate)
    assert check.warnings == ["too quiet: the loudest sample is at -40 dBFS (below -30 dBFS); raise the input "
                              "level or speak closer to the microphone"]
    assert check.peak_db == pytest.approx(-40, abs=0.5) and check.trimmed_start == pytest.approx(0.4, abs=0.05)
    assert check.peak_db < QUIET_PEAK_DBFS
    assert check_reference(x * 10 ** (-20 / 20), rate).warnings == []  # -23 dBFS: quiet, not too quiet


def test_mostly_silence(speech):
    x, rate = speech
    # speech, a long pause, a little more speech: trimming cannot remove the pause
    gappy = np.concatenate([x[:int(2 * rate)], silence(7.0, rate), x[-int(1.5 * rate):]])
    check = check_reference(gappy, rate)
    assert check.speech_ratio < MIN_SPEECH_RATIO
    (warning,) = check.warnings
    assert warning.startswith(f"mostly silence: only {check.speech_ratio:.0%} of the reference is speech")
    assert warning.endswith("record again in a quiet room, speaking throughout")
    # long silent ends, untrimmed: the same warning, and the advice to trim
    check = check_reference(np.concatenate([silence(4, rate), x, silence(4, rate)]), rate, trim=False)
    assert check.speech_ratio < MIN_SPEECH_RATIO
    assert check.warnings[-1].startswith("mostly silence") and "trim the silence" in check.warnings[-1]
    # trimmed, the same clip is fine
    assert check_reference(np.concatenate([silence(4, rate), x, silence(4, rate)]), rate).warnings == []


def test_steady_noise_is_not_speech():
    """Constant noise or hum has nothing standing out from its own floor: kept whole, 0 % speech."""
    for signal in (white_noise(5.0, 16000, -20), sine(5.0, 44100, 50, 0.3) + white_noise(5.0, 44100, -60)):
        rate = 16000 if signal.size == 80000 else 44100
        check = check_reference(signal, rate)
        assert check.trimmed_start == check.trimmed_end == 0 and check.seconds == pytest.approx(5.0, abs=1e-3)
        assert check.speech_ratio == 0
        assert [w.split(":")[0] for w in check.warnings] == ["mostly silence"]


def test_tone_bursts_in_silence_are_trimmed():
    rate = 32000
    tone = np.concatenate([sine(1.5, rate, 440), silence(0.2, rate), sine(2.0, rate, 660)])
    check = check_reference(np.concatenate([silence(2.0, rate), tone, silence(0.7, rate)]), rate)
    assert check.trimmed_start == pytest.approx(1.9, abs=0.035) and check.trimmed_end == pytest.approx(0.6, abs=0.035)
    assert check.warnings == [] and check.speech_ratio > 0.9
    assert check.peak_db == pytest.approx(20 * np.log10(0.5), abs=0.1)
    assert check.rms_db == pytest.approx(20 * np.log10(0.5 / np.sqrt(2)), abs=0.6)


def test_silence_is_refused():
    with pytest.raises(AudioError, match="the reference is silent: no part of it is louder than -60 dBFS"):
        check_reference(silence(5, 24000), 24000)
    with pytest.raises(AudioError, match="silent"):
        check_reference(white_noise(5, 24000, -75), 24000)


@pytest.mark.parametrize("samples,rate,message", [
    (np.zeros(0, dtype=np.float32), 24000, "empty"),
    (np.full(48000, np.nan, dtype=np.float32), 24000, "NaN or infinite"),
    (np.zeros((2, 2, 2), dtype=np.float32), 24000, "must be"),
    (np.zeros(48000, dtype=np.float32), 10, "unsupported sample rate"),
    (np.array(["a"] * 48000), 24000, "must be numbers"),
])
def test_unusable_input(samples, rate, message):
    with pytest.raises(AudioError, match=message):
        check_reference(samples, rate)


def test_frame_levels():
    rate = 24000
    x = np.concatenate([sine(0.09, rate, 1000, 1.0), silence(0.03, rate)])
    levels = frame_levels(x, rate)
    assert levels.shape == (4,)
    np.testing.assert_allclose(levels[:3], 20 * np.log10(1 / np.sqrt(2)), atol=0.05)
    assert levels[3] == -120
