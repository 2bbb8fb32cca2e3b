"""`vocable bench`: the engine's speed next to the official PyTorch package, stage by stage.

Both sides run in the same invocation on the same model folder and the same input: by default
a model with random weights and the real Qwen3-TTS-12Hz-0.6B-Base shapes (see bench_model),
built and converted once and cached. Every stage gets one warm-up call and `--repeats` timed
calls; the table shows medians.

The engine side runs in this process; its per-stage times come from the engine's own
`[Perf]` log lines (logger "vocable.engine"). The reference side runs each stage group's script
from tools/bench/ in a subprocess, with the Python named by $VOCABLE_REFERENCE_PYTHON, or this
one when it has torch and qwen_tts; without either it is skipped, with the reason printed. The
outputs of the two sides are compared too (a cheap end-to-end check on real shapes).

Stage groups (`STAGE_GROUPS`) each own a reference script and an agreement check:
  - voice: speaker embedding and reference codes of the clip (`Engine.embed_voice`);
  - generation: `Engine.synthesize` of a fixed text for a fixed number of frames (--frames,
    default 50, 4 s of audio), x-vector mode with the clip's voice, greedy, for each weight type
    (f32, f16, q8_0, q4_k: the random model converted once per type and cached); talker and code
    predictor ms/frame, prefill and time to first frame from the engine's `[Perf]` lines, next to
    the reference's fp32 talker and code predictor ms/frame (tools/bench/reference_synthesis_timing.py,
    same speaker embedding, `max_new_tokens` = frames + 1). The issue's targets are shown with
    them: talker + code predictor under 60 ms/frame at q4_k and under 90 ms/frame at q8_0 (a
    frame is 80 ms of audio), and at least 4x faster than the reference. The random model's
    codec_head row of codec EOS is zeroed, so neither side stops early (reached_eos is reported).
    Per frame means per generated frame on both sides: for N frames the engine runs N - 1 talker
    steps after the prefill (none after the last frame), HF generate runs N (the last token it
    samples is discarded by the package); both run the code predictor N times.
  - synthesis: the audio of the same calls (the stream is consumed chunk by chunk as a player
    would): codec decode ms per second of audio, time to first audio, and the whole synthesis'
    wall time per second of audio (real-time factor x 1000), from the engine's `[Perf]` lines,
    next to the same reference run, whose speech tokenizer decodes all codes after generate (its
    first audio is the end of the whole call). Targets: first audio under 300 ms (x-vector mode,
    voice loaded), decode faster than the reference, real-time factor under 1 at q4_k. Agreement:
    the reference's decoder on the engine's codes of each type against the engine's audio.
The generation and synthesis groups share one set of engine calls and one reference process.
Missed targets are listed after the table ("MISSED TARGETS") and in the JSON ("missed_targets").
Output: progress on stderr; the table, then one JSON line with every figure, on stdout.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from . import batch as bench_batch, contention as bench_contention, memory as bench_memory, variants as bench_variants
from ..errors import VocableError

SAMPLE_RATE = 24000
REFERENCE_PYTHON_ENV = "VOCABLE_REFERENCE_PYTHON"
REFERENCE_TIMEOUT_S = 3600
DEFAULT_FRAMES = 50
DEFAULT_TYPES = ("f32", "f16", "q8_0", "q4_k")
GEN_TEXT = "The quick brown fox jumps over the lazy dog."   # as /work/shared/reference/bench_reference.py
GEN_LANGUAGE = "English"
FRAME_MS = 80.0                                                 # audio per codec frame (12.5 Hz)
SAMPLES_PER_FRAME = 1920
# the targets for talker + code predictor per frame: (ms limit by weight type, min speedup)
TARGET_MS = {"q4_k": 60.0, "q8_0": 90.0}
TARGET_SPEEDUP = 4.0
# the audio issue's targets: time to first audio (x-vector, voice loaded), codec decode at least
# as fast as the reference, whole streaming synthesis faster than real time (by weight type)
TARGET_FIRST_AUDIO_MS = 300.0
TARGET_DECODE_SPEEDUP = 1.0
TARGET_RTF = {"q4_k": 1.0}
SYNTHESIS_SCRIPT = "reference_synthesis_timing.py"   # the generation and synthesis groups share its run
TOOLS_DIR = Path(__file__).resolve().parents[3] / "tools" / "bench"   # source checkouts only
CLIP_TEXT = ("Okay. Yeah. I resent you. I love you. I respect you. But you know what? You blew it! "
             "And thanks to you. The quick brown fox jumps over the lazy dog. "
             "Speech synthesis converts text into natural sounding audio, one sentence at a time.")


def _say(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def median(values: list[float]) -> float | None:
    if not values:
        return None
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


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


# ---- engine-side timing ---------------------------------------------------------------------

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


def _perf_value(lines: list[str], pattern: re.Pattern) -> tuple[float, ...]:
    for line in reversed(lines):
        m = pattern.search(line)
        if m:
            return tuple(float(g) for g in m.groups())
    raise VocableError(f"the engine logged no line matching {pattern.pattern!r} (got {lines!r})")


# ---- stage groups ---------------------------------------------------------------------------

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
    shared: dict = field(default_factory=dict)   # work shared between groups: synthesis runs, reference runs,
                                                 # files to remove at the end ("temp_files")


@dataclass
class GroupResult:
    runs_ms: dict[str, list[float]] = field(default_factory=dict)
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    error: str | None = None


class StageGroup:
    """Stages timed together: one engine call (or a few) and one reference script."""
    name = ""
    stages: list[tuple[str, str]] = []    # (key, label), in table order
    total: tuple[str, str] | None = None  # (key, label) of a row summing the stages, per run
    reference_script = ""

    def run_vocable(self, engine, inp: BenchInput) -> GroupResult:
        raise NotImplementedError

    def reference_args(self, inp: BenchInput) -> list[str]:
        return []

    def agreement(self, ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray]) -> dict:
        return {}

    def describe_agreement(self, agreement: dict) -> str:
        return ""

    def rows(self, o: GroupResult, t: GroupResult | None) -> list[dict]:
        """The table rows (report "stages" entries) of this group: one per stage, plus the total."""
        if self.total:   # per-run sums of the group's stages, on both sides
            for side in (o, t):
                if side and not side.error and all(side.runs_ms.get(k) for k, _ in self.stages):
                    side.runs_ms[self.total[0]] = [sum(run) for run in zip(*(side.runs_ms[k] for k, _ in self.stages))]
        return [stage_row(self.name, key, label, o, t) for key, label in self.stages + ([self.total] if self.total else [])]


def stage_row(group: str, key: str, label: str, o: GroupResult, t: GroupResult | None,
              ref_key: str | None = None, **more) -> dict:
    """A report row: medians of our runs of `key` and of the reference's runs of `ref_key`."""
    ref_key = ref_key or key
    ours = o.runs_ms.get(key, [])
    theirs = t.runs_ms.get(ref_key, []) if t and not t.error else []
    v, r = median(ours), median(theirs)
    row = {"group": group, "key": key, "label": label, "vocable_ms": _round(v), "reference_ms": _round(r),
           "speedup": round(r / v, 3) if v and r else None,
           "vocable_min_ms": _round(min(ours or [None])),  # least disturbed
           "reference_min_ms": _round(min(theirs or [None])),
           "vocable_runs_ms": [round(x, 2) for x in ours],
           "reference_runs_ms": [round(x, 2) for x in theirs],
           "error": o.error}
    row.update(more)
    return row


