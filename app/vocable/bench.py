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
  - generation: `Engine.synthesize` of a fixed text for a fixed number of frames (default 50,
    4 s of audio), x-vector mode with the clip's voice, greedy, for each weight type (f32, f16,
    q8_0, q4_k: the random model converted once per type and cached); talker and code predictor
    ms/frame, prefill and time to first frame from the engine's `[Perf]` lines, next to the
    reference's fp32 talker and code predictor ms/frame (tools/bench/reference_generation_timing.py,
    same speaker embedding, `max_new_tokens` = frames + 1). The issue's targets are shown with
    them: talker + code predictor under 60 ms/frame at q4_k and under 90 ms/frame at q8_0 (a
    frame is 80 ms of audio), and at least 4x faster than the reference. The random model's
    codec_head row of codec EOS is zeroed, so neither side stops early (reached_eos is reported).
    Per frame means per generated frame on both sides: for N frames the engine runs N - 1 talker
    steps after the prefill (none after the last frame), HF generate runs N (the last token it
    samples is discarded by the package); both run the code predictor N times.
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

from .errors import VocableError

SAMPLE_RATE = 24000
REFERENCE_PYTHON_ENV = "VOCABLE_REFERENCE_PYTHON"
REFERENCE_TIMEOUT_S = 3600
DEFAULT_FRAMES = 50
DEFAULT_TYPES = ("f32", "f16", "q8_0", "q4_k")
GEN_TEXT = "The quick brown fox jumps over the lazy dog."   # as /work/shared/reference/bench_reference.py
GEN_LANGUAGE = "English"
FRAME_MS = 80.0                                                 # audio per codec frame (12.5 Hz)
# the targets for talker + code predictor per frame: (ms limit by weight type, min speedup)
TARGET_MS = {"q4_k": 60.0, "q8_0": 90.0}
TARGET_SPEEDUP = 4.0
TOOLS_DIR = Path(__file__).resolve().parents[2] / "tools" / "bench"   # source checkouts only
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


