"""What every part of `vocable bench` measures with: the input (the reference clip, the text, the
threads and models), one side's result for a stage group, the engine's own `[Perf]` log lines,
and medians."""
from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from ..errors import VocableError

SAMPLE_RATE = 24000
DEFAULT_FRAMES = 50
GEN_TEXT = "The quick brown fox jumps over the lazy dog."   # as /work/shared/reference/bench_reference.py
GEN_LANGUAGE = "English"
FRAME_MS = 80.0                                                 # audio per codec frame (12.5 Hz)
SAMPLES_PER_FRAME = 1920
CLIP_TEXT = ("Okay. Yeah. I resent you. I love you. I respect you. But you know what? You blew it! "
             "And thanks to you. The quick brown fox jumps over the lazy dog. "
             "Speech synthesis converts text into natural sounding audio, one sentence at a time.")


def say(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def median(values: list[float]) -> float | None:
    if not values:
        return None
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def round_ms(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


@dataclass
class BenchInput:
    clip: np.ndarray
    clip_path: Path          # the clip as .npy, for the reference process
    work_dir: Path
    threads: int
    repeats: int
    frames: int = DEFAULT_FRAMES
    models: dict = field(default_factory=dict)   # weight type -> BenchModel, for the generation stages
    main_type: str = "f32"                       # the weight type of the engine passed to run_vocable
    device: str = "cpu"                          # where the engines run ("cpu", "auto", "vulkan:0")
    shared: dict = field(default_factory=dict)   # work shared between groups: synthesis runs, reference runs,
                                                 # files to remove at the end ("temp_files")


@dataclass
class GroupResult:
    runs_ms: dict[str, list[float]] = field(default_factory=dict)
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    error: str | None = None


def temp_file(inp: BenchInput, stem: str, suffix: str) -> Path:
    """A file in the work folder for this run, removed when the bench ends."""
    path = inp.work_dir / f"{stem}-{os.getpid()}{suffix}"
    inp.shared.setdefault("temp_files", []).append(path)
    return path


# ---- the reference clip ---------------------------------------------------------------------

def make_reference_clip(seconds: float) -> tuple[np.ndarray, str]:
    """A mono 24 kHz float32 clip of `seconds`, peak 0.5: espeak-ng speech (repeated with short
    pauses to fill the length) when espeak-ng is installed, else a synthetic harmonic signal
    with a moving pitch and a syllable-rate envelope. Returns (samples, source)."""
    n = int(round(seconds * SAMPLE_RATE))
    speech = _espeak(CLIP_TEXT) if shutil.which("espeak-ng") else None
    if speech is not None and len(speech) > 0:
        pause = np.zeros(int(0.3 * SAMPLE_RATE), dtype=np.float32)
        reps = int(np.ceil(n / (len(speech) + len(pause))))
        wav = np.concatenate([np.concatenate([speech, pause])] * reps)[:n]
        source = "espeak-ng"
    else:
        t = np.arange(n) / SAMPLE_RATE
        f0 = 140 + 30 * np.sin(2 * np.pi * 0.7 * t)
        phase = 2 * np.pi * np.cumsum(f0) / SAMPLE_RATE
        wav = sum(np.sin(k * phase) / k for k in range(1, 12)) * (0.5 + 0.5 * np.sin(2 * np.pi * 2.5 * t) ** 2)
        source = "synthetic"
    wav = 0.5 * wav / (np.abs(wav).max() + 1e-9)
    return np.ascontiguousarray(wav, dtype=np.float32), source


def _espeak(text: str) -> np.ndarray | None:
    import soundfile as sf
    import soxr

    with tempfile.TemporaryDirectory() as d:
        raw = Path(d) / "speech.wav"
        try:
            subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(raw), text], check=True,
                           capture_output=True, timeout=120)
            data, rate = sf.read(str(raw), dtype="float32", always_2d=True)
        except (OSError, subprocess.SubprocessError, RuntimeError):
            return None
    mono = data.mean(axis=1)
    if rate != SAMPLE_RATE:
        mono = soxr.resample(mono, rate, SAMPLE_RATE, quality="HQ")
    return np.asarray(mono, dtype=np.float32)


class _PerfLines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "[Perf]" in text:
            self.lines.append(text)


@contextmanager
def engine_perf_lines() -> Iterator[list[str]]:
    """Collects the engine's `[Perf]` log lines. They are logged at INFO: when INFO is off
    (no -v) the logger is enabled for the duration without passing the lines on."""
    logger = logging.getLogger("vocable.engine")
    handler = _PerfLines()
    level, propagate = logger.level, logger.propagate
    if not logger.isEnabledFor(logging.INFO):
        logger.setLevel(logging.INFO)
        logger.propagate = False
    logger.addHandler(handler)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def perf_value(lines: list[str], pattern: re.Pattern) -> tuple[float, ...]:
    for line in reversed(lines):
        m = pattern.search(line)
        if m:
            return tuple(float(g) for g in m.groups())
    raise VocableError(f"the engine logged no line matching {pattern.pattern!r} (got {lines!r})")