class VoiceStages(StageGroup):
    """`Engine.embed_voice` against `extract_speaker_embedding` + `speech_tokenizer.encode`."""
    name = "voice"
    stages = [("speaker_embedding", "speaker embedding (mel + ECAPA)"),
              ("reference_codes", "reference codes (Mimi encoder)")]
    total = ("voice_total", "voice (embedding + codes)")
    reference_script = "reference_voice_timing.py"
    _PERF = re.compile(r"\[Perf\] speaker embedding: ([\d.]+) ms, reference codes: ([\d.]+) ms")

    def run_vocable(self, engine, inp: BenchInput) -> GroupResult:
        res = GroupResult(runs_ms={k: [] for k, _ in self.stages})
        walls = []
        for i in range(1 + inp.repeats):
            with engine_perf_lines() as lines:
                t0 = time.perf_counter()
                voice = engine.embed_voice(inp.clip, SAMPLE_RATE)
                wall = 1e3 * (time.perf_counter() - t0)
            spk_ms, codes_ms = _perf_value(lines, self._PERF)
            if i == 0:   # warm-up
                res.outputs = {"speaker_embedding": voice.speaker_embedding, "reference_codes": voice.codes}
                continue
            res.runs_ms["speaker_embedding"].append(spk_ms)
            res.runs_ms["reference_codes"].append(codes_ms)
            walls.append(wall)
        res.extra["embed_voice_wall_ms"] = round(median(walls), 2)
        return res

    def agreement(self, ours, theirs) -> dict:
        a = np.asarray(ours["speaker_embedding"], dtype=np.float64).ravel()
        b = np.asarray(theirs["speaker_embedding"], dtype=np.float64).ravel()
        out: dict = {}
        if a.shape == b.shape:
            out["speaker_embedding_cosine"] = round(float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30)), 6)
            out["speaker_embedding_max_abs_diff"] = float(np.abs(a - b).max())
        else:
            out["speaker_embedding_shapes"] = [list(a.shape), list(b.shape)]
        x = np.asarray(ours["reference_codes"])
        y = np.asarray(theirs["reference_codes"])
        out["code_frames"] = [int(x.shape[0]), int(y.shape[0])]
        if x.ndim == 2 and y.ndim == 2 and x.shape[1] == y.shape[1]:
            n = min(x.shape[0], y.shape[0])
            same = x[:n] == y[:n]
            out["codes_identical"] = round(float(same.mean()), 4) if n else None
            out["codes_identical_codebook0"] = round(float(same[:, 0].mean()), 4) if n else None
            exact = same.all(axis=1)
            out["frames_identical"] = round(float(exact.mean()), 4) if n else None
        else:
            out["code_shapes"] = [list(x.shape), list(y.shape)]
        return out

    def describe_agreement(self, ag: dict) -> str:
        parts = []
        if "speaker_embedding_cosine" in ag:
            parts.append(f"speaker embedding cosine {ag['speaker_embedding_cosine']:.6f}")
        elif "speaker_embedding_shapes" in ag:
            parts.append(f"speaker embedding shapes differ: {ag['speaker_embedding_shapes']}")
        if ag.get("codes_identical") is not None:
            f = ag["code_frames"]
            frames = f"{f[0]} frames" if f[0] == f[1] else f"{f[0]} vs {f[1]} frames (compared {min(f)})"
            parts.append(f"reference codes {100 * ag['codes_identical']:.1f}% identical "
                         f"(codebook 0: {100 * ag['codes_identical_codebook0']:.1f}%, "
                         f"whole frames: {100 * ag['frames_identical']:.1f}%), {frames}")
        elif "code_shapes" in ag:
            parts.append(f"code shapes differ: {ag['code_shapes']}")
        return "; ".join(parts)


def codes_agreement(x: np.ndarray, y: np.ndarray) -> dict:
    """Share of identical codes between two [frames, 16] code arrays, over the common frames."""
    x, y = np.asarray(x), np.asarray(y)
    out: dict = {"frames": [int(x.shape[0]), int(y.shape[0])]}
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1]:
        out["shapes"] = [list(x.shape), list(y.shape)]
        return out
    n = min(x.shape[0], y.shape[0])
    if not n:
        return out
    same = x[:n] == y[:n]
    exact = same.all(axis=1)
    out.update(identical=round(float(same.mean()), 4), identical_codebook0=round(float(same[:, 0].mean()), 4),
               frames_identical=round(float(exact.mean()), 4),
               first_different_frame=None if exact.all() else int(np.argmin(exact)))
    return out


@dataclass
class SynthesisCall:
    """One `Engine.synthesize` call as the bench saw it."""
    result: object                 # the SynthesisResult: codes, audio, mode, reached_eos, ...
    lines: list[str]               # the engine's [Perf] lines of this call
    wall_ms: float                 # from the call to the whole result
    first_chunk_ms: float | None   # from the call to the first audio chunk in this thread (a stream)
    chunks: int                    # audio chunks the stream yielded


@dataclass
class TypeRuns:
    """The synthesis calls of one weight type: a warm-up, then `repeats` timed calls."""
    info: dict                                                  # model file, load time, mode ...
    calls: list[SynthesisCall] = field(default_factory=list)    # [0] is the warm-up
    error: str | None = None


