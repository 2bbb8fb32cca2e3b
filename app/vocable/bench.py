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

Stage groups (`STAGE_GROUPS`) each own a reference script and an agreement check; the voice
stages (speaker embedding, reference codes) are the first. Output: progress on stderr; the
table, then one JSON line with every figure, on stdout.
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


STAGE_GROUPS: list[StageGroup] = [VoiceStages()]


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
    rows = [("stage", "vocable ms", "reference ms", "speedup")]
    for s in rep["stages"]:
        speed = f"{s['speedup']:.2f}x" if s["speedup"] else "-"
        rows.append((s["label"], _ms(s["vocable_ms"]), _ms(s["reference_ms"]), speed))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    print()
    for i, r in enumerate(rows):
        print(f"  {r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]:>{widths[3]}}")
        if i == 0:
            print("  " + "-" * (sum(widths) + 6))
    print()
    for s in rep["stages"]:
        if s.get("error"):
            print(f"  {s['label']}: vocable failed: {s['error']}")
    if ref["status"] == "ok":
        print(f"  reference: {ref_note}, fp32, load {ref.get('load_s', '-')} s")
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
    cache = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    given = getattr(args, "model", None)
    try:
        model = (user_model(Path(given), cache, progress=_say) if given
                 else ensure_bench_model(cache_dir=cache, progress=_say))
    except (ConversionError, OSError, ValueError) as e:
        raise VocableError(f"cannot prepare the benchmark model: {e}") from e

    work = cache / "work"
    work.mkdir(parents=True, exist_ok=True)
    clip, clip_source = make_reference_clip(seconds)
    clip_path = work / f"clip-{os.getpid()}.npy"
    np.save(clip_path, clip)
    inp = BenchInput(clip, clip_path, work, threads, repeats)
    try:
        return _run(args, model, inp, clip_source, __version__, Engine)
    finally:
        clip_path.unlink(missing_ok=True)


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
                ref.update({k: r.extra[k] for k in ("package", "load_s", "torch_threads") if k in r.extra})
                ref["torch"] = r.extra.get("versions", {}).get("torch")
    if ref["status"] != "ok":
        print(f"reference {ref['status']}: {ref['reason']}", file=sys.stderr)

    stages, agreement, agreement_text = [], {}, []
    for g in STAGE_GROUPS:
        o, t = ours[g.name], theirs.get(g.name)
        if g.total:   # per-run sums of the group's stages, on both sides
            for side in (o, t):
                if side and not side.error and all(side.runs_ms.get(k) for k, _ in g.stages):
                    side.runs_ms[g.total[0]] = [sum(run) for run in zip(*(side.runs_ms[k] for k, _ in g.stages))]
        for key, label in g.stages + ([g.total] if g.total else []):
            v = median(o.runs_ms.get(key, []))
            r = median(t.runs_ms.get(key, [])) if t and not t.error else None
            stages.append({"key": key, "label": label, "vocable_ms": _round(v), "reference_ms": _round(r),
                           "speedup": round(r / v, 3) if v and r else None,
                           "vocable_min_ms": _round(min(o.runs_ms.get(key) or [None])),  # least disturbed
                           "reference_min_ms": _round(min((t.runs_ms.get(key) if t else None) or [None])),
                           "vocable_runs_ms": [round(x, 2) for x in o.runs_ms.get(key, [])],
                           "reference_runs_ms": [round(x, 2) for x in t.runs_ms.get(key, [])] if t else [],
                           "error": o.error})
        if o.outputs and t and t.outputs:
            agreement[g.name] = g.agreement(o.outputs, t.outputs)
            agreement_text.append(g.describe_agreement(agreement[g.name]))
    report = {
        "bench": "vocable", "vocable_version": version, "model": model.describe(),
        "threads": inp.threads, "ref_seconds": round(len(inp.clip) / SAMPLE_RATE, 3), "clip_source": clip_source,
        "repeats": inp.repeats, "cpu": cpu_name(), "cpus": os.cpu_count(), "vocable_load_s": round(load_s, 3),
        "vocable_extra": {g: r.extra for g, r in ours.items()}, "reference": ref, "stages": stages,
        "agreement": agreement, "agreement_text": agreement_text,
        "loadavg_1min": [load_before, _loadavg()],   # other work on the machine skews the figures
    }
    _print_report(report)
    print(json.dumps(report), flush=True)
    failed = any(r.error for r in ours.values()) or ref["status"] == "failed"
    return 1 if failed else 0


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 2)
