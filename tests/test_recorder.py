"""Recording: the recorder driven through a stand-in for PortAudio (mixdown, levels, elapsed time,
stop, the automatic stop, a device that fails or vanishes, missing PortAudio), then a real
recording from a PulseAudio source fed a known signal (tests/pulse_server.py; skipped only where
pulseaudio is not installed or does not start), and the error without any sound server."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from conftest import without_portaudio
from fake_sounddevice import FakeSoundDevice, make_sounddevice_unimportable
from pulse_server import MIC_SINK, offsets_of_windows, pulse  # noqa: F401 (a fixture)
from vocable.audio import playback, recorder
from vocable.errors import AudioDeviceError
from vocable.audio.recorder import MAX_RECORD_SECONDS, SILENCE_DB, Recorder, input_devices


# -- through a stand-in for sounddevice (tests/fake_sounddevice.py) ---------------------------------

def sound_device(**options) -> FakeSoundDevice:
    """A stereo USB Mic (device 1, the default input) and an 8-channel Line In, behind a device
    that only plays."""
    return FakeSoundDevice([
        {"index": 0, "name": "Speakers", "max_input_channels": 0, "default_samplerate": 48000.0},
        {"index": 1, "name": "USB Mic", "max_input_channels": 2, "default_samplerate": 44100.0},
        {"index": 2, "name": "Line In", "max_input_channels": 8, "default_samplerate": 96000.0}], **options)


def push(stream, block: np.ndarray, overflow: bool = False) -> bool:
    """One callback with `block` [frames, channels]; False once the stream has stopped."""
    if not stream.active:
        return False
    stream.run_callback(np.ascontiguousarray(block, dtype=np.float32), overflow)
    return stream.active


@pytest.fixture
def fake(monkeypatch):
    sd = sound_device()
    monkeypatch.setattr(recorder, "_sounddevice", lambda: sd)
    return sd


class Calls:
    """Collects on_stopped reasons, from whichever thread."""

    def __init__(self):
        self.reasons: list[str] = []
        self.event = threading.Event()

    def __call__(self, reason: str) -> None:
        self.reasons.append(reason)
        self.event.set()


def test_opens_the_default_input_at_its_rate_in_mono(fake):
    rec = Recorder(stall_seconds=None)
    assert not rec.running and rec.elapsed == 0 and rec.sample_rate == 0 and not fake.streams  # nothing opened yet
    rec.start()
    stream = fake.streams[0]
    assert (rec.device_name, rec.sample_rate, stream.samplerate, stream.device) == ("USB Mic", 44100, 44100, 1)
    assert rec.running and rec.channels == stream.channels == 1
    rec.stop()


def test_mixdown_of_a_device_that_takes_only_stereo(monkeypatch):
    sd = sound_device(accepts=lambda rate, channels: channels == 2)
    monkeypatch.setattr(recorder, "_sounddevice", lambda: sd)
    levels, stopped = [], Calls()
    rec = Recorder(on_level=levels.append, on_stopped=stopped, stall_seconds=None)
    rec.start()
    stream = sd.streams[0]
    assert rec.channels == 2 and stream.channels == 2 and rec.sample_rate == 44100
    rng = np.random.default_rng(1)
    blocks = [rng.uniform(-0.5, 0.5, (n, 2)).astype(np.float32) for n in (512, 1024, 300, 4410)]
    blocks[1][:, 0] = 0.0
    blocks[1][7, 1] = -0.5  # peak of the block: -6 dBFS in one channel, -12 dBFS after mixing
    blocks[2][:] = 0.0      # digital silence
    for i, b in enumerate(blocks):
        assert push(stream, b, overflow=(i == 3))
        assert rec.elapsed == pytest.approx(sum(x.shape[0] for x in blocks[:i + 1]) / 44100)
    assert len(levels) == 4 and rec.level_db == levels[-1]
    assert levels[1] == pytest.approx(20 * np.log10(0.25), abs=1e-4) and levels[2] == SILENCE_DB
    assert levels[0] == pytest.approx(20 * np.log10(np.abs(blocks[0].mean(axis=1)).max()), abs=1e-4)
    np.testing.assert_allclose(rec.samples(), np.concatenate([b.mean(axis=1) for b in blocks]), atol=1e-7)
    assert rec.overflows == 1 and rec.running and not stopped.reasons
    samples, rate = rec.stop()
    assert rate == 44100 and samples.dtype == np.float32 and samples.ndim == 1
    np.testing.assert_allclose(samples, np.concatenate([b.mean(axis=1) for b in blocks]), atol=1e-7)
    assert stopped.reasons == ["stopped"] and rec.stop_reason == "stopped" and not rec.running
    assert stream.closed and not stream.active
    again, _ = rec.stop()  # idempotent: the same audio, no second notice
    np.testing.assert_array_equal(again, samples)
    assert stopped.reasons == ["stopped"]


def test_stops_itself_at_the_maximum_length(fake):
    assert MAX_RECORD_SECONDS == 30.0
    stopped = Calls()
    rec = Recorder(max_seconds=0.1, on_stopped=stopped, stall_seconds=None)
    rec.start()
    stream = fake.streams[0]
    block = np.full((1000, 1), 0.25, dtype=np.float32)
    pushed = 0
    while push(stream, block):
        pushed += 1
    assert pushed == 4  # 4410 samples: the 5th block is cut and ends the recording
    assert stopped.event.wait(5) and stopped.reasons == ["max length"]
    assert rec.wait(0) and not rec.running and rec.stop_reason == "max length"
    assert rec.elapsed == pytest.approx(0.1)
    samples, rate = rec.stop()
    assert samples.size == 4410 and rate == 44100 and np.all(samples == 0.25)
    assert stopped.reasons == ["max length"]  # stop() after the end is no second notice
    assert stream.closed


def test_a_vanishing_device_ends_the_recording(fake):
    stopped = Calls()
    rec = Recorder(on_stopped=stopped, stall_seconds=None)
    rec.start()
    stream = fake.streams[0]
    push(stream, np.full((441, 1), 0.1, dtype=np.float32))
    stream.active = False
    stream.finished_callback()  # PortAudio ended the stream by itself
    assert stopped.event.wait(5)
    assert stopped.reasons == ["device error: the input stream from 'USB Mic' ended unexpectedly"]
    samples, _ = rec.stop()
    assert samples.size == 441 and stopped.reasons[1:] == []


def test_a_silent_device_is_noticed(fake):
    """A device that stops sending audio without PortAudio noticing (pulled out mid-way)."""
    stopped = Calls()
    rec = Recorder(on_stopped=stopped, stall_seconds=0.3)
    rec.start()
    push(fake.streams[0], np.zeros((441, 1), dtype=np.float32))  # (before the first block it waits START_SECONDS)
    started = time.monotonic()
    assert stopped.event.wait(5)
    assert 0.25 < time.monotonic() - started < 2
    assert stopped.reasons[0].startswith("device error: no audio came from 'USB Mic' for 0.")
    assert "unplugged" in stopped.reasons[0] and not rec.running
    assert fake.streams[0].closed  # closed off the audio thread, before on_stopped
    assert rec.stop()[0].size == 441


def test_a_device_that_never_starts_is_noticed(fake, monkeypatch):
    monkeypatch.setattr(recorder, "START_SECONDS", 0.5)
    stopped = Calls()
    rec = Recorder(on_stopped=stopped, stall_seconds=0.1)
    started = time.monotonic()
    rec.start()
    assert stopped.event.wait(5) and time.monotonic() - started > 0.45  # the first block gets longer
    assert stopped.reasons[0].startswith("device error: no audio came from 'USB Mic'")
    assert rec.stop()[0].size == 0 and rec.sample_rate == 44100


def test_on_stopped_may_call_stop(fake):
    got = []

    def on_stopped(reason):
        got.append((reason, rec.stop()[0].size))

    rec = Recorder(max_seconds=0.01, on_stopped=on_stopped, stall_seconds=None)
    rec.start()
    push(fake.streams[0], np.zeros((1000, 1), dtype=np.float32))
    assert rec.wait(5)
    for _ in range(100):
        if got:
            break
        time.sleep(0.01)
    assert got == [("max length", 441)]


def test_start_again_records_anew(fake):
    rec = Recorder(stall_seconds=None)
    rec.start()
    with pytest.raises(RuntimeError, match="already recording"):
        rec.start()
    push(fake.streams[0], np.ones((100, 1), dtype=np.float32) * 0.5)
    assert rec.stop()[0].size == 100
    with rec:
        assert rec.running and rec.elapsed == 0 and rec.stop_reason is None
        push(fake.streams[1], np.ones((30, 1), dtype=np.float32) * 0.5)
    assert not rec.running and rec.samples().size == 30
    assert not push(fake.streams[0], np.ones((10, 1), dtype=np.float32))  # the old stream is done


def test_callbacks_that_fail_do_not_stop_the_recording(fake, caplog):
    def bad(_):
        raise ValueError("oops")

    rec = Recorder(on_level=bad, on_stopped=bad, stall_seconds=None)
    rec.start()
    assert push(fake.streams[0], np.zeros((10, 1), dtype=np.float32))
    assert push(fake.streams[0], np.zeros((10, 1), dtype=np.float32))
    assert rec.stop()[0].size == 20
    assert "on_level failed" in caplog.text and "on_stopped failed" in caplog.text


def test_picks_a_rate_and_channels_the_device_takes(monkeypatch):
    sd = sound_device(accepts=lambda rate, channels: rate == 48000)
    monkeypatch.setattr(recorder, "_sounddevice", lambda: sd)
    rec = Recorder(device="line", stall_seconds=None)
    rec.start()
    assert (rec.device_name, rec.sample_rate, rec.channels) == ("Line In", 48000, 1)
    rec.stop()
    sd = sound_device(accepts=lambda rate, channels: channels == 8)
    monkeypatch.setattr(recorder, "_sounddevice", lambda: sd)
    rec = Recorder(device=2, stall_seconds=None)
    rec.start()
    assert (rec.sample_rate, rec.channels) == (96000, 8)
    push(sd.streams[0], np.tile(np.arange(8, dtype=np.float32) / 10, (5, 1)))
    np.testing.assert_allclose(rec.stop()[0], np.full(5, 0.35), atol=1e-6)


def test_device_errors(monkeypatch):
    sd = FakeSoundDevice(devices=[{"index": 0, "name": "Speakers", "max_input_channels": 0,
                                   "default_samplerate": 48000.0}])
    monkeypatch.setattr(recorder, "_sounddevice", lambda: sd)
    with pytest.raises(AudioDeviceError, match="cannot record audio: no microphone or other audio input device"):
        Recorder().start()
    assert input_devices() == []

    sd = sound_device()
    monkeypatch.setattr(recorder, "_sounddevice", lambda: sd)
    assert input_devices() == ["USB Mic", "Line In"]
    with pytest.raises(AudioDeviceError, match=r"no input device matches 'webcam' \(there are: 1: USB Mic, "
                                               r"2: Line In\)"):
        Recorder(device="webcam").start()
    with pytest.raises(AudioDeviceError, match="no input device matches 0"):
        Recorder(device=0).start()  # an output-only device

    sd = sound_device(has_default=False)
    monkeypatch.setattr(recorder, "_sounddevice", lambda: sd)
    rec = Recorder(stall_seconds=None)
    rec.start()  # no default input: the first one there is
    assert rec.device_name == "USB Mic"
    rec.stop()

    sd = sound_device(open_error="Device unavailable")
    monkeypatch.setattr(recorder, "_sounddevice", lambda: sd)
    rec = Recorder(stall_seconds=None)
    with pytest.raises(AudioDeviceError, match=r"cannot record from 'USB Mic': Device unavailable \(it may be "
                                               r"in use by another program\)"):
        rec.start()
    assert not rec.running and rec.wait(0)
    with pytest.raises(ValueError):
        Recorder(max_seconds=0)


@pytest.mark.parametrize("error,message", [(ImportError, "cannot record audio: the Python package 'sounddevice' "
                                                         "is not installed"),
                                           (OSError, "cannot record audio: the PortAudio library is not installed")])
def test_missing_sounddevice_or_portaudio(monkeypatch, error, message):
    make_sounddevice_unimportable(monkeypatch, error)
    with pytest.raises(AudioDeviceError, match=message):
        Recorder().start()
    with pytest.raises(AudioDeviceError, match=message):
        input_devices()
    with pytest.raises(AudioDeviceError, match="cannot play audio"):
        playback.output_devices()


# -- a real recording from PulseAudio --------------------------------------------------------------

RECORD = textwrap.dedent("""
    import json, subprocess, sys, time
    import numpy as np
    from vocable.audio.recorder import Recorder
    wav, sink, out = sys.argv[1:4]
    levels, reasons = [], []
    rec = Recorder(on_level=levels.append, on_stopped=reasons.append)
    rec.start()
    deadline = time.monotonic() + 15
    while rec.elapsed < 0.3 and time.monotonic() < deadline:  # the server wakes its idle sink first (~1.5 s)
        time.sleep(0.05)
    subprocess.run(["paplay", "-d", sink, wav], check=True, timeout=30)  # into the sink the source monitors
    time.sleep(0.5)
    samples, rate = rec.stop()
    np.save(out, samples)
    short = Recorder(max_seconds=0.5, on_stopped=reasons.append)
    short.start()
    ended = short.wait(10)
    time.sleep(0.2)
    clip, short_rate = short.stop()
    print(json.dumps({"rate": rate, "elapsed": rec.elapsed, "device": rec.device_name, "channels": rec.channels,
                      "levels": levels, "reasons": reasons, "ended": ended, "short": clip.size,
                      "short_rate": short_rate, "overflows": rec.overflows}))