def synthesis_runs(engine, inp: BenchInput) -> dict[str, TypeRuns]:
    """`Engine.synthesize` of the generation text for `inp.frames` frames (x-vector mode with the
    clip's voice, greedy) for each weight type: 1 warm-up + `repeats` calls each. Run once and
    shared by the generation and synthesis groups (one call gives both groups' [Perf] lines):
    kept in inp.shared, with the speaker embedding and the engine's codes saved for the
    reference process."""
    if "synthesis_runs" in inp.shared:
        return inp.shared["synthesis_runs"]
    from ..engine import X_VECTOR, Engine

    voice = engine.embed_voice(inp.clip, SAMPLE_RATE)   # no transcript: x-vector mode
    speaker = np.asarray(voice.speaker_embedding, dtype=np.float32)
    inp.shared["speaker_embedding"] = speaker
    inp.shared["speaker_path"] = _temp_file(inp, "speaker", ".npy")
    np.save(inp.shared["speaker_path"], speaker)
    runs: dict[str, TypeRuns] = {}
    for wt in list(inp.models) or [inp.main_type]:
        model = inp.models.get(wt)
        own = model is not None and wt != inp.main_type
        tr = runs[wt] = TypeRuns({"gguf": str(model.gguf) if model else None,
                                  "gguf_bytes": model.gguf_bytes if model else None,
                                  "convert_s": model.convert_s if model else None})
        try:
            _say(f"engine: synthesis, {wt}, {inp.frames} frames, 1 warm-up + {inp.repeats} run(s)")
            if own:
                with engine_perf_lines():
                    t0 = time.perf_counter()
                    eng = Engine(model.gguf, threads=inp.threads)
                    tr.info["load_s"] = round(time.perf_counter() - t0, 3)
            else:
                eng = engine
            try:
                for _ in range(1 + inp.repeats):
                    tr.calls.append(_synthesize(eng, voice, inp.frames))
            finally:
                if own:
                    eng.close()
            first = tr.calls[0].result
            tr.info.update(frames=int(first.codes.shape[0]), frames_requested=inp.frames,
                           reached_eos=bool(first.reached_eos), mode=first.mode, mode_reason=first.mode_reason)
            if any(not np.array_equal(c.result.codes, first.codes) for c in tr.calls[1:]):
                tr.info["codes_vary_between_runs"] = True
            if first.mode != X_VECTOR:
                raise VocableError(f"the engine ran {first.mode} mode, not {X_VECTOR}")
        except VocableError as e:
            tr.error = str(e)
    codes = {wt: tr.calls[0].result.codes for wt, tr in runs.items() if tr.calls}
    if codes:   # for the reference's decoder (the waveform agreement)
        inp.shared["codes_path"] = _temp_file(inp, "codes", ".npz")
        np.savez(inp.shared["codes_path"], **{wt: np.asarray(c, dtype=np.int32) for wt, c in codes.items()})
    inp.shared["synthesis_runs"] = runs
    return runs


def _synthesize(eng, voice, frames: int) -> SynthesisCall:
    """One greedy synthesis, timed: the stream is consumed chunk by chunk, as a player would. The
    engine's cached prompts are dropped first, so every call times a new prompt's prefill."""
    eng.forget_prompts()
    with engine_perf_lines() as lines:
        t0 = time.perf_counter()
        first, chunks = None, 0
        with eng.synthesize(GEN_TEXT, voice, GEN_LANGUAGE, greedy=True, max_frames=frames) as stream:
            for _ in stream:
                if first is None:
                    first = 1e3 * (time.perf_counter() - t0)
                chunks += 1
            result = stream.result()
        wall = 1e3 * (time.perf_counter() - t0)
    return SynthesisCall(result, list(lines), wall, first, chunks)


def _temp_file(inp: BenchInput, stem: str, suffix: str) -> Path:
    path = inp.work_dir / f"{stem}-{os.getpid()}{suffix}"
    inp.shared.setdefault("temp_files", []).append(path)
    return path


def synthesis_reference_args(inp: BenchInput) -> list[str]:
    """The reference process's arguments, one set for both groups that read it (so it runs once)."""
    args = ["--frames", str(inp.frames), "--text", GEN_TEXT, "--language", GEN_LANGUAGE]
    for flag, key in (("--speaker-embedding", "speaker_path"), ("--decode-codes", "codes_path")):
        path = inp.shared.get(key)
        if path is not None and Path(path).is_file():
            args += [flag, str(path)]
    return args


class PerTypeStages(StageGroup):
    """Figures of the shared synthesis runs (synthesis_runs), per weight type, against the shared
    reference run: subclasses read theirs from each type's calls (`figures`)."""
    reference_script = SYNTHESIS_SCRIPT

    def __init__(self) -> None:
        self.frames = DEFAULT_FRAMES
        self.types: list[str] = []

    def run_vocable(self, engine, inp: BenchInput) -> GroupResult:
        self.frames = inp.frames
        self.types = list(inp.models) or [inp.main_type]
        res = GroupResult()
        if "synthesis_runs" in inp.shared:
            _say(f"engine: {self.name} stages from the same runs")
        runs = synthesis_runs(engine, inp)
        errors = []
        for wt, tr in runs.items():
            info = res.extra[wt] = self.type_info(tr)
            try:
                if tr.error:
                    raise VocableError(tr.error)
                self.figures(wt, tr, res, info)
            except VocableError as e:
                info["error"] = str(e)
                errors.append(f"{wt}: {e}")
        if errors:
            res.error = "; ".join(errors)
        return res

    def type_info(self, tr: TypeRuns) -> dict:
        """The start of a weight type's entry in the group's extra."""
        return {}

    def figures(self, wt: str, tr: TypeRuns, res: GroupResult, info: dict) -> None:
        """Puts the type's runs (res.runs_ms), outputs and info from its calls; VocableError
        when they lack something."""
        raise NotImplementedError

    def reference_args(self, inp: BenchInput) -> list[str]:
        return synthesis_reference_args(inp)


