"""A private PulseAudio server for the real-audio tests, with two null sinks:

- "vocable_null" (24 kHz mono), the default sink: what the app plays goes there, and
  `MonitorRecording` records it back from its monitor;
- "vocable_mic" (48 kHz stereo), whose monitor is the default source: what a test plays into
  that sink (`play_into`) is what the app's recorder hears, as from a microphone.

PortAudio reaches the server through ALSA's pulse plugin (libasound2-plugins) and reads the
device list once, when sounddevice is imported, so the code under test runs in a subprocess with
the environment the `pulse` fixture yields. Tests skip only where pulseaudio is not installed or
does not start (CI installs it: .ci/run)."""
from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time

import numpy as np
import pytest

SINK = "vocable_null"
MIC_SINK = "vocable_mic"
MIC_SOURCE = f"{MIC_SINK}.monitor"


@pytest.fixture(scope="module")
def pulse(tmp_path_factory):
    """Starts the server; yields the environment that points clients at it."""
    server, parec = shutil.which("pulseaudio"), shutil.which("parec")
    if not server or not parec or not shutil.which("pactl"):
        pytest.skip("needs pulseaudio, pactl and parec (apt install pulseaudio pulseaudio-utils)")
    runtime = tmp_path_factory.mktemp("pulse")
    runtime.chmod(0o700)
    socket = runtime / "native"
    env = dict(os.environ, XDG_RUNTIME_DIR=str(runtime), HOME=str(runtime), PULSE_SERVER=f"unix:{socket}",
               PULSE_SINK=SINK, PULSE_SOURCE=MIC_SOURCE)
    log = open(runtime / "server.log", "w")
    proc = subprocess.Popen([server, "-n", "--daemonize=no", "--exit-idle-time=-1", "--use-pid-file=no",
                             "--disallow-module-loading=no",
                             "-L", f"module-null-sink sink_name={SINK} rate=24000 channels=1",
                             "-L", f"module-null-sink sink_name={MIC_SINK} rate=48000 channels=2",
                             "-L", f"module-native-protocol-unix socket={socket} auth-anonymous=1"],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if socket.exists() and subprocess.run(["pactl", "info"], env=env, capture_output=True).returncode == 0:
            break
        time.sleep(0.1)
    else:
        proc.kill()
    if proc.poll() is not None:
        log.close()
        pytest.skip("pulseaudio did not start: " + (runtime / "server.log").read_text()[-500:])
    yield env
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


class MonitorRecording:
    """Records the monitor of the default sink (mono float32 at 24 kHz) while the block runs.

    The block starts once audio flows: an idle null sink's monitor sends nothing for its first
    ~1.5 s, and what is played meanwhile would be missing from the recording."""

    def __init__(self, env, rate: int = 24000):
        self.env, self.rate = env, rate

    def __enter__(self):
        self.proc = subprocess.Popen(["parec", "-d", f"{SINK}.monitor", "--raw", "--format=float32le",
                                      f"--rate={self.rate}", "--channels=1", "--latency-msec=20"],
                                     env=self.env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self._chunks: list[bytes] = []
        self._flowing = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._flowing.wait(15):
            self.proc.kill()
            raise RuntimeError("parec recorded nothing from the null sink's monitor in 15 s")
        time.sleep(0.2)
        return self

    def _read(self):
        while block := self.proc.stdout.read1(65536):
            self._chunks.append(block)
            self._flowing.set()

    def __exit__(self, *exc):
        time.sleep(0.5)
        self.proc.terminate()
        self._reader.join(10)
        self.proc.wait(10)

    @property
    def data(self) -> bytes:
        return b"".join(self._chunks)

    @property
    def audio(self) -> np.ndarray:
        data = self.data
        return np.frombuffer(data[:len(data) // 4 * 4], dtype=np.float32)


class Haystack:
    """A recording to look for excerpts in, by normalised cross-correlation (FFT, the recording's
    spectrum and running energy computed once)."""

    def __init__(self, heard: np.ndarray, longest: int):
        self.heard = np.asarray(heard, dtype=np.float64)
        self.size = 1 << (self.heard.size + longest - 1).bit_length()
        self.spectrum = np.fft.rfft(self.heard, self.size)
        self.energy = np.concatenate(([0.0], np.cumsum(self.heard ** 2)))

    def find(self, needle: np.ndarray) -> tuple[int, float]:
        """Offset of `needle` in the recording, and the normalised correlation there (1: the same
        samples up to a gain). Normalised, so a quiet excerpt is found where it is, not where the
        recording is loudest."""
        needle = np.asarray(needle, dtype=np.float64)
        n, m = self.heard.size, needle.size
        if m > n:
            return 0, 0.0
        corr = np.fft.irfft(self.spectrum * np.conj(np.fft.rfft(needle, self.size)), self.size)[:n - m + 1]
        local = self.energy[m:] - self.energy[:n - m + 1]
        scale = np.sqrt(np.maximum(local, 0.0) * float(needle @ needle))
        ncc = np.divide(corr, scale, out=np.zeros_like(corr), where=scale > 1e-9 * m)
        k = int(np.argmax(ncc))
        return k, float(ncc[k])


def offsets_of_windows(heard: np.ndarray, sent: np.ndarray, window: int, hop: int,
                       min_rms: float = 1e-3) -> list[tuple[int, int, float]]:
    """(window start in `sent`, offset of `heard` against `sent` there, correlation) for each
    window of `sent` that holds sound. Played whole, in order and at the right rate, every
    offset is the same: a gap shifts the later ones, a rate error makes them drift, a reordering
    jumps them."""
    hay = Haystack(heard, window)
    out = []
    for start in range(0, sent.size - window + 1, hop):
        piece = sent[start:start + window]
        if np.sqrt(np.mean(np.square(piece, dtype=np.float64))) < min_rms:
            continue
        k, corr = hay.find(piece)
        out.append((start, k - start, corr))
    return out
