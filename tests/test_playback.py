"""Streaming playback: the jitter buffer driven through a stand-in for PortAudio (pre-roll, order,
underruns, finish, stop, resampling, device errors), then real playback into a PulseAudio null
sink whose monitor is recorded back (tests/pulse_server.py; skipped where pulseaudio is not
installed or does not start; CI installs it): a chirp, the CLI's `say --play`, and a synthesized
stream from the tiny model, found whole by cross-correlation."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from conftest import fixture_dir
from fake_sounddevice import FakeSoundDevice, make_sounddevice_unimportable
from pulse_server import MonitorRecording, offsets_of_windows, pulse  # noqa: F401 (a fixture)
from vocable.audio import playback
from vocable.errors import AudioDeviceError
from vocable.audio.playback import StreamPlayer


# -- through a stand-in for sounddevice (tests/fake_sounddevice.py) ---------------------------------

def sound_device(**options) -> FakeSoundDevice:
    """Speakers (device 1) at 48 kHz, behind a device that only records."""
    return FakeSoundDevice([
        {"index": 0, "name": "Mic", "max_output_channels": 0, "default_samplerate": 48000.0},
        {"index": 1, "name": "Speakers", "max_output_channels": 2, "default_samplerate": 48000.0}], **options)


def pull(stream, frames: int) -> np.ndarray | None:
    """One callback of `frames` samples; None once the stream has stopped."""
    if not stream.active:
        return None
    out = np.full((frames, 1), np.nan, dtype=np.float32)
    stream.run_callback(out)
    assert not np.isnan(out).any()
    return out[:, 0]


@pytest.fixture
def fake(monkeypatch):
    sd = sound_device()
    monkeypatch.setattr(playback, "_sounddevice", lambda: sd)
    return sd


def ramp(start: int, n: int) -> np.ndarray:
    return (np.arange(start, start + n) % 1000 / 1000 + 0.001).astype(np.float32)


def test_preroll_then_audio_in_order(fake):
    player = StreamPlayer(24000, preroll_sec=0.25)
    stream = fake.streams[0]
    assert player.device_name == "Speakers" and player.device_rate == 24000 and stream.device == 1
    player.write(ramp(0, 2400))
    assert not pull(stream, 1000).any()  # pre-roll: silence until 0.25 s are buffered
    sizes = [1920, 3840, 7680, 15360, 4000]
    start = 2400
    for n in sizes:
        player.write(ramp(start, n))
        start += n
    got = np.concatenate([pull(stream, 1000) for _ in range(start // 1000)])
    np.testing.assert_array_equal(got, ramp(0, got.size))
    assert player.underruns == 0 and player.played_seconds == pytest.approx(got.size / 24000)


def test_underrun_plays_silence_and_rebuffers_longer(fake):
    player = StreamPlayer(24000, preroll_sec=0.1, max_preroll_sec=0.3)
    stream = fake.streams[0]
    player.write(ramp(0, 3000))
    first = pull(stream, 4000)  # runs dry in the middle of the block
    np.testing.assert_array_equal(first[:3000], ramp(0, 3000))
    assert not first[3000:].any() and player.underruns == 1
    player.write(ramp(3000, 3000))  # under the doubled pre-roll (0.2 s = 4800): still silent
    assert not pull(stream, 1000).any() and player.underruns == 1
    player.write(ramp(6000, 3000))
    np.testing.assert_array_equal(pull(stream, 6000), ramp(3000, 6000))
    pull(stream, 10)
    assert player.underruns == 2
    player.write(ramp(9000, 6000))  # the pre-roll is capped at max_preroll_sec (0.3 s)
    assert not pull(stream, 100).any()
    player.write(ramp(15000, 1200))
    np.testing.assert_array_equal(pull(stream, 7200), ramp(9000, 7200))


def test_finish_plays_out_then_stops(fake):
    player = StreamPlayer(24000, preroll_sec=1.0)
    stream = fake.streams[0]
    player.write(ramp(0, 5000))
    assert not player.wait(timeout=0)
    player.finish()  # less than the pre-roll: plays anyway
    got = []
    while (block := pull(stream, 2048)) is not None:
        got.append(block)
    out = np.concatenate(got)
    np.testing.assert_array_equal(out[:5000], ramp(0, 5000))
    # then silence for the device's latency (0.05 s here) and FLUSH_SEC more, so that the last
    # samples are through the device's buffer before the stream stops
    assert not out[5000:].any()
    flush = round((0.05 + playback.FLUSH_SEC) * 24000)
    assert 5000 + flush <= out.size < 5000 + flush + 2048
    assert player.wait(timeout=1) and stream.closed
    assert player.underruns == 0
    with pytest.raises(RuntimeError, match="after finish"):
        player.write(ramp(0, 10))


def test_stop_drops_the_buffer(fake):
    player = StreamPlayer(24000, preroll_sec=0.0)
    stream = fake.streams[0]
    player.write(ramp(0, 24000))
    pull(stream, 100)
    player.stop()
    assert player.finished and stream.closed and player.buffered_seconds == 0
    player.write(ramp(0, 100))  # ignored
    player.stop()  # idempotent


def test_resamples_for_a_device_without_the_rate(monkeypatch):
    sd = sound_device(accepts=lambda rate, channels: rate == 48000)
    monkeypatch.setattr(playback, "_sounddevice", lambda: sd)
    with StreamPlayer(24000, preroll_sec=0.0) as player:
        assert player.device_rate == 48000
        tone = (0.5 * np.sin(2 * np.pi * 440 * np.arange(24000) / 24000)).astype(np.float32)
        for i in range(0, tone.size, 1920):
            player.write(tone[i:i + 1920])
        player.finish()
        out = []
        while (block := pull(sd.streams[0], 4800)) is not None:
            out.append(block)
    out = np.concatenate(out)[:48000]
    assert abs(np.count_nonzero(np.abs(out) > 1e-4) - 48000) < 200
    spectrum = np.abs(np.fft.rfft(out[4800:-4800]))
    assert np.fft.rfftfreq(38400, 1 / 48000)[np.argmax(spectrum)] == pytest.approx(440, abs=2)


def test_device_errors(monkeypatch):
    sd = FakeSoundDevice(devices=[{"index": 0, "name": "Mic", "max_output_channels": 0, "default_samplerate": 1.0}])
    monkeypatch.setattr(playback, "_sounddevice", lambda: sd)
    with pytest.raises(AudioDeviceError, match="no audio output device was found"):
        StreamPlayer(24000)
    sd = sound_device()
    monkeypatch.setattr(playback, "_sounddevice", lambda: sd)
    with pytest.raises(AudioDeviceError, match=r"no output device matches 'hdmi' \(there are: 1: Speakers\)"):
        StreamPlayer(24000, device="hdmi")
    assert StreamPlayer(24000, device="speak").device_name == "Speakers"
    assert StreamPlayer(24000, device=1).device_name == "Speakers"
    assert playback.output_devices() == ["Speakers"]
    # ALSA lists "sysdefault" before "default": the name the settings keep picks its own device
    sd = FakeSoundDevice(devices=[
        {"index": i, "name": name, "max_output_channels": 2, "default_samplerate": 48000.0}
        for i, name in enumerate(["HDA Intel PCH: ALC257 Analog (hw:0,0)", "sysdefault", "front", "pulse", "default"])])
    monkeypatch.setattr(playback, "_sounddevice", lambda: sd)
    assert StreamPlayer(24000, device="default").device_name == "default"
    assert StreamPlayer(24000, device="ALC257").device_name.startswith("HDA Intel PCH")


@pytest.mark.parametrize("error,message", [(ImportError, "'sounddevice' is not installed"),
                                           (OSError, "PortAudio library is not installed")])
def test_missing_sounddevice_or_portaudio(monkeypatch, error, message):
    make_sounddevice_unimportable(monkeypatch, error)
    with pytest.raises(AudioDeviceError, match=message):
        StreamPlayer(24000)


def test_writer_and_callback_threads(fake):
    """A writer thread and the audio thread at once: every sample comes out once, in order."""
    player = StreamPlayer(24000, preroll_sec=0.05)
    stream = fake.streams[0]
    total = 200 * 480

    def writer():
        for i in range(200):
            player.write(ramp(i * 480, 480))
        player.finish()

    t = threading.Thread(target=writer)
    t.start()
    out = []
    while (block := pull(stream, 256)) is not None:
        out.append(block)
    t.join()
    got = np.concatenate(out)
    got = got[np.nonzero(got)[0]]  # drop the silence of pre-roll and underruns
    np.testing.assert_array_equal(got, ramp(0, total))


# -- real playback through PulseAudio's null sink (tests/pulse_server.py) ----------------------------

PLAY_CHIRP = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    from vocable.audio.playback import StreamPlayer
    rate = 24000
    t = np.arange(int(1.5 * rate)) / rate
    chirp = (0.5 * np.sin(2 * np.pi * (200 * t + 400 * t * t))).astype(np.float32)  # 200 -> 1400 Hz
    with StreamPlayer(rate, preroll_sec=0.2) as player:
        pos, n = 0, 1920
        while pos < chirp.size:  # growing chunks, produced faster than real time as a stream is
            player.write(chirp[pos:pos + n])
            time.sleep(n / rate / 3)
            pos, n = pos + n, min(2 * n, 24000)
        player.finish()
        ok = player.wait(30)
        print(json.dumps({"ok": ok, "underruns": player.underruns, "device": player.device_name,
                          "played": player.played_seconds}))
""")