class GenerationStages(PerTypeStages):
    """`Engine.synthesize` (x-vector, greedy, a fixed frame count) for each weight type, against
    the reference's fp32 `generate_voice_clone` with the same speaker embedding: the talker and
    code predictor."""
    name = "generation"
    _PROMPT = re.compile(r"\[Perf\] prompt build: ([\d.]+) ms \((\d+) positions\), prefill: ([\d.]+) ms "
                         r"\((\d+) positions from the cache\), time to first frame: ([\d.]+) ms")
    _FRAMES = re.compile(r"\[Perf\] (\d+) frames \((?:EOS|frame cap)\): talker ([\d.]+) ms/frame, "
                         r"code predictor ([\d.]+) ms/frame, total ([\d.]+) ms")
    # (key suffix, label, reference key): per weight type; "total" is the per-run sum of the first two
    ROWS = [("talker", "talker ms/frame", "talker_ms_per_frame"),
            ("code_predictor", "code predictor ms/frame", "code_predictor_ms_per_frame"),
            ("total", "talker + code predictor ms/frame", "total_ms_per_frame"),
            ("prefill", "prefill ms", "prefill_ms"),
            ("first_frame", "time to first frame ms", None)]

    def run_vocable(self, engine, inp: BenchInput) -> GroupResult:
        res = super().run_vocable(engine, inp)
        res.outputs["speaker_embedding"] = inp.shared["speaker_embedding"]
        return res

    def type_info(self, tr: TypeRuns) -> dict:
        return dict(tr.info)   # the model and the run: file, load time, frames, mode ...

    def figures(self, wt: str, tr: TypeRuns, res: GroupResult, info: dict) -> None:
        runs = {k: [] for k, _, _ in self.ROWS}
        for i, call in enumerate(tr.calls):
            _, positions, prefill, cached, first = _perf_value(call.lines, self._PROMPT)
            _, talker, predictor, _ = _perf_value(call.lines, self._FRAMES)
            if i == 0:   # warm-up: its codes are the output (greedy: every run gives the same)
                res.outputs[f"{wt}:codes"] = call.result.codes
                info["prompt_positions"] = int(positions)
                continue
            info["prompt_positions_cached"] = int(cached)   # 0: _synthesize drops the cached prompts
            for key, v in (("talker", talker), ("code_predictor", predictor), ("total", talker + predictor),
                           ("prefill", prefill), ("first_frame", first)):
                runs[key].append(v)
        for key, v in runs.items():
            res.runs_ms[f"{wt}:{key}"] = v
        info["synthesize_wall_ms"] = _round(median([c.wall_ms for c in tr.calls[1:]]))
        total = median(runs["total"])
        info["real_time_factor"] = round(total / FRAME_MS, 3) if total else None   # generation only

    def rows(self, o: GroupResult, t: GroupResult | None) -> list[dict]:
        if t and not t.error:
            a, b = t.runs_ms.get("talker_ms_per_frame"), t.runs_ms.get("code_predictor_ms_per_frame")
            if a and b:
                t.runs_ms["total_ms_per_frame"] = [x + y for x, y in zip(a, b)]
        out = []
        for wt in self.types:
            info = o.extra.get(wt, {})
            for key, label, ref_key in self.ROWS:
                if key == "prefill" and info.get("prompt_positions") is not None:
                    label = f"prefill ms ({info['prompt_positions']} positions"
                    cached = info.get("prompt_positions_cached")
                    label += f", {cached} from the cache)" if cached else ")"
                row = stage_row(self.name, f"{wt}:{key}", label, o, t if ref_key else None, ref_key=ref_key,
                                section=f"generation {wt} ({self.frames} frames, x-vector, greedy)",
                                weight_type=wt, error=info.get("error"))
                if key == "total":
                    row["targets"] = self.targets(wt, row)
                out.append(row)
        return out

    @staticmethod
    def targets(wt: str, row: dict) -> list[dict]:
        """The issue's targets for a talker + code predictor row, each with met: True/False/None."""
        v, speedup = row["vocable_ms"], row["speedup"]
        out = []
        if wt in TARGET_MS:
            out.append({"what": "ms_per_frame_below", "value": TARGET_MS[wt],
                        "met": None if v is None else v < TARGET_MS[wt]})
        out.append({"what": "speedup_at_least", "value": TARGET_SPEEDUP,
                    "met": None if speedup is None else speedup >= TARGET_SPEEDUP})
        return out

    def agreement(self, ours, theirs) -> dict:
        out: dict = {}
        ref = theirs.get("codes")
        for wt in self.types:
            if f"{wt}:codes" in ours and ref is not None:
                out[wt] = codes_agreement(ours[f"{wt}:codes"], ref)
        a = np.asarray(ours.get("speaker_embedding", []), dtype=np.float64).ravel()
        b = np.asarray(theirs.get("speaker_embedding", []), dtype=np.float64).ravel()
        out["same_speaker_embedding"] = bool(a.shape == b.shape and a.size and np.array_equal(a, b))
        return out

    def describe_agreement(self, ag: dict) -> str:
        parts = []
        for wt in self.types:
            a = ag.get(wt)
            if not a:
                continue
            if a.get("identical") is None:
                parts.append(f"{wt}: not comparable ({a})")
                continue
            f = a["frames"]
            frames = f"{f[0]} frames" if f[0] == f[1] else f"{f[0]} vs {f[1]} frames (compared {min(f)})"
            first = "" if a["first_different_frame"] is None else f", first difference at frame {a['first_different_frame']}"
            parts.append(f"{wt} {100 * a['identical']:.1f}% identical (codebook 0: {100 * a['identical_codebook0']:.1f}%, "
                         f"whole frames: {100 * a['frames_identical']:.1f}%{first}), {frames}")
        if not parts:
            return ""
        same = "same speaker embedding" if ag.get("same_speaker_embedding") else "speaker embeddings differ"
        return (f"greedy generation codes vs the reference ({same}; near-ties may flip on random weights):"
                + "".join(f"\n    {p}" for p in parts))


def waveform_agreement(ours: np.ndarray, theirs: np.ndarray) -> dict:
    """Two decodes of the same codes: cosine and residual (dB below the reference's signal) over
    the common samples."""
    a = np.asarray(ours, dtype=np.float64).ravel()
    b = np.asarray(theirs, dtype=np.float64).ravel()
    out: dict = {"samples": [int(a.size), int(b.size)]}
    n = min(a.size, b.size)
    if not n:
        return out
    a, b = a[:n], b[:n]
    diff, signal = float(np.sum((a - b) ** 2)), float(np.sum(b * b))
    out.update(cosine=round(float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30)), 6),
               residual_db=round(10 * np.log10(diff / signal), 1) if diff > 0 and signal > 0 else None,
               max_abs_diff=float(np.abs(a - b).max()))
    return out