class GenerationStages(StageGroup):
    """`Engine.synthesize` (x-vector, greedy, a fixed frame count) for each weight type, against
    the reference's fp32 `generate_voice_clone` with the same speaker embedding."""
    name = "generation"
    reference_script = "reference_generation_timing.py"
    text, language = GEN_TEXT, GEN_LANGUAGE
    _PROMPT = re.compile(r"\[Perf\] prompt build: ([\d.]+) ms \((\d+) positions\), prefill: ([\d.]+) ms, "
                         r"time to first frame: ([\d.]+) ms")
    _FRAMES = re.compile(r"\[Perf\] (\d+) frames \((?:EOS|frame cap)\): talker ([\d.]+) ms/frame, "
                         r"code predictor ([\d.]+) ms/frame, total ([\d.]+) ms")
    # (key suffix, label, reference key): per weight type; "total" is the per-run sum of the first two
    ROWS = [("talker", "talker ms/frame", "talker_ms_per_frame"),
            ("code_predictor", "code predictor ms/frame", "code_predictor_ms_per_frame"),
            ("total", "talker + code predictor ms/frame", "total_ms_per_frame"),
            ("prefill", "prefill ms", "prefill_ms"),
            ("first_frame", "time to first frame ms", None)]

    def __init__(self) -> None:
        self.speaker_path: Path | None = None
        self.frames = DEFAULT_FRAMES
        self.types: list[str] = []

    def run_vocable(self, engine, inp: BenchInput) -> GroupResult:
        from .engine import X_VECTOR, Engine

        self.frames = inp.frames
        self.types = list(inp.models) or [inp.main_type]
        res = GroupResult()
        voice = engine.embed_voice(inp.clip, SAMPLE_RATE)   # no transcript: x-vector mode
        self.speaker_path = inp.work_dir / f"speaker-{os.getpid()}.npy"
        np.save(self.speaker_path, np.asarray(voice.speaker_embedding, dtype=np.float32))
        res.outputs["speaker_embedding"] = np.asarray(voice.speaker_embedding)
        errors = []
        for wt in self.types:
            model = inp.models.get(wt)
            own = model is not None and wt != inp.main_type
            info: dict = {"gguf": str(model.gguf) if model else None,
                          "gguf_bytes": model.gguf_bytes if model else None,
                          "convert_s": model.convert_s if model else None}
            res.extra[wt] = info
            try:
                _say(f"engine: generation, {wt}, {inp.frames} frames, 1 warm-up + {inp.repeats} run(s)")
                if own:
                    with engine_perf_lines():
                        t0 = time.perf_counter()
                        eng = Engine(model.gguf, threads=inp.threads)
                        info["load_s"] = round(time.perf_counter() - t0, 3)
                else:
                    eng = engine
                try:
                    self._time_type(eng, wt, voice, inp, res, info)
                finally:
                    if own:
                        eng.close()
                if info.get("mode") != X_VECTOR:
                    raise VocableError(f"{wt}: the engine ran {info.get('mode')} mode, not {X_VECTOR}")
            except VocableError as e:
                info["error"] = str(e)
                errors.append(f"{wt}: {e}")
        if errors:
            res.error = "; ".join(errors)
        return res

    def _time_type(self, eng, wt: str, voice, inp: BenchInput, res: GroupResult, info: dict) -> None:
        runs = {k: [] for k, _, _ in self.ROWS}
        walls = []
        for i in range(1 + inp.repeats):
            with engine_perf_lines() as lines:
                t0 = time.perf_counter()
                out = eng.synthesize(self.text, voice, self.language, greedy=True, max_frames=inp.frames)
                wall = 1e3 * (time.perf_counter() - t0)
            _, positions, prefill, first = _perf_value(lines, self._PROMPT)
            frames, talker, predictor, _ = _perf_value(lines, self._FRAMES)
            if i == 0:   # warm-up: its codes are the output (greedy: every run gives the same)
                res.outputs[f"{wt}:codes"] = out.codes
                info.update(frames=int(frames), frames_requested=inp.frames, reached_eos=out.reached_eos,
                            prompt_positions=int(positions), mode=out.mode, mode_reason=out.mode_reason)
                continue
            if not np.array_equal(out.codes, res.outputs[f"{wt}:codes"]):
                info["codes_vary_between_runs"] = True
            for key, v in (("talker", talker), ("code_predictor", predictor), ("total", talker + predictor),
                           ("prefill", prefill), ("first_frame", first)):
                runs[key].append(v)
            walls.append(wall)
        for key, v in runs.items():
            res.runs_ms[f"{wt}:{key}"] = v
        info["synthesize_wall_ms"] = _round(median(walls))
        total = median(runs["total"])
        info["real_time_factor"] = round(total / FRAME_MS, 3) if total else None   # generation only

    def reference_args(self, inp: BenchInput) -> list[str]:
        args = ["--frames", str(inp.frames), "--text", self.text, "--language", self.language]
        if self.speaker_path is not None and self.speaker_path.is_file():
            args += ["--speaker-embedding", str(self.speaker_path)]
        return args

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
                    label = f"prefill ms ({info['prompt_positions']} positions)"
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


STAGE_GROUPS: list[StageGroup] = [VoiceStages(), GenerationStages()]


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
    script = TOOLS_DIR / group.reference_script
    if not script.is_file():
        return GroupResult(error=f"skipped: {script} not found (the reference scripts live in a source checkout)")
    outputs = inp.work_dir / f"reference-{group.name}.npz"
    outputs.unlink(missing_ok=True)
    cmd = [python, str(script), "--model-dir", str(hf_dir), "--clip", str(inp.clip_path), "--outputs", str(outputs),
           "--threads", str(inp.threads), "--repeats", str(inp.repeats), *group.reference_args(inp)]
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