""")


def known_signal(rate: int = 24000, seconds: float = 2.0) -> np.ndarray:
    """Seeded noise, band-limited to 2 kHz, with 10 ms fades, peaking at -6 dBFS: every 100 ms of
    it is unlike any other. The band is well inside every resampler's passband on the way, and
    narrow enough that the fractional delay the resamplers leave (up to half a sample at 24 kHz)
    keeps the correlation at a whole-sample lag near 0.99 (at 6 kHz it falls to 0.90, at 3 kHz
    to 0.965)."""
    n = int(rate * seconds)
    spectrum = np.fft.rfft(np.random.default_rng(5).standard_normal(n))
    spectrum[np.fft.rfftfreq(n, 1 / rate) > 2000] = 0
    x = np.fft.irfft(spectrum, n)
    fade = int(0.01 * rate)
    x[:fade] *= np.linspace(0, 1, fade)
    x[-fade:] *= np.linspace(1, 0, fade)
    return (0.5 * x / np.abs(x).max()).astype(np.float32)


def test_records_what_the_source_plays(pulse, tmp_path):
    """paplay plays a known signal into a null sink whose monitor is the default input; the
    recorder hears all of it, in order, at the rate it reports."""
    import soundfile as sf
    import soxr

    signal = known_signal()
    wav = tmp_path / "signal.wav"
    sf.write(wav, signal, 24000, subtype="FLOAT")
    out = tmp_path / "recorded.npy"
    proc = subprocess.run([sys.executable, "-c", RECORD, str(wav), MIC_SINK, str(out)], env=pulse,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    recorded, rate = np.load(out), report["rate"]
    assert recorded.dtype == np.float32 and recorded.ndim == 1
    assert recorded.size == round(report["elapsed"] * rate) and report["elapsed"] > signal.size / 24000 + 0.5
    # at the rate the recorder reports, every 100 ms of the signal is found at one offset
    heard = soxr.resample(recorded, rate, 24000, quality="VHQ") if rate != 24000 else recorded
    found = offsets_of_windows(heard, signal, window=2400, hop=2400)
    assert len(found) == signal.size // 2400
    shifts = [k for _, k, _ in found]
    assert max(shifts) - min(shifts) <= 1, (rate, shifts)
    assert min(c for _, _, c in found) > 0.97, found
    k = int(np.median(shifts))
    rms = np.sqrt(np.mean(heard[k:k + signal.size] ** 2) / np.mean(signal.astype(np.float64) ** 2))
    assert rms == pytest.approx(1.0, abs=0.1)  # unity gain through the server
    # the level meter saw the signal's peak (-6 dBFS) and the silence around it
    levels = report["levels"]
    assert max(levels) == pytest.approx(-6.0, abs=1.5) and min(levels) < -60
    assert report["reasons"] == ["stopped", "max length"] and report["ended"]
    assert report["short"] == round(0.5 * report["short_rate"])


NO_DEVICE = textwrap.dedent("""
    import json
    from vocable.errors import AudioDeviceError
    from vocable.audio.playback import StreamPlayer
    from vocable.audio.recorder import Recorder, input_devices
    try:
        import sounddevice
        out = {"portaudio": True, "devices": len(sounddevice.query_devices())}
    except OSError:   # no PortAudio library
        out = {"portaudio": False, "devices": 0}
    try:
        out["inputs"] = input_devices()
    except AudioDeviceError as e:
        out["inputs"], out["list"] = [], str(e)
    for name, make in (("record", lambda: Recorder().start()), ("play", lambda: StreamPlayer(24000))):
        try:
            make()
        except AudioDeviceError as e:
            out[name] = str(e)
    print(json.dumps(out))