def dominant_frequencies(x: np.ndarray, rate: int = 24000, window: int = 1200) -> list[float]:
    """Dominant frequency of each 50 ms window that holds sound."""
    freqs = np.fft.rfftfreq(window, 1 / rate)
    out = []
    for i in range(0, x.size - window, window):
        w = x[i:i + window]
        if np.sqrt(np.mean(w ** 2)) > 0.1:
            out.append(float(freqs[np.argmax(np.abs(np.fft.rfft(w * np.hanning(window))))]))
    return out


def test_chunks_reach_the_speaker_in_order(pulse):
    with MonitorRecording(pulse) as rec:
        proc = subprocess.run([sys.executable, "-c", PLAY_CHIRP], env=pulse, capture_output=True, text=True,
                              timeout=60)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] and report["underruns"] == 0 and report["played"] == pytest.approx(1.5)
    track = dominant_frequencies(rec.audio)
    # 1.5 s of sound (30 windows of 50 ms, one more or less where the windows cut the ends),
    # sweeping up without a jump back
    assert 29 <= len(track) <= 31, track
    assert track[0] < 320 and track[-1] > 1250, track
    assert all(b >= a - 20 for a, b in zip(track, track[1:])), track


def test_cli_say_plays_what_it_writes(pulse, converted, tmp_path):
    out = tmp_path / "said.wav"
    with MonitorRecording(pulse) as rec:
        proc = subprocess.run([sys.executable, "-m", "vocable", "say", "--model", str(converted("0.6b", "f32")),
                               "--ref", str(fixture_dir("0.6b") / "reference" / "ref_24k.wav"),
                               "--text", "Hello world, this is a test.", "--max-frames", "25", "--seed", "3",
                               "--out", str(out), "--play"], env=pulse, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "played on" in proc.stderr
    import soundfile as sf
    written, rate = sf.read(str(out), dtype="float32")
    heard = rec.audio
    assert rate == 24000 and written.size == 25 * 1920
    # three excerpts of what was written are found in the recording, at one and the same offset:
    # the audio arrived whole and in order
    offsets = []
    for start in (0.25, 0.5, 0.75):
        piece = written[int(start * written.size):int(start * written.size) + 4800]
        corr = np.correlate(heard, piece, mode="valid")
        k = int(np.argmax(corr))
        match = heard[k:k + piece.size]
        assert float(match @ piece / (np.linalg.norm(match) * np.linalg.norm(piece))) > 0.98
        offsets.append(k - int(start * written.size))
    assert max(offsets) - min(offsets) <= 2, offsets


PLAY_SYNTHESIS = textwrap.dedent("""
    import json, sys
    import numpy as np
    from vocable import Engine
    from vocable.audio.files import read_audio
    from vocable.audio.playback import StreamPlayer
    model, ref, out = sys.argv[1:4]
    with Engine(model, threads=2) as engine:
        voice = engine.embed_voice(*read_audio(ref))
        chunks = []
        with StreamPlayer(engine.sample_rate) as player:   # the app's defaults: pre-roll and all
            with engine.synthesize("Hello world, this is a streamed test of the player.", voice, seed=11,
                                   max_frames=50) as stream:
                for chunk in stream:
                    chunks.append(chunk.copy())
                    player.write(chunk)
                result = stream.result()
            player.finish()
            ok = player.wait(60)
        sent = np.concatenate(chunks)
        np.save(out, sent)
        print(json.dumps({"ok": ok, "underruns": player.underruns, "chunks": len(chunks),
                          "played": player.played_seconds, "rate": engine.sample_rate,
                          "whole": bool(np.array_equal(sent, result.audio)), "rtf": result.real_time_factor}))
""")


def test_synthesis_stream_plays_whole_in_order(pulse, converted, tmp_path):
    """A synthesis streamed through the player comes out of the sink whole: every 100 ms of it
    is found in the recording at one and the same offset (no gap, no reordering, no drift of
    the rate), and nothing else sounds around it."""
    sent_path = tmp_path / "sent.npy"
    with MonitorRecording(pulse) as rec:
        proc = subprocess.run([sys.executable, "-c", PLAY_SYNTHESIS, str(converted("0.6b", "q8_0")),
                               str(fixture_dir("0.6b") / "reference" / "ref_24k.wav"), str(sent_path)],
                              env=pulse, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    sent, heard = np.load(sent_path), rec.audio
    assert report["ok"] and report["whole"] and report["rate"] == 24000 and report["chunks"] > 2, report
    assert report["played"] == pytest.approx(sent.size / 24000), report
    # the player never waited for audio (the tiny model runs far faster than real time), so the
    # stream went out without a pause: one offset for all of it
    assert report["underruns"] == 0, report
    assert sent.size >= 2 * 24000, sent.size
    found = offsets_of_windows(heard, sent, window=2400, hop=2400)
    assert len(found) >= 0.9 * (sent.size // 2400), (len(found), sent.size)
    assert found[0][0] == 0 and found[-1][0] >= sent.size - 2 * 2400, found  # from the start to the end
    assert min(c for _, _, c in found) > 0.98, found
    shifts = [k for _, k, _ in found]
    assert max(shifts) - min(shifts) <= 1, shifts
    # the sink heard nothing but the stream: silence before and after it
    k = int(np.median(shifts))
    assert 0 < k and k + sent.size < heard.size, (k, heard.size)
    assert np.abs(heard[:k]).max() < 1e-3 and np.abs(heard[k + sent.size:]).max() < 1e-3
    np.testing.assert_allclose(heard[k:k + sent.size], sent, atol=2e-3)


# -- a stream produced slower than real time -----------------------------------------------------

def test_slow_stream_waits_for_the_planned_buffer(fake, monkeypatch):
    """Arriving at half real time with 2 s expected, the player measures the rate from the chunks
    and holds back the first sound until R (f - 1) margin + a chunk - B after the latest chunk,
    says how long and why, and starts when that time has passed, between chunks too."""
    now = [0.0]
    monkeypatch.setattr(playback.time, "monotonic", lambda: now[0])
    player = StreamPlayer(24000, preroll_sec=0.1, expected_seconds=2.0, max_chunk_seconds=0.08)
    stream = fake.streams[0]
    chunk = 1920   # 80 ms, arriving every 160 ms
    player.write(ramp(0, chunk))
    now[0] += 0.16
    player.write(ramp(chunk, chunk))
    assert player.real_time_factor == pytest.approx(2.0)
    wait = (2.0 - 0.16) * (2.0 - 1.0) * playback.PLAN_MARGIN + 0.08 - 0.16
    assert player.waiting == (f"first sound in {wait:.1f} s, so that the rest arrives in time: synthesis runs at "
                              "2.00x real time")
    written, silent_pulls = 2 * chunk, 0
    # while the plan's wait after a chunk is longer than the 0.16 s until the next one
    while (2.0 - written / 24000) * playback.PLAN_MARGIN + 0.08 - written / 24000 > 0.16:
        assert not pull(stream, 256).any()   # far past the pre-roll, still short of the plan: silence
        silent_pulls += 1
        now[0] += 0.16
        player.write(ramp(written, chunk))
        written += chunk
    assert silent_pulls > 5
    # the next chunk is not needed: the plan's time passes first
    wait = (2.0 - written / 24000) * playback.PLAN_MARGIN + 0.08 - written / 24000
    now[0] += max(wait, 0.0) - 0.01
    assert not pull(stream, 256).any()
    now[0] += 0.02
    assert pull(stream, 256).any() and player.waiting is None
    assert player.waited_seconds == pytest.approx(now[0]) and "2.00x real time" in player.wait_reason


def test_a_stream_longer_than_expected_pauses_seldom(fake, monkeypatch):
    """60 s of speech arriving at half real time, where 30 s were expected: once past the
    estimate the player expects half as much again, so the rest plays after a few longer waits
    instead of a pause every pre-roll, and every sample plays in order."""
    now = [0.0]
    monkeypatch.setattr(playback.time, "monotonic", lambda: now[0])
    player = StreamPlayer(24000, expected_seconds=30.0, max_chunk_seconds=2.0)
    stream = fake.streams[0]
    total, rate, block = 60 * 24000, 24000, 2048
    arrivals, at, size, made = [], 0.4, 0.16, 0
    while made < total:   # the engine's chunks: doubling up to 2 s, made at 2x real time
        n = min(int(size * rate), 2 * rate, total - made)
        arrivals.append((at, made, n))
        made += n
        size *= 2
        at += 2.0 * n / rate
    played, pauses, silent = [], 0, False
    i = 0
    while not player.finished and now[0] < 400:
        while i < len(arrivals) and arrivals[i][0] <= now[0]:
            _, start, n = arrivals[i]
            player.write(ramp(start, n))
            i += 1
            if i == len(arrivals):
                player.finish()
        out = pull(stream, block)
        if out is None:
            break
        sound = out[out != 0]
        if played and not sound.size and not silent:
            pauses += 1
        silent = not sound.size
        played.append(sound)
        now[0] += block / rate
    heard = np.concatenate(played)
    np.testing.assert_array_equal(heard, ramp(0, total))
    assert player.underruns <= 5 and pauses <= 6, (player.underruns, pauses)   # 4 and 5; before: 18 and 19


def test_fast_stream_starts_after_the_preroll(fake, monkeypatch):
    now = [0.0]
    monkeypatch.setattr(playback.time, "monotonic", lambda: now[0])
    player = StreamPlayer(24000, preroll_sec=0.1, expected_seconds=10.0)
    for i in range(2):   # 80 ms chunks every 40 ms
        player.write(ramp(i * 1920, 1920))
        now[0] += 0.04
    assert player.real_time_factor == pytest.approx(0.5)
    assert player.waiting is None
    assert pull(fake.streams[0], 256).any() and player.wait_reason == ""


PLAY_SLOW_STREAM = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    from vocable.audio.playback import StreamPlayer
    rate, rtf, seconds = 24000, float(sys.argv[1]), 3.0
    sent = (0.3 * np.random.default_rng(7).standard_normal(int(seconds * rate))).astype(np.float32)
    np.save(sys.argv[2], sent)
    expected = None if sys.argv[3] == "none" else seconds
    with StreamPlayer(rate, expected_seconds=expected) as player:
        for pos in range(0, sent.size, 3840):   # 160 ms chunks arriving `rtf` times slower than real time
            time.sleep(3840 / rate * rtf)
            player.write(sent[pos:pos + 3840])
        player.finish()
        ok = player.wait(60)
        print(json.dumps({"ok": ok, "underruns": player.underruns, "waited": player.waited_seconds,
                          "reason": player.wait_reason}))
""")


def _play_slow_stream(pulse, tmp_path, expected: str):
    sent_path = tmp_path / f"sent-{expected}.npy"
    with MonitorRecording(pulse) as rec:
        proc = subprocess.run([sys.executable, "-c", PLAY_SLOW_STREAM, "1.4", str(sent_path), expected],
                              env=pulse, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), np.load(sent_path), rec.audio


def test_slower_than_real_time_plays_without_a_pause(pulse, tmp_path):
    """A stream arriving at 1.4x real time, through the null sink: with the expected length the
    player waits once, for the planned buffer, and the recording finds every 100 ms of the stream
    at one offset (no gap); without it, the same stream pauses."""
    report, sent, heard = _play_slow_stream(pulse, tmp_path, "3.0")
    assert report["ok"] and report["underruns"] == 0, report
    assert report["waited"] > 0.5 and "1.4" in report["reason"], report
    found = offsets_of_windows(heard, sent, window=2400, hop=2400)
    assert len(found) >= 0.9 * (sent.size // 2400), len(found)
    assert min(c for _, _, c in found) > 0.98, found
    shifts = [k for _, k, _ in found]
    assert max(shifts) - min(shifts) <= 1, shifts

    report, sent, heard = _play_slow_stream(pulse, tmp_path, "none")
    assert report["ok"] and report["underruns"] >= 1, report
    shifts = [k for _, k, _ in offsets_of_windows(heard, sent, window=2400, hop=2400)]
    assert max(shifts) - min(shifts) > 2400, shifts