class SynthesisStages(PerTypeStages):
    """Audio out, from the same `Engine.synthesize` calls as the generation stages (streamed,
    decoded while generating), for each weight type: codec decode ms per second of audio, time
    to first audio and the whole synthesis' wall time per second of audio (the real-time factor
    x 1000), from the engine's [Perf] lines. The reference (the same process as the generation
    stages) decodes all codes after generate and does not stream: its first audio is the end of
    the whole call. Agreement: the reference's decoder on the engine's codes of each weight
    type against the engine's audio."""
    name = "synthesis"
    _DECODE = re.compile(r"\[Perf\] codec decode: ([\d.]+) ms per second of audio \((\d+) frames in (\d+) chunks\)")
    _FIRST_AUDIO = re.compile(r"\[Perf\] time to first audio: ([\d.]+) ms")
    _SYNTHESIS = re.compile(r"\[Perf\] synthesis: ([\d.]+) s of audio in ([\d.]+) s, real-time factor ([\d.]+)")
    ROWS = [("decode", "codec decode ms per s of audio", "decode_ms_per_audio_s"),
            ("first_audio", "time to first audio ms", "first_audio_ms"),
            ("synthesis", "whole synthesis ms per s of audio (RTF x 1000)", "synthesis_ms_per_audio_s")]

    def figures(self, wt: str, tr: TypeRuns, res: GroupResult, info: dict) -> None:
        first = tr.calls[0].result
        audio = np.asarray(first.audio, dtype=np.float32)
        if not audio.size:
            raise VocableError("the engine returned no audio")
        runs = {k: [] for k, _, _ in self.ROWS}
        for i, call in enumerate(tr.calls):
            decode, frames, chunks = _perf_value(call.lines, self._DECODE)
            first_audio, = _perf_value(call.lines, self._FIRST_AUDIO)
            audio_s, _, rtf = _perf_value(call.lines, self._SYNTHESIS)
            if i == 0:   # warm-up: its audio is the output (greedy: every run gives the same)
                res.outputs[f"{wt}:audio"] = audio
                info.update(frames=int(frames), engine_chunks=int(chunks), audio_s=audio_s, samples=int(audio.size),
                            samples_expected=int(first.codes.shape[0]) * SAMPLES_PER_FRAME)
                continue
            runs["decode"].append(decode)
            runs["first_audio"].append(first_audio)
            runs["synthesis"].append(1e3 * rtf)
        for key, v in runs.items():
            res.runs_ms[f"{wt}:{key}"] = v
        timed = tr.calls[1:]
        info["stream_chunks"] = timed[0].chunks if timed else None
        firsts = [c.first_chunk_ms for c in timed if c.first_chunk_ms is not None]
        info["first_chunk_wall_ms"] = _round(median(firsts))   # in this thread, through the stream
        wall = median([c.wall_ms for c in timed])
        info["synthesize_wall_ms"] = _round(wall)
        rtf = median(runs["synthesis"])
        info["real_time_factor"] = round(rtf / 1e3, 3) if rtf else None
        # the same from this thread: tokenizing the text and the stream's queue included
        info["wall_real_time_factor"] = round(wall / 1e3 / audio_s, 3) if wall and audio_s else None

    def rows(self, o: GroupResult, t: GroupResult | None) -> list[dict]:
        out = []
        audio_s = self.frames * FRAME_MS / 1e3
        for wt in self.types:
            info = o.extra.get(wt, {})
            for key, label, ref_key in self.ROWS:
                row = stage_row(self.name, f"{wt}:{key}", label, o, t, ref_key=ref_key,
                                section=f"synthesis {wt} ({self.frames} frames = {audio_s:g} s of audio, x-vector, "
                                        f"greedy, streamed)",
                                weight_type=wt, error=info.get("error"))
                if key == "synthesis":
                    row["vocable_rtf"] = _rtf(row["vocable_ms"])
                    row["reference_rtf"] = _rtf(row["reference_ms"])
                row["targets"] = self.targets(wt, key, row)
                out.append(row)
        return out

    @staticmethod
    def targets(wt: str, key: str, row: dict) -> list[dict]:
        """The issue's targets for a synthesis row, each with met: True/False/None."""
        v, speedup = row["vocable_ms"], row["speedup"]
        if key == "decode":
            return [{"what": "speedup_at_least", "value": TARGET_DECODE_SPEEDUP,
                     "met": None if speedup is None else speedup >= TARGET_DECODE_SPEEDUP}]
        if key == "first_audio":
            return [{"what": "ms_below", "value": TARGET_FIRST_AUDIO_MS,
                     "met": None if v is None else v < TARGET_FIRST_AUDIO_MS}]
        if key == "synthesis" and wt in TARGET_RTF:
            return [{"what": "rtf_below", "value": TARGET_RTF[wt],
                     "met": None if v is None else v / 1e3 < TARGET_RTF[wt]}]
        return []

    def agreement(self, ours, theirs) -> dict:
        out: dict = {}
        for wt in self.types:
            a, b = ours.get(f"{wt}:audio"), theirs.get(f"decoded_{wt}")
            if a is not None and b is not None:   # both decoders on the same (the engine's) codes
                out[wt] = waveform_agreement(a, b)
        return out

    def describe_agreement(self, ag: dict) -> str:
        parts = []
        for wt in self.types:
            a = ag.get(wt)
            if not a:
                continue
            s = a["samples"]
            if a.get("cosine") is None:
                parts.append(f"{wt}: nothing to compare ({s[0]} vs {s[1]} samples)")
                continue
            res = "exact" if a["residual_db"] is None else f"residual {a['residual_db']:.1f} dB"
            length = f"{s[0]} samples" if s[0] == s[1] else f"{s[0]} vs {s[1]} samples (compared {min(s)})"
            parts.append(f"{wt} waveform cosine {a['cosine']:.6f} ({res}, max abs diff {a['max_abs_diff']:.2g}), "
                         f"{length}")
        if not parts:
            return ""
        return "audio: the reference's decoder on the engine's codes vs the engine's audio:" + \
            "".join(f"\n    {p}" for p in parts)


def _rtf(ms_per_audio_s: float | None) -> float | None:
    return None if ms_per_audio_s is None else round(ms_per_audio_s / 1e3, 3)


STAGE_GROUPS: list[StageGroup] = [VoiceStages(), GenerationStages(), SynthesisStages()]


# ---- reference side -------------------------------------------------------------------------

_PROBE = ("import importlib.util as u, sys; "
          "sys.exit(0 if u.find_spec('torch') and u.find_spec('qwen_tts') else 3)")


def find_reference_python() -> tuple[str | None, str]:
    """(interpreter, '') or (None, why not)."""
    named = os.environ.get(REFERENCE_PYTHON_ENV)
    if named:
        if not Path(named).is_file():
            return None, f"{REFERENCE_PYTHON_ENV}={named} does not exist"
        try:
            probe = subprocess.run([named, "-c", _PROBE], capture_output=True, timeout=120)
        except (OSError, subprocess.SubprocessError) as e:
            return None, f"{REFERENCE_PYTHON_ENV}={named} does not run ({e})"
        if probe.returncode != 0:
            return None, f"{REFERENCE_PYTHON_ENV}={named} lacks torch or qwen_tts"
        return named, ""
    if importlib.util.find_spec("torch") and importlib.util.find_spec("qwen_tts"):
        return sys.executable, ""
    return None, (f"no Python with torch and qwen-tts: set {REFERENCE_PYTHON_ENV} to one "
                  "(qwen-tts 0.1.1, torch, transformers 4.57.3)")


def run_reference(group: StageGroup, python: str, hf_dir: Path, inp: BenchInput) -> GroupResult:
    """The group's reference script in a subprocess. Groups that ask for the same script with the
    same arguments get the result of one run (kept in inp.shared)."""
    script = TOOLS_DIR / group.reference_script
    args = group.reference_args(inp)
    done = inp.shared.setdefault("reference_runs", {})
    key = (group.reference_script, python, str(hf_dir), tuple(args))
    if key not in done:
        done[key] = _run_reference_script(script, python, hf_dir, inp, args)
    return done[key]