""")


@pytest.mark.parametrize("portaudio", ["as installed", "missing"])
def test_no_sound_server_is_a_clear_error(tmp_path, portaudio):
    """Without any sound server (and no sound card, as on CI), PortAudio sees no device; without
    the PortAudio library there are no devices either: both directions say so in words, so the
    app can disable recording and playback with a reason."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    env = dict(os.environ, PULSE_SERVER=f"unix:{runtime / 'no-such-socket'}", XDG_RUNTIME_DIR=str(runtime),
               HOME=str(runtime))
    if portaudio == "missing":
        env = without_portaudio(env, tmp_path / "site")
    proc = subprocess.run([sys.executable, "-c", NO_DEVICE], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    if report["devices"]:
        pytest.skip(f"this machine has sound hardware PortAudio reaches without a server ({report})")
    assert report["inputs"] == []
    if not report["portaudio"]:
        missing = "the PortAudio library is not installed (on Debian or Ubuntu: apt install libportaudio2)"
        assert report["list"] == f"cannot record audio: {missing}", report
        assert report["record"] == f"cannot record audio: {missing}", report
        assert report["play"] == f"cannot play audio: {missing}", report
        return
    assert portaudio == "as installed"
    assert report["record"].startswith("cannot record audio: no microphone or other audio input device was found")
    assert report["play"].startswith("cannot play audio: no audio output device was found")