def _targets(targets: list[dict] | None) -> str:
    if not targets:
        return ""
    words = {True: "yes", False: "NO", None: "?"}
    out = []
    for t in targets:
        what = f"< {t['value']:g} ms" if t["what"] == "ms_per_frame_below" else f">= {t['value']:g}x"
        out.append(f"{what}: {words[t['met']]}")
    return ", ".join(out)


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
    for s in rep["stages"]:
        if s.get("error"):
            print(f"  {s['label']}: vocable failed: {s['error']}")
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
    if ref["status"] == "ok":
        loads = ", ".join(f"{v} s ({k})" for k, v in (ref.get("load_s") or {}).items())
        print(f"  reference: {ref_note}, fp32, load {loads or '-'}")
    else:
        print(f"  reference {ref['status']}: {ref['reason']}")
    for text in rep["agreement_text"]:
        print(f"  agreement: {text}")
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
    from . import __version__
    from .bench_model import default_cache_dir, ensure_bench_model, user_model
    from .convert import ConversionError
    from .engine import Engine

    threads = int(args.threads or 2)
    repeats = int(args.repeats)
    seconds = float(args.ref_seconds)
    if threads < 1 or repeats < 1:
        raise VocableError("--threads and --repeats must be at least 1")
    if not 1.0 <= seconds <= 60.0:
        raise VocableError("--ref-seconds must be between 1 and 60 (the engine's reference length)")
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
        for g in STAGE_GROUPS:
            if isinstance(g, GenerationStages) and g.speaker_path is not None:
                g.speaker_path.unlink(missing_ok=True)


def parse_types(value) -> list[str]:
    """--types: a comma-separated string or a list of weight types (default: all four)."""
    from .convert import WEIGHT_TYPES

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
    ours: dict[str, GroupResult] = {}
    load_before = _loadavg()
    _say(f"engine: {model.gguf.name}, {inp.threads} thread(s)")
    with engine_perf_lines():
        t0 = time.perf_counter()
        engine = Engine(model.gguf, threads=inp.threads)
        load_s = time.perf_counter() - t0
    with engine:
        for g in STAGE_GROUPS:
            _say(f"engine: {g.name} stages, 1 warm-up + {inp.repeats} run(s)")
            try:
                ours[g.name] = g.run_vocable(engine, inp)
            except VocableError as e:
                ours[g.name] = GroupResult(error=str(e))

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
            for g in STAGE_GROUPS:
                _say(f"reference: {g.name} stages ({python})")
                r = theirs[g.name] = run_reference(g, python, model.hf_dir, inp)
                if r.error:
                    ref = {"status": r.error.split(":", 1)[0], "reason": r.error.split(":", 1)[1].strip(),
                           "python": python}
                    break
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
            agreement_text.append(g.describe_agreement(agreement[g.name]))
    report = {
        "bench": "vocable", "vocable_version": version, "model": model.describe(),
        "threads": inp.threads, "ref_seconds": round(len(inp.clip) / SAMPLE_RATE, 3), "clip_source": clip_source,
        "repeats": inp.repeats, "cpu": cpu_name(), "cpus": os.cpu_count(), "vocable_load_s": round(load_s, 3),
        "frames": inp.frames, "generation_text": GEN_TEXT, "generation_language": GEN_LANGUAGE,
        "vocable_extra": {g: r.extra for g, r in ours.items()}, "reference": ref,
        "reference_extra": {g: r.extra for g, r in theirs.items()}, "stages": stages,
        "agreement": agreement, "agreement_text": agreement_text,
        "loadavg_1min": [load_before, _loadavg()],   # other work on the machine skews the figures
    }
    _print_report(report)
    print(json.dumps(report), flush=True)
    failed = any(r.error for r in ours.values()) or ref["status"] == "failed"
    return 1 if failed else 0


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 2)