def _run_reference_script(script: Path, python: str, hf_dir: Path, inp: BenchInput, args: list[str]) -> GroupResult:
    if not script.is_file():
        return GroupResult(error=f"skipped: {script} not found (the reference scripts live in a source checkout)")
    outputs = inp.work_dir / f"reference-{script.stem}.npz"
    outputs.unlink(missing_ok=True)
    cmd = [python, str(script), "--model-dir", str(hf_dir), "--clip", str(inp.clip_path), "--outputs", str(outputs),
           "--threads", str(inp.threads), "--repeats", str(inp.repeats), *args]
    env = dict(os.environ, OMP_NUM_THREADS=str(inp.threads), MKL_NUM_THREADS=str(inp.threads),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=REFERENCE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return GroupResult(error=f"failed: {script.name} ran past {REFERENCE_TIMEOUT_S} s")
    except OSError as e:
        return GroupResult(error=f"failed: cannot run {python}: {e}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        return GroupResult(error=f"failed: {script.name} exited with {proc.returncode}:\n{tail}")
    try:
        report = json.loads(lines[-1])
        with np.load(outputs) as npz:
            outs = {k: npz[k] for k in npz.files}
    except (ValueError, OSError) as e:
        return GroupResult(error=f"failed: unreadable result from {script.name}: {e}")
    return GroupResult(runs_ms={k: list(v) for k, v in report.get("runs_ms", {}).items()}, outputs=outs,
                       extra={k: v for k, v in report.items() if k not in ("runs_ms", "median_ms")})


# ---- report ---------------------------------------------------------------------------------

def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


_TARGET_TEXT = {"ms_per_frame_below": "< {:g} ms", "ms_below": "< {:g} ms", "speedup_at_least": ">= {:g}x",
                "rtf_below": "RTF < {:g}"}


def _targets(targets: list[dict] | None) -> str:
    """The target column: each target and whether it is met (yes / NO / ? when unknown)."""
    if not targets:
        return ""
    words = {True: "yes", False: "NO", None: "?"}
    return ", ".join(f"{_TARGET_TEXT[t['what']].format(t['value'])}: {words[t['met']]}" for t in targets)


def missed_targets(stages: list[dict]) -> list[str]:
    """One line per missed target: which row, the figure, the target and by how much it is missed."""
    out = []
    for s in stages:
        for t in s.get("targets") or []:
            if t["met"] is not False:
                continue
            where = f"{s['group']} {s['weight_type']}" if s.get("weight_type") else s["group"]
            v, limit = s["vocable_ms"], t["value"]
            if t["what"] in ("ms_per_frame_below", "ms_below"):
                unit = " ms/frame" if t["what"] == "ms_per_frame_below" else " ms"
                by = (f"{v:.1f}{unit}, target < {limit:g}{unit}: {v - limit:.1f}{unit} "
                      f"({100 * (v / limit - 1):.0f} %) over")
            elif t["what"] == "rtf_below":
                rtf = v / 1e3
                by = f"real-time factor {rtf:.3f}, target < {limit:g}: {100 * (rtf / limit - 1):.0f} % over"
            else:
                by = f"{s['speedup']:.2f}x the reference, target >= {limit:g}x"
            out.append(f"{where}, {s['label']}: {by}")
    return out


def _size(n: int | None) -> str:
    if not n:
        return "-"
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def _print_report(rep: dict) -> None:
    m = rep["model"]
    what = ("random weights, real Qwen3-TTS-12Hz-0.6B-Base shapes" if m["random_weights"] and m["hf_dir"] else
            "the given model")
    print(f"vocable bench {rep['vocable_version']}: {what} ({m['weight_type']})")
    print(f"  {rep['threads']} thread(s), {rep['ref_seconds']:g} s reference clip ({rep['clip_source']}), "
          f"{rep['cpu']} ({rep['cpus']} CPUs); median of {rep['repeats']} run(s) after 1 warm-up")
    if rep.get("cpu_backend"):
        print(f"  ggml CPU backend: {rep['cpu_backend']}")
    busy = [x for x in rep["loadavg_1min"] if x is not None]
    if busy and max(busy) > rep["threads"] + 1:   # more than this benchmark itself
        print(f"  note: the machine was busy (1-min load average up to {max(busy):.1f}): figures may be skewed")
    ref = rep["reference"]
    ref_note = ref.get("package", "PyTorch reference") + (f", torch {ref['torch']}" if ref.get("torch") else "")
    rows: list = [("stage", "vocable ms", "reference ms", "speedup", "target")]
    section = None
    for s in rep["stages"]:
        if s.get("section") != section:
            section = s.get("section")
            rows.append(section)
        speed = f"{s['speedup']:.2f}x" if s["speedup"] else "-"
        label = ("  " if section else "") + s["label"]
        rows.append((label, _ms(s["vocable_ms"]), _ms(s["reference_ms"]), speed, _targets(s.get("targets"))))
    table = [r for r in rows if isinstance(r, tuple)]
    widths = [max(len(r[i]) for r in table) for i in range(5)]
    print()
    for i, r in enumerate(rows):
        if not isinstance(r, tuple):
            print(f"  {r}:" if r else "")
            continue
        print(f"  {r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]:>{widths[3]}}  {r[4]}".rstrip())
        if i == 0:
            print("  " + "-" * (sum(widths) + 8))
    print()
    failed = {}   # one line per section (or stage) and reason
    for s in rep["stages"]:
        if s.get("error"):
            failed.setdefault((s.get("section") or s["label"], s["error"]), None)
    for where, error in failed:
        print(f"  {where}: vocable failed: {error}")
    gen = rep.get("vocable_extra", {}).get("generation", {})
    runs = [f"{wt} {info['frames']}/{info['frames_requested']}" for wt, info in gen.items()
            if isinstance(info, dict) and "frames" in info]
    eos = [wt for wt, info in gen.items() if isinstance(info, dict) and info.get("reached_eos")]
    rgen = rep.get("reference_extra", {}).get("generation", {})
    if "frames" in rgen:
        runs.append(f"reference {rgen['frames']}/{rgen['frames_requested']}")
        eos += ["reference"] if rgen.get("reached_eos") else []
    if runs:
        print(f"  generation frames: {', '.join(runs)}; reached EOS: {', '.join(eos) or 'none'}")
    if "prefill_tokens" in rgen:
        ours = sorted({info["prompt_positions"] for info in gen.values() if isinstance(info, dict)
                       and "prompt_positions" in info})
        print(f"  generation prompt: {rgen['prefill_tokens']} positions in the reference, "
              f"{', '.join(map(str, ours)) or '-'} in vocable; reference codec_head EOS row zero: "
              f"{rgen.get('codec_eos_row_zero')}")
    if runs:
        print(f"  targets (issue 3): talker + code predictor < {TARGET_MS['q4_k']:g} ms/frame at q4_k, "
              f"< {TARGET_MS['q8_0']:g} ms/frame at q8_0 (a frame is {FRAME_MS:g} ms of audio), "
              f">= {TARGET_SPEEDUP:g}x faster than the reference (fp32)")
    syn = {wt: info for wt, info in rep.get("vocable_extra", {}).get("synthesis", {}).items()
           if isinstance(info, dict) and "stream_chunks" in info}
    if syn:
        first = ", ".join(f"{wt} {_ms(info.get('first_chunk_wall_ms'))} ms" for wt, info in syn.items())
        chunks = ", ".join(f"{wt} {info['stream_chunks']}" for wt, info in syn.items())
        print(f"  synthesis: streamed chunks per run {chunks}; first chunk in the calling thread after {first}")
        rsyn = rep.get("reference_extra", {}).get("synthesis", {})
        if "audio_s" in rsyn:
            print(f"  synthesis, reference: no streaming, its first audio is the end of generate + decode "
                  f"({rsyn['audio_s']:g} s of audio, decoded in one call)")
        rtf = ", ".join(f"{wt} {_TARGET_TEXT['rtf_below'].format(v)}" for wt, v in TARGET_RTF.items())
        print(f"  targets (issue 4): time to first audio < {TARGET_FIRST_AUDIO_MS:g} ms (x-vector, voice loaded), "
              f"codec decode faster than the reference, whole synthesis {rtf}")
    for line in bench_memory.describe(rep.get("memory") or {}, rep["frames"]):
        print(f"  {line}")
    for line in bench_batch.describe(rep.get("long_text") or {}):
        print(f"  {line}")
    if ref["status"] == "ok":
        shared = ref.get("same_run", {})
        loads = ", ".join(f"{v} s ({', '.join([k] + [g for g, first in shared.items() if first == k])})"
                          for k, v in (ref.get("load_s") or {}).items())
        print(f"  reference: {ref_note}, fp32, load {loads or '-'}")
    else:
        print(f"  reference {ref['status']}: {ref['reason']}")
    for text in rep["agreement_text"]:
        print(f"  agreement: {text}")
    if rep.get("contention"):
        print(f"  beside other work (streamed synthesis, {rep['frames']} frames, greedy; busy processes spin one "
              f"core each, other engines synthesize the same text in a loop):")
        for wt, c in rep["contention"].items():
            for line in ([f"{wt}: failed: {c['error']}"] if "error" in c else bench_contention.describe(wt, c)):
                print(f"    {line}")
    if rep.get("cpu_variants"):
        print(f"  CPU variants (streamed synthesis, {rep['frames']} frames, greedy; one process each):")
        for wt, c in rep["cpu_variants"].items():
            for line in bench_variants.describe(wt, c):
                print(f"    {line}")
    missed = rep.get("missed_targets") or []
    if missed:
        print(f"  MISSED TARGETS ({len(missed)}):")
        for line in missed:
            print(f"    {line}")
    if not m["random_weights"]:
        built = "given"
    else:
        built = f"built in {m['build_s']:.1f} s" if m.get("build_s") is not None else "built earlier (cached)"
    conv = f"converted in {m['convert_s']:.1f} s" if m.get("convert_s") is not None else "conversion cached"
    print(f"  model: {built}, {conv}; HF folder {_size(m['hf_bytes'])}, GGUF {_size(m['gguf_bytes'])}; "
          f"engine load {rep['vocable_load_s']:.2f} s")
    extra = []
    for wt, info in rep.get("vocable_extra", {}).get("generation", {}).items():
        if isinstance(info, dict) and "load_s" in info:
            conv = f"converted in {info['convert_s']:.1f} s" if info.get("convert_s") is not None else "conversion cached"
            extra.append(f"{wt} {_size(info.get('gguf_bytes'))} ({conv}, load {info['load_s']:.2f} s)")
    if extra:
        print(f"  generation models: {'; '.join(extra)}")


# ---- entry point ----------------------------------------------------------------------------

def run_bench(args) -> int:
    """`vocable bench`. Reads args.threads, args.ref_seconds, args.repeats, args.cache_dir,
    args.no_reference and (optional) args.model: an HF folder or .gguf to use instead of the
    random full-size model. Returns the exit status."""
    from .. import __version__
    from .model import default_cache_dir, ensure_bench_model, user_model
    from ..engine.convert import ConversionError
    from ..engine import Engine

    threads = int(args.threads or 2)
    repeats = int(args.repeats)
    seconds = float(args.ref_seconds)
    if threads < 1 or repeats < 1:
        raise VocableError("--threads and --repeats must be at least 1")
    if min(getattr(args, "background_load", 0) or 0, getattr(args, "background_engines", 0) or 0) < 0:
        raise VocableError("--background-load and --background-engines cannot be negative")
    if not 1.0 <= seconds <= 60.0:
        raise VocableError("--ref-seconds must be between 1 and 60 (the engine's reference length)")
    if getattr(args, "cpu_variants", None):
        bench_variants.parse(args.cpu_variants)
    frames = int(getattr(args, "frames", None) or DEFAULT_FRAMES)
    if frames < 1:
        raise VocableError("--frames must be at least 1")
    types = parse_types(getattr(args, "types", None))
    cache = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    given = getattr(args, "model", None)

    def prepare(weight_type: str):
        if given:
            return user_model(Path(given), cache, weight_type=weight_type, progress=_say)
        return ensure_bench_model(cache_dir=cache, weight_type=weight_type, progress=_say)
    try:
        model = prepare("f32")   # the voice stages' model, and generation's f32
        if model.hf_dir is None:   # a converted .gguf: its own type only
            models = {model.weight_type: model}
        else:
            models = {t: model if t == "f32" else prepare(t) for t in types}
    except (ConversionError, OSError, ValueError) as e:
        raise VocableError(f"cannot prepare the benchmark model: {e}") from e

    work = cache / "work"
    work.mkdir(parents=True, exist_ok=True)
    clip, clip_source = make_reference_clip(seconds)
    clip_path = work / f"clip-{os.getpid()}.npy"
    np.save(clip_path, clip)
    inp = BenchInput(clip, clip_path, work, threads, repeats, frames, models, model.weight_type)
    try:
        return _run(args, model, inp, clip_source, __version__, Engine)
    finally:
        clip_path.unlink(missing_ok=True)
        for path in inp.shared.get("temp_files", []):
            path.unlink(missing_ok=True)


def parse_types(value) -> list[str]:
    """--types: a comma-separated string or a list of weight types (default: all four)."""
    from ..engine.convert import WEIGHT_TYPES

    if not value:
        return list(DEFAULT_TYPES)
    items = value.split(",") if isinstance(value, str) else list(value)
    types = [t.strip().lower() for t in items if t.strip()]
    bad = [t for t in types if t not in WEIGHT_TYPES]
    if bad or not types:
        raise VocableError(f"--types: unknown weight type(s) {', '.join(bad) or '(none)'}; "
                           f"choose from {', '.join(WEIGHT_TYPES)}")
    return sorted(set(types), key=WEIGHT_TYPES.index)   # table order: f32, f16, q8_0, q4_k


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _run(args, model, inp: BenchInput, clip_source: str, version: str, Engine) -> int:
    from .. import _engine
    ours: dict[str, GroupResult] = {}
    load_before = _loadavg()
    _say(f"engine: {model.gguf.name}, {inp.threads} thread(s)")
    with engine_perf_lines():
        t0 = time.perf_counter()
        engine = Engine(model.gguf, threads=inp.threads)
        load_s = time.perf_counter() - t0
    busy, engines = int(getattr(args, "background_load", 0) or 0), int(getattr(args, "background_engines", 0) or 0)
    contention: dict[str, dict] = {}
    with engine:
        for g in STAGE_GROUPS:
            _say(f"engine: {g.name} stages, 1 warm-up + {inp.repeats} run(s)")
            try:
                ours[g.name] = g.run_vocable(engine, inp)
            except VocableError as e:
                ours[g.name] = GroupResult(error=str(e))
        if busy or engines:
            contention = contention_runs(engine, inp, busy, engines)
    long_text: dict[str, dict] = {}
    if not getattr(args, "no_long_text", False):
        from ..engine import FILE_BATCH
        long_text = long_text_runs(engine, inp, int(getattr(args, "batch", None) or FILE_BATCH))
    memory: dict[str, dict] = {}
    if "speaker_path" in inp.shared:   # the synthesis stages ran and saved the voice
        for wt in list(inp.models) or [inp.main_type]:
            gguf = inp.models[wt].gguf if wt in inp.models else model.gguf
            _say(f"engine: peak memory of a whole synthesis, {wt}: a process of its own")
            memory[wt] = bench_memory.peak_rss(str(gguf), str(inp.shared["speaker_path"]), inp.threads, inp.frames,
                                               wt)
    variants: dict[str, dict] = {}
    if getattr(args, "cpu_variants", None):
        names = bench_variants.parse(args.cpu_variants)
        for wt in list(inp.models) or [inp.main_type]:
            gguf = inp.models[wt].gguf if wt in inp.models else model.gguf
            _say(f"engine: CPU variants {', '.join(names)}, {wt}: one process each")
            variants[wt] = bench_variants.compare(str(gguf), str(inp.clip_path), inp.threads, inp.frames,
                                                  inp.repeats, names)

    theirs: dict[str, GroupResult] = {}
    ref = {"status": "skipped", "reason": "--no-reference"}
    if not args.no_reference:
        python, why = find_reference_python()
        if model.hf_dir is None:
            ref = {"status": "skipped", "reason": "the reference needs the Hugging Face folder, not a .gguf"}
        elif python is None:
            ref = {"status": "skipped", "reason": why}
        else:
            ref = {"status": "ok", "python": python}
            seen: dict[int, str] = {}   # one run shared by several groups is reported once
            for g in STAGE_GROUPS:
                _say(f"reference: {g.name} stages ({python})")
                r = theirs[g.name] = run_reference(g, python, model.hf_dir, inp)
                if r.error:
                    ref = {"status": r.error.split(":", 1)[0], "reason": r.error.split(":", 1)[1].strip(),
                           "python": python}
                    break
                if id(r) in seen:
                    _say(f"reference: {g.name} stages from the same run as {seen[id(r)]}")
                    ref.setdefault("same_run", {})[g.name] = seen[id(r)]
                    continue
                seen[id(r)] = g.name
                ref.update({k: r.extra[k] for k in ("package", "torch_threads") if k in r.extra})
                ref.setdefault("load_s", {})[g.name] = r.extra.get("load_s")
                ref["torch"] = r.extra.get("versions", {}).get("torch")
    if ref["status"] != "ok":
        print(f"reference {ref['status']}: {ref['reason']}", file=sys.stderr)

    stages, agreement, agreement_text = [], {}, []
    for g in STAGE_GROUPS:
        o, t = ours[g.name], theirs.get(g.name)
        stages.extend(g.rows(o, t))
        if o.outputs and t and t.outputs:
            agreement[g.name] = g.agreement(o.outputs, t.outputs)
            text = g.describe_agreement(agreement[g.name])
            if text:
                agreement_text.append(text)
    report = {
        "bench": "vocable", "vocable_version": version, "model": model.describe(),
        "threads": inp.threads, "ref_seconds": round(len(inp.clip) / SAMPLE_RATE, 3), "clip_source": clip_source,
        "repeats": inp.repeats, "cpu": cpu_name(), "cpus": os.cpu_count(), "vocable_load_s": round(load_s, 3),
        "cpu_backend": _engine.system_info(),
        "frames": inp.frames, "generation_text": GEN_TEXT, "generation_language": GEN_LANGUAGE,
        "vocable_extra": {g: r.extra for g, r in ours.items()}, "reference": ref,
        "reference_extra": {g: r.extra for g, r in theirs.items()}, "stages": stages,
        "agreement": agreement, "agreement_text": agreement_text,
        "missed_targets": missed_targets(stages) + bench_memory.missed(memory) +
                          bench_contention.missed(contention) + bench_variants.missed(variants) +
                          bench_batch.missed(long_text),
        "memory": memory, "contention": contention, "cpu_variants": variants, "long_text": long_text,
        "loadavg_1min": [load_before, _loadavg()],   # other work on the machine skews the figures
    }
    _print_report(report)
    print(json.dumps(report), flush=True)
    failed = any(r.error for r in ours.values()) or ref["status"] == "failed"
    return 1 if failed else 0


def _per_type(engine, inp: BenchInput, types: list[str], what: str, run) -> dict[str, dict]:
    """run(engine, voice) for each weight type, on the main engine or one loaded for the type
    (closed after), with the bench clip's voice; a VocableError becomes {"error": why}."""
    from ..engine import Engine

    out: dict[str, dict] = {}
    for wt in types:
        model = inp.models.get(wt)
        _say(f"engine: {what.format(wt=wt)}")
        own = model is not None and wt != inp.main_type
        eng = Engine(model.gguf, threads=inp.threads) if own else engine
        try:
            out[wt] = run(wt, eng, eng.embed_voice(inp.clip, SAMPLE_RATE))
        except VocableError as e:
            out[wt] = {"error": str(e)}
        finally:
            if own:
                eng.close()
    return out


def long_text_runs(engine, inp: BenchInput, batch: int) -> dict[str, dict]:
    """bench_batch for the quantized types benched: a 10-segment text one by one and `batch` at
    a time."""
    types = [t for t in ("q4_k", "q8_0") if t in inp.models] or [inp.main_type]
    return _per_type(engine, inp, types,
                     f"long text, {{wt}}: {bench_batch.N_SEGMENTS} segments one by one, then {batch} at a time",
                     lambda wt, eng, voice: bench_batch.compare(eng, voice, inp.frames, batch, wt))


def contention_runs(engine, inp: BenchInput, busy: int, engines: int) -> dict[str, dict]:
    """bench_contention for each weight type: quiet, then beside `busy` busy processes and
    `engines` other engines."""
    def run(wt, eng, voice):
        engine_args = [str(eng.model_path), str(inp.clip_path), str(inp.threads), GEN_TEXT, GEN_LANGUAGE,
                       str(max(inp.frames, 50))]
        return bench_contention.contention(lambda: _synthesize(eng, voice, inp.frames), inp.repeats, busy, engines,
                                           engine_args)
    return _per_type(engine, inp, list(inp.models) or [inp.main_type],
                     f"contention, {{wt}}: quiet, {busy} busy process(es), {engines} other engine(s)", run)


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 2)
