#!/usr/bin/env python3
"""Vocable beside its peers: the same model, clip, text and thread count, one process each.

Every engine synthesizes the same text for the same number of frames (--frames, default 100,
8 s of audio) in x-vector mode with a voice made once from the same reference clip, greedy,
consuming its audio stream chunk by chunk as a player would. By default the model is the
bench's random-weight one with the real Qwen3-TTS-12Hz-0.6B-Base shapes (vocable.bench.model,
built and cached once); each peer converts that same Hugging Face folder with its own converter,
once per weight type (cached under <cache>/peers/). Each engine and weight type runs in a child
process of its own: it loads the model, makes the voice, runs 1 warm-up and --repeats timed
syntheses; the table shows medians, and the child's peak RSS (its VmHWM at exit: model load
included).

The engines and how each is driven (the "weights" column names what each loads per type):
  - Vocable: `Engine(gguf, threads=N, share_cores=False)` (the thread count held fixed, as
    the peers'), `embed_voice(clip)`, `synthesize(text, voice, greedy=True, max_frames=F)`,
    with `forget_prompts()` before each (untimed: else it restores the prefill of the same
    prompt from its cache, which the peers do not have).
  - qwentts.cpp, through its CPU wheel realtimetts-qwen-native-cpu (import qwentts_cpp_cpu):
    `QwenTTS(talker, codec, cpu_threads=N)` (serial: no codec overlap threads),
    `extract_voice_ref(clip)`, `stream(text, ref_spk_emb=..., do_sample=False,
    max_new_tokens=F)`. Its GGUFs come from its own convert.py (F32; not on PyPI: clone
    qwentts.cpp and pass --qwentts-convert or $VOCABLE_QWENTTS_CONVERT), run on the reference
    venv's Python (it needs torch); Q8_0 and Q4_K_M are made from the F32 files as its
    tools/quantize.cpp makes them (its policy, ported here, with ggml_quantize_chunk of the
    wheel's own ggml): the talker and the codec both, codebooks and their projections kept F32,
    rows that do not fit a block in F16, embeddings Q6_K in Q4_K_M.
  - vox (vox-tts): `python -m vox.build --dtype D --quant Q --no-hash`, then
    `Engine(tmod, device="cpu", threads=N)`, `clone_voice(clip, xvector_only=True)`,
    `stream(text, voice, max_frames=F, top_k=1, sub_top_k=1)` (top-k 1 is greedy).
  - PyTorch: the official package (qwen-tts, fp32), through the script `vocable bench` runs
    (tools/bench/reference_synthesis_timing.py, `max_new_tokens` = F + 1); it does not stream,
    so its first audio is the end of the whole call. fp32 only: at q8_0 and q4_k it is listed
    as not run.
The length: every engine is given the frame cap F and the random model cannot stop early (its
codec EOS logits are zeroed), so each makes F frames; frames are counted from the audio each
returned (1920 samples a frame) and ms/frame divides by the frames made, whatever they are.

Set-up: `bash tools/bench/setup-peers.sh` installs the peers into .venv-peers (or name another
Python with --peers-python / $VOCABLE_PEERS_PYTHON); the PyTorch side and qwentts.cpp's
converter use $VOCABLE_REFERENCE_PYTHON (`bash tools/setup-reference-venv.sh`). A peer that is
not installed or cannot run is listed with the reason, never left out; Vocable always runs.

Usage: .venv/bin/python tools/bench/peers.py [--types q8_0,q4_k] [--frames 100] [--threads 2]
           [--repeats 3] [--peers qwentts.cpp,vox,pytorch] [--qwentts-convert PATH]
           [--model HF_DIR] [--cache-dir DIR]
Output: progress on stderr; the table, then one JSON line with every figure, on stdout. Exit
status 1 when an engine that is installed failed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Only the standard library here: the children run this file in the peers' venv, without vocable.
REPO = Path(__file__).resolve().parents[2]
TYPES = ("f32", "q8_0", "q4_k")   # the weight types, in table order (all by default)
PEERS = ("qwentts.cpp", "vox", "pytorch")
LABELS = {"vocable": "Vocable", "qwentts.cpp": "qwentts.cpp", "vox": "vox", "pytorch": "PyTorch (qwen-tts)"}
DEFAULT_FRAMES = 100
DEFAULT_THREADS = 2
DEFAULT_REPEATS = 3
DEFAULT_REF_SECONDS = 10.0
SAMPLE_RATE = 24000
SAMPLES_PER_FRAME = 1920
CHILD_TIMEOUT_S = 3600
PEERS_PYTHON_ENV = "VOCABLE_PEERS_PYTHON"
QWENTTS_CONVERT_ENV = "VOCABLE_QWENTTS_CONVERT"
DEFAULT_PEERS_VENV = REPO / ".venv-peers"
SETUP_HINT = "bash tools/bench/setup-peers.sh"
QWENTTS_CLONE_HINT = ("qwentts.cpp's converter, convert.py, is not on PyPI: clone qwentts.cpp (git clone "
                      "https://github.com/ServeurpersoCom/qwentts.cpp; the wheel bundles the fork "
                      "KoljaB/qwentts.cpp) and pass --qwentts-convert CLONE/convert.py "
                      f"or set {QWENTTS_CONVERT_ENV}")
# What each engine loads at each weight type of the table.
RECIPES = {
    ("vocable", "f32"): "f32", ("vocable", "q8_0"): "q8_0", ("vocable", "q4_k"): "q4_k",
    ("qwentts.cpp", "f32"): "F32", ("qwentts.cpp", "q8_0"): "Q8_0", ("qwentts.cpp", "q4_k"): "Q4_K_M",
    ("vox", "f32"): "f32", ("vox", "q8_0"): "bf16 + q8", ("vox", "q4_k"): "bf16 + q4",
    ("pytorch", "f32"): "fp32",
}
VOX_BUILD = {"f32": ["--dtype", "f32"], "q8_0": ["--dtype", "bf16", "--quant", "q8"],
             "q4_k": ["--dtype", "bf16", "--quant", "q4"]}
QWENTTS_VARIANT = {"f32": "F32", "q8_0": "Q8_0", "q4_k": "Q4_K_M"}
BUSY_LOAD = 1.5      # a 1-min load average above this before the bench: other work ran
REQUANT_VERSION = 1   # bump when the port of tools/quantize.cpp changes (invalidates cached files)


def say(message: str) -> None:
    print(f"[peers] {message}", file=sys.stderr, flush=True)


# ---- the measured rows ----------------------------------------------------------------------

@dataclass
class Row:
    """One engine at one weight type: measured (status "ok") or why not."""
    engine: str
    weight_type: str
    weights: str = ""
    status: str = "ok"            # ok | not installed | not run | failed
    reason: str = ""
    wall_ms: list[float] = field(default_factory=list)          # per timed run
    first_audio_ms: list[float] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)
    peak_rss_mib: float | None = None
    load_s: float | None = None
    voice_s: float | None = None
    info: dict = field(default_factory=dict)

    @property
    def frames(self) -> float | None:
        return statistics.median(self.samples) / SAMPLES_PER_FRAME if self.samples else None

    @property
    def ms_per_frame(self) -> float | None:
        f = self.frames
        return statistics.median(self.wall_ms) / f if self.wall_ms and f else None

    @property
    def rtf(self) -> float | None:
        f = self.frames
        if not self.wall_ms or not f:
            return None
        return statistics.median(self.wall_ms) / 1e3 / (f * SAMPLES_PER_FRAME / SAMPLE_RATE)

    @property
    def first_audio(self) -> float | None:
        return statistics.median(self.first_audio_ms) if self.first_audio_ms else None

    def figures(self) -> dict:
        """The medians of the table (the row's own fields keep every run)."""
        return {"frames": self.frames, "ms_per_frame": self.ms_per_frame, "rtf": self.rtf,
                "median_wall_ms": statistics.median(self.wall_ms) if self.wall_ms else None,
                "median_first_audio_ms": self.first_audio, "peak_rss_mib": self.peak_rss_mib}


def not_measured(engine: str, weight_type: str, status: str, reason: str) -> Row:
    return Row(engine, weight_type, RECIPES.get((engine, weight_type), "-"), status=status, reason=reason)


def ratios(rows: list[Row]) -> dict[tuple[str, str], dict]:
    """Each measured peer row against Vocable's at the same weight type: its real-time factor,
    time to first audio and peak RSS over Vocable's (above 1: Vocable is faster / leaner)."""
    base = {r.weight_type: r for r in rows if r.engine == "vocable" and r.status == "ok"}
    out = {}
    for r in rows:
        v = base.get(r.weight_type)
        if r.status != "ok" or v is None:
            continue
        pairs = {"rtf": (r.rtf, v.rtf), "first_audio": (r.first_audio, v.first_audio),
                 "peak_rss": (r.peak_rss_mib, v.peak_rss_mib)}
        out[(r.engine, r.weight_type)] = {k: (a / b if a and b else None) for k, (a, b) in pairs.items()}
    return out


def missed_targets(rows: list[Row]) -> list[str]:
    """The target: Vocable ahead of every peer (real-time factor) at the same weight type and
    thread count. One line per peer row that is as fast or faster, and per weight type where
    Vocable itself has no figure."""
    out = []
    rat = ratios(rows)
    for r in rows:
        if r.engine == "vocable" and r.status != "ok":
            out.append(f"{r.weight_type}: Vocable has no figure ({r.status}: {r.reason})")
        x = rat.get((r.engine, r.weight_type))
        if r.engine != "vocable" and x and x["rtf"] is not None and x["rtf"] <= 1.0:
            out.append(f"{r.weight_type}: {LABELS[r.engine]} ({r.weights}) real-time factor {r.rtf:.3f} is "
                       f"{1 / x['rtf']:.2f}x Vocable's speed")
    return out


# ---- the table ------------------------------------------------------------------------------

def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def table_lines(rows: list[Row]) -> list[str]:
    """The table: a section per weight type, a line per engine; rows that did not run show
    their status and reason in place of the figures."""
    rat = ratios(rows)
    head = ("engine", "weights", "frames", "ms/frame", "RTF", "first audio ms", "peak RSS MiB",
            "RTF vs Vocable", "first audio vs", "RSS vs")
    body: list = []
    for wt in [t for t in TYPES if any(r.weight_type == t for r in rows)]:
        body.append(f"{wt}:")
        for r in (r for r in rows if r.weight_type == wt):
            if r.status != "ok":
                body.append((LABELS[r.engine], r.weights, f"{r.status}: {r.reason}"))
                continue
            x = rat.get((r.engine, wt), {})
            body.append((LABELS[r.engine], r.weights, _num(r.frames, "g"), _num(r.ms_per_frame, ".1f"),
                         _num(r.rtf, ".3f"), _num(r.first_audio, ".0f"), _num(r.peak_rss_mib, ".0f"),
                         _ratio(x.get("rtf")), _ratio(x.get("first_audio")), _ratio(x.get("peak_rss"))))
    cells = [head] + [b for b in body if isinstance(b, tuple) and len(b) == len(head)]
    w = [max(len(c[i]) for c in cells) for i in range(len(head))]
    for i in (0, 1):   # the engine and weights of rows that did not run line up too
        w[i] = max([w[i]] + [len(b[i]) for b in body if isinstance(b, tuple)])

    def fmt(c: tuple) -> str:
        if len(c) != len(head):   # a row that did not run: its reason across the figure columns
            return f"  {c[0]:<{w[0]}}  {c[1]:<{w[1]}}  {c[2]}"
        return "  " + "  ".join([f"{c[0]:<{w[0]}}", f"{c[1]:<{w[1]}}"] +
                                [f"{v:>{w[i + 2]}}" for i, v in enumerate(c[2:])])
    lines = [fmt(head).rstrip(), "  " + "-" * (sum(w) + 2 * (len(w) - 1))]
    for b in body:
        lines.append(b if isinstance(b, str) else fmt(b).rstrip())
    return lines


def print_report(rep: dict, rows: list[Row]) -> None:
    print(f"Vocable beside its peers: {rep['model']}")
    audio_s = rep["frames"] * SAMPLES_PER_FRAME / SAMPLE_RATE
    print(f"  {rep['threads']} thread(s), {rep['frames']} frames ({audio_s:g} s "
          f"of audio) per synthesis, x-vector voice from a {rep['ref_seconds']:g} s clip ({rep['clip_source']}), "
          f"greedy, streamed; median of {rep['repeats']} run(s) after 1 warm-up, one process per engine and type")
    start, timed, end = rep["loadavg"]
    print(f"  {rep['cpu']} ({rep['cpus']} CPUs); 1-min load average {start} at the start, {timed} when timing "
          f"began, {end} at the end")
    if start is not None and start > BUSY_LOAD:
        print(f"  note: the machine was busy before the bench began (load {start}): figures may be skewed")
    if rep.get("vocable_backend"):   # the CPU variant and kernels, not the list of variants
        print(f"  Vocable CPU backend: {rep['vocable_backend'].split('; variants:')[0]}")
    print()
    for line in table_lines(rows):
        print(line)
    print()
    print("  ms/frame and RTF: the whole streamed synthesis (text to the last audio) per frame made and per second of "
          "audio; first audio: from the call to the first audio chunk (PyTorch does not stream: the end of the call); "
          "peak RSS: the child process's, model load included; X vs Vocable: the engine's figure over Vocable's "
          "at the same weight type (above 1: Vocable is faster or leaner)")
    for engine, note in rep.get("notes", {}).items():
        print(f"  {LABELS.get(engine, engine)}: {note}")
    missed = rep["missed_targets"]
    compared = any(r.engine != "vocable" for r in rows if r.status == "ok")
    verdict = "MISSED" if missed else "met by every peer that ran" if compared else "no peer ran, nothing to compare"
    print(f"  target: Vocable ahead of every peer (RTF) at the same weight type and threads: {verdict}")
    for line in missed:
        print(f"    {line}")


# ---- child processes ------------------------------------------------------------------------

@dataclass
class ChildResult:
    returncode: int
    stdout: str
    stderr: str
    peak_rss_mib: float | None
    timed_out: bool = False

    def last_json(self) -> dict:
        lines = [ln for ln in self.stdout.splitlines() if ln.strip().startswith("{")]
        if not lines:
            raise ValueError("no JSON line on stdout")
        return json.loads(lines[-1])

    def why(self) -> str:
        """The reason of a failure: its last lines on stderr."""
        if self.timed_out:
            return f"ran past {CHILD_TIMEOUT_S} s"
        lines = [ln.strip() for ln in self.stderr.splitlines() if ln.strip()]
        tail = " | ".join(lines[-3:]) if lines else "(nothing on stderr)"
        return f"exit status {self.returncode}: {tail}"


# Runs a Python script (or -m module) and, as the interpreter exits, writes its VmHWM to stderr.
# The peak RSS comes from there: the ru_maxrss of a child (wait4, RUSAGE_CHILDREN) starts at
# the parent's own peak, which exec records as the child's (subprocess starts it with vfork).
HWM_MARK = "[peers] VmHWM kB: "
_HWM_WRAPPER = (
    "import atexit, runpy, sys\n"
    "def _hwm():\n"
    "    try:\n"
    "        with open('/proc/self/status') as f:\n"
    "            kb = [ln.split()[1] for ln in f if ln.startswith('VmHWM:')]\n"
    f"        sys.stderr.write('\\n{HWM_MARK}' + kb[0] + '\\n')\n"
    "        sys.stderr.flush()\n"
    "    except (OSError, IndexError):\n"
    "        pass\n"
    "atexit.register(_hwm)\n"
    "sys.argv = sys.argv[1:]\n"
    "if sys.argv[0] == '-m':\n"
    "    del sys.argv[0]\n"
    "    runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n"
    "else:\n"
    "    runpy.run_path(sys.argv[0], run_name='__main__')\n")


def python_child(python: str, *args: str) -> list[str]:
    """The command that runs `python args...` (a script and its arguments, or -m module ...)
    and reports its peak RSS to run_child."""
    return [python, "-c", _HWM_WRAPPER, *args]


def run_child(cmd: list[str], env: dict | None = None, cwd: Path | None = None,
              timeout: float = CHILD_TIMEOUT_S) -> ChildResult:
    """Runs `cmd` and returns its output and its peak RSS: the VmHWM a python_child command
    reports as it exits, else ru_maxrss from wait4 (an upper bound: exec carries the parent's
    peak into it)."""
    import tempfile

    killed = threading.Event()
    with tempfile.TemporaryFile("w+", encoding="utf-8") as out, tempfile.TemporaryFile("w+", encoding="utf-8") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=cwd)

        def kill() -> None:
            killed.set()
            proc.kill()
        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stderr, peak = err.read(), usage.ru_maxrss / 1024.0
        reported = [ln for ln in stderr.splitlines() if ln.startswith(HWM_MARK)]
        if reported:
            peak = int(reported[-1][len(HWM_MARK):]) / 1024.0
            stderr = "\n".join(ln for ln in stderr.splitlines() if not ln.startswith(HWM_MARK))
        return ChildResult(proc.returncode, out.read(), stderr, peak, killed.is_set())


def child_command(python: str, engine: str, model: str, clip: Path, threads: int, frames: int, repeats: int,
                  text: str, language: str) -> list[str]:
    return python_child(python, str(Path(__file__).resolve()), "--child", engine, "--model", model, "--clip",
                        str(clip), "--threads", str(threads), "--frames", str(frames), "--repeats", str(repeats),
                        "--text", text, "--language", language)


def row_from_child(engine: str, weight_type: str, res: ChildResult) -> Row:
    row = Row(engine, weight_type, RECIPES[(engine, weight_type)], peak_rss_mib=res.peak_rss_mib)
    if res.returncode != 0:
        row.status, row.reason = "failed", res.why()
        return row
    try:
        out = res.last_json()
        row.wall_ms = [float(r["wall_ms"]) for r in out["runs"]]
        row.first_audio_ms = [float(r["first_audio_ms"]) for r in out["runs"]]
        row.samples = [int(r["samples"]) for r in out["runs"]]
    except (ValueError, KeyError, TypeError) as e:
        row.status, row.reason = "failed", f"unreadable result ({e})"
        return row
    if not all(row.samples):
        row.status, row.reason = "failed", "no audio"
    row.load_s, row.voice_s, row.info = out.get("load_s"), out.get("voice_s"), out.get("info", {})
    return row


# -- in the child: one engine ------------------------------------------------------------------

@dataclass
class Opened:
    """An engine loaded in the child, with its voice made."""
    start: object                  # () -> iterator of audio chunks: begins one synthesis
    voice_s: float
    info: dict
    before: object = None          # () -> None, untimed, before each synthesis
    after: object = None           # () -> dict of more info, once all have run


def _timed(start, before=None) -> dict:
    """One synthesis: `start()` begins it and returns its stream of audio chunks (arrays)."""
    if before:
        before()
    t0 = time.perf_counter()
    first, samples = None, 0
    for chunk in start():
        if first is None:
            first = 1e3 * (time.perf_counter() - t0)
        samples += len(chunk)
    return {"wall_ms": 1e3 * (time.perf_counter() - t0), "first_audio_ms": first, "samples": samples}


def _open_vocable(a, clip):
    from vocable import _engine
    from vocable.engine import Engine

    eng = Engine(a.model, threads=a.threads, share_cores=False)
    t0 = time.perf_counter()
    voice = eng.embed_voice(clip, SAMPLE_RATE)
    voice_s = time.perf_counter() - t0

    def start():
        return iter(eng.synthesize(a.text, voice, a.language, greedy=True, max_frames=a.frames))
    # The engine keeps recent prefills and restores one for the same voice and text: every run
    # here would be "the same prompt again". Dropped before each, so each computes its prefill
    # as the peers do (engines built before forget_prompts had no such cache).
    forget = getattr(eng, "forget_prompts", None)
    return Opened(start, voice_s, {"backend": _engine.system_info(), "forget_prompts": forget is not None}, forget)


def _open_qwentts(a, clip):
    import qwentts_cpp_cpu as q

    folder = Path(a.model)
    tts = q.QwenTTS(folder / "talker.gguf", folder / "codec.gguf", cpu_threads=a.threads)
    t0 = time.perf_counter()
    ref = tts.extract_voice_ref(clip)
    voice_s = time.perf_counter() - t0

    def start():
        return (chunk for chunk, _rate in tts.stream(text=a.text, lang=a.language.lower(), ref_spk_emb=ref.ref_spk_emb,
                                                    do_sample=False, max_new_tokens=a.frames, seed=0))
    return Opened(start, voice_s, {"version": q.__version__, "native": tts.library.version()})


def _open_vox(a, clip):
    import vox

    eng = vox.Engine(a.model, device="cpu", threads=a.threads)
    t0 = time.perf_counter()
    voice = eng.clone_voice((clip, SAMPLE_RATE), xvector_only=True)
    voice_s = time.perf_counter() - t0

    def start():
        return eng.stream(a.text, voice, max_frames=a.frames, top_k=1, sub_top_k=1, seed=0, language=a.language.lower())
    def after():   # what the voice keeps for this model after the runs (vox caches a voice's KV rows)
        return {"voice_kv_fingerprints": voice.info.get("kv_fingerprints"), "stats": eng.stats().get("backend")}
    plan = eng.plan
    return Opened(start, voice_s, {"version": vox.__version__, "threads": plan.get("threads"),
                                   "mode": plan.get("mode")}, after=after)


CHILD_ENGINES = {"vocable": _open_vocable, "qwentts.cpp": _open_qwentts, "vox": _open_vox}


def child_main(a) -> None:
    """In the engine's own process: load, make the voice, 1 warm-up + repeats; one JSON line."""
    import numpy as np

    clip = np.ascontiguousarray(np.load(a.clip), dtype=np.float32)
    t0 = time.perf_counter()
    e = CHILD_ENGINES[a.child](a, clip)
    load_s = time.perf_counter() - t0 - e.voice_s
    warmup = _timed(e.start, e.before)
    runs = [_timed(e.start, e.before) for _ in range(a.repeats)]
    info = {**e.info, **(e.after() if e.after else {})}
    print(json.dumps({"engine": a.child, "load_s": round(load_s, 3), "voice_s": round(e.voice_s, 3),
                      "warmup": warmup, "runs": runs, "info": info}), flush=True)


# -- in the child: qwentts.cpp's quantizer, ported ---------------------------------------------

# tools/quantize.cpp of qwentts.cpp (at ServeurpersoCom/qwentts.cpp a8a7716): which tensors are
# quantized, to what, and the F16 fallback for rows that do not fit a block.
GGML_TYPE_IDS = {"F32": 0, "F16": 1, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
# variant: (base, bump for "important" tensors or None, embeddings, bump mode)
QWENTTS_QUANT = {"Q8_0": ("Q8_0", None, "Q8_0", 0), "Q4_K_M": ("Q4_K", "Q6_K", "Q6_K", 2)}
_KEEP = (".snake.alpha", ".snake.beta", ".act1.alpha", ".act1.beta", ".act2.alpha", ".act2.beta",
         ".snake1.alpha", ".snake2.alpha", "tok_enc.vq_", "tok_dec.vq_", "spk_enc.fc.weight",
         "silence_latent", "scale_shift_table", "null_condition_emb")
_EMBED = ("token_embd", "embed_tokens.weight", "audio_embeddings.weight", ".codec_embd", ".text_embd")


def qwentts_quant_type(name: str, n_dims: int, n_layers: int, variant: str) -> str | None:
    """quantize.cpp's pick_type: the target type of a tensor, or None to keep it as it is."""
    if n_dims < 2 or any(k in name for k in _KEEP):
        return None
    base, bump, embed, mode = QWENTTS_QUANT[variant]
    if any(e in name for e in _EMBED):
        return embed
    if bump and ("v_proj.weight" in name or "down_proj.weight" in name):
        at = name.find("layers.")
        layer = int("".join(c for c in name[at + 7:].split(".")[0] if c.isdigit()) or -1) if at >= 0 else -1
        if mode == 2 and layer >= 0 and (layer < n_layers // 9 or layer >= n_layers - n_layers // 7 or layer % 3 == 0):
            return bump
    return base


def requantize_qwentts(src: str, dst: str, variant: str) -> None:
    """Writes `dst`, the F32 GGUF `src` re-quantized as tools/quantize.cpp does for `variant`,
    with ggml_quantize_chunk of the qwentts wheel's own ggml (in the peers' venv)."""
    import ctypes

    import gguf
    import numpy as np
    import qwentts_cpp_cpu

    libs = sorted((Path(qwentts_cpp_cpu.__file__).parent / "lib").glob("libggml-base*"))
    if not libs:
        raise SystemExit(f"no libggml-base in {Path(qwentts_cpp_cpu.__file__).parent / 'lib'}")
    ggml = ctypes.CDLL(str(libs[0]))
    ggml.ggml_quantize_chunk.restype = ctypes.c_size_t
    ggml.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                         ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    ggml.ggml_row_size.restype = ctypes.c_size_t
    ggml.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    ggml.ggml_blck_size.restype = ctypes.c_int64
    ggml.ggml_blck_size.argtypes = [ctypes.c_int]

    reader = gguf.GGUFReader(src)
    arch = str(reader.fields["general.architecture"].contents())
    n_layers = 0
    for key in (f"{arch}.block_count", f"{arch}.talker.block_count", f"{arch}.decoder.num_hidden_layers"):
        if key in reader.fields:
            n_layers = int(reader.fields[key].contents())
            break
    writer = gguf.GGUFWriter(dst, arch)
    for f in reader.fields.values():   # as gguf-py's gguf_new_metadata copies them
        if f.name == gguf.Keys.General.ARCHITECTURE or f.name.startswith("GGUF."):
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(f.name, f.contents(), f.types[0], sub_type=sub)
    writer.add_key_value("general.quantization_version", 2, gguf.GGUFValueType.UINT32)
    writer.add_key_value("general.file_type", variant, gguf.GGUFValueType.STRING)

    plans = []
    for t in reader.tensors:
        ne = [int(d) for d in t.shape]
        n_dims = max([i + 1 for i, d in enumerate(ne) if d > 1] or [1])
        target = qwentts_quant_type(t.name, n_dims, n_layers, variant)
        if target is not None and t.tensor_type not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16,
                                                        gguf.GGMLQuantizationType.BF16):
            target = None
        if target is not None and ne[0] % ggml.ggml_blck_size(GGML_TYPE_IDS[target]):
            target = "F16"
        data = t.data
        if target is None:
            writer.add_tensor_info(t.name, data.shape, data.dtype, data.nbytes, t.tensor_type)
        elif target == "F16":
            writer.add_tensor_info(t.name, data.shape, np.dtype(np.float16), data.size * 2)
        else:
            rows = data.size // ne[0]
            row_bytes = ggml.ggml_row_size(GGML_TYPE_IDS[target], ne[0])
            writer.add_tensor_info(t.name, (*data.shape[:-1], row_bytes), np.dtype(np.uint8), rows * row_bytes,
                                   gguf.GGMLQuantizationType[target])
        plans.append(target)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t, target in zip(reader.tensors, plans):
        data = t.data
        if target is None:
            writer.write_tensor_data(data)
            continue
        src32 = np.ascontiguousarray(data, dtype=np.float32).reshape(-1, int(t.shape[0]))
        if target == "F16":
            writer.write_tensor_data(src32.astype(np.float16))
            continue
        qtype = GGML_TYPE_IDS[target]
        row_bytes = ggml.ggml_row_size(qtype, src32.shape[1])
        out = np.empty((src32.shape[0], row_bytes), dtype=np.uint8)
        step = max(1, (1 << 22) // src32.shape[1])
        for r in range(0, src32.shape[0], step):
            n = min(step, src32.shape[0] - r)
            done = ggml.ggml_quantize_chunk(qtype, src32[r:r + n].ctypes.data, out[r:r + n].ctypes.data, 0, n,
                                            src32.shape[1], None)
            if done != n * row_bytes:
                raise SystemExit(f"{t.name}: ggml_quantize_chunk wrote {done} bytes, expected {n * row_bytes}")
        writer.write_tensor_data(out)
    writer.close()


# ---- preparing each engine's model ----------------------------------------------------------

def folder_key(hf_dir: Path) -> str:
    """Changes when the Hugging Face folder does (its files' names, sizes and times)."""
    files = sorted(p for p in Path(hf_dir).rglob("*") if p.is_file())
    blob = json.dumps([[str(p.relative_to(hf_dir)), p.stat().st_size, p.stat().st_mtime_ns] for p in files])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _stamp_ok(stamp: Path, want: dict, outputs: list[Path]) -> bool:
    try:
        have = json.loads(stamp.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return all(p.is_file() for p in outputs) and {k: have.get(k) for k in want} == want


def _write_stamp(stamp: Path, want: dict, **more) -> None:
    stamp.write_text(json.dumps({**want, **more}, indent=2) + "\n", encoding="utf-8")


class PrepareError(Exception):
    """An engine's model could not be made: the row's reason."""


@dataclass
class Setup:
    """What the run needs to know about where things are."""
    hf_dir: Path
    cache: Path
    work: Path
    threads: int
    frames: int
    repeats: int
    text: str
    language: str
    peers_python: str | None = None
    peers_versions: dict = field(default_factory=dict)
    qwentts_convert: Path | None = None
    reference_python: str | None = None


def prepare_qwentts(s: Setup, weight_type: str) -> Path:
    """A folder with talker.gguf and codec.gguf for `weight_type` (made once, cached)."""
    root = s.cache / "peers" / s.hf_dir.name
    variant = QWENTTS_VARIANT[weight_type]
    out = root / f"qwentts-{variant}"
    files = [out / "talker.gguf", out / "codec.gguf"]
    convert_sha = hashlib.sha256(s.qwentts_convert.read_bytes()).hexdigest()[:16]
    want = {"source": folder_key(s.hf_dir), "convert_py": convert_sha,
            "wheel": s.peers_versions.get("qwentts_cpp_cpu"), "requant": REQUANT_VERSION if variant != "F32" else None}
    stamp = out / "stamp.json"
    if _stamp_ok(stamp, want, files):
        return out
    out.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    t0 = time.perf_counter()
    if variant == "F32":
        # convert.py converts checkpoints/<name> into models/, by the folders' upstream names
        work = s.work / f"qwentts-convert-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        (work / "checkpoints").mkdir(parents=True)
        (work / "checkpoints" / "Qwen3-TTS-12Hz-0.6B-Base").symlink_to(s.hf_dir.resolve())
        (work / "checkpoints" / "Qwen3-TTS-Tokenizer-12Hz").symlink_to((s.hf_dir / "speech_tokenizer").resolve())
        libs = Path(s.peers_python).parent.parent / "convert-libs"
        path = [str(libs)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
        say(f"qwentts.cpp: converting {s.hf_dir.name} with {s.qwentts_convert} (F32)")
        try:
            res = run_child([s.reference_python, str(s.qwentts_convert)], env=env, cwd=work)
            made = [work / "models" / f"qwen-{n}-F32.gguf" for n in ("talker-0.6b-base", "tokenizer-12hz")]
            if res.returncode != 0 or not all(p.is_file() for p in made):
                raise PrepareError(f"convert.py failed: {res.why()}")
            for src, dst in zip(made, files):
                os.replace(src, dst)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    else:
        f32 = prepare_qwentts(s, "f32")
        for name in ("talker.gguf", "codec.gguf"):
            say(f"qwentts.cpp: {name} to {variant} (tools/quantize.cpp's policy, the wheel's ggml)")
            part = out / f"{name}.partial"
            res = run_child([s.peers_python, str(Path(__file__).resolve()), "--child-quantize", str(f32 / name),
                             str(part), variant])
            if res.returncode != 0:
                part.unlink(missing_ok=True)
                raise PrepareError(f"quantizing {name} to {variant} failed: {res.why()}")
            os.replace(part, out / name)
    _write_stamp(stamp, want, seconds=round(time.perf_counter() - t0, 1))
    return out


def prepare_vox(s: Setup, weight_type: str) -> Path:
    """vox's .tmod of the folder for `weight_type` (made once with vox.build, cached)."""
    out = s.cache / "peers" / s.hf_dir.name / f"vox-{weight_type}.tmod"
    want = {"source": folder_key(s.hf_dir), "vox": s.peers_versions.get("vox"), "build": VOX_BUILD[weight_type]}
    stamp = out.with_name(out.name + ".json")
    if _stamp_ok(stamp, want, [out]):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    part = out.with_name(out.name + ".partial")
    say(f"vox: building {out.name} ({' '.join(VOX_BUILD[weight_type])})")
    t0 = time.perf_counter()
    res = run_child([s.peers_python, "-m", "vox.build", "--model", str(s.hf_dir), *VOX_BUILD[weight_type], "--no-hash",
                     "-o", str(part)])
    if res.returncode != 0 or not part.is_file():
        part.unlink(missing_ok=True)
        raise PrepareError(f"vox.build failed: {res.why()}")
    os.replace(part, out)
    _write_stamp(stamp, want, seconds=round(time.perf_counter() - t0, 1))
    return out


# ---- which peers can run here ---------------------------------------------------------------

_PROBE = ("import importlib, json\nout = {}\n"
          "for m in ('qwentts_cpp_cpu', 'vox', 'gguf'):\n"
          "    try:\n        out[m] = getattr(importlib.import_module(m), '__version__', '?')\n"
          "    except Exception as e:\n        out[m] = {'error': type(e).__name__ + ': ' + str(e)}\n"
          "print(json.dumps(out))")


def find_peers_python(given: str | None) -> tuple[str | None, str]:
    """(the Python of the peers' venv, '') or (None, why not)."""
    named = given or os.environ.get(PEERS_PYTHON_ENV)
    path = Path(named) if named else DEFAULT_PEERS_VENV / "bin" / "python"
    if not path.is_file():
        where = f"{path} (from {'--peers-python' if given else PEERS_PYTHON_ENV})" if named else str(path)
        return None, f"not installed: no peers' Python at {where}; {SETUP_HINT} makes one"
    return str(path), ""


def probe_peers(python: str) -> dict:
    """{module: version or {"error": ...}} in the peers' Python."""
    try:
        res = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=300)
        return json.loads(res.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
        return {m: {"error": f"{python} does not run the probe ({e})"} for m in ("qwentts_cpp_cpu", "vox", "gguf")}


def peer_blockers(peers_python: str | None, why_python: str, versions: dict, convert: Path | None,
                  reference_python: str | None, why_reference: str) -> dict[str, tuple[str, str]]:
    """For each peer that cannot run here: (status, reason)."""
    out: dict[str, tuple[str, str]] = {}

    def missing(module: str, package: str) -> tuple[str, str] | None:
        v = versions.get(module)
        if isinstance(v, str):
            return None
        err = v.get("error") if isinstance(v, dict) else "not probed"
        return "not installed", f"{peers_python} cannot import {module} ({package}): {err}; {SETUP_HINT}"

    if peers_python is None:
        out["qwentts.cpp"] = out["vox"] = ("not installed", why_python.removeprefix("not installed: "))
    else:
        for peer, module, package in (("qwentts.cpp", "qwentts_cpp_cpu", "realtimetts-qwen-native-cpu"),
                                      ("vox", "vox", "vox-tts")):
            m = missing(module, package)
            if m:
                out[peer] = m
        if "qwentts.cpp" not in out:
            if convert is None:
                out["qwentts.cpp"] = ("not run", QWENTTS_CLONE_HINT)
            elif not convert.is_file():
                out["qwentts.cpp"] = ("not run", f"{convert} does not exist; {QWENTTS_CLONE_HINT}")
            elif reference_python is None:
                out["qwentts.cpp"] = ("not run", f"its convert.py needs torch, from the reference venv: "
                                                 f"{why_reference}")
            elif missing("gguf", "gguf"):
                out["qwentts.cpp"] = missing("gguf", "gguf")
            elif not (Path(peers_python).parent.parent / "convert-libs" / "gguf").is_dir():
                out["qwentts.cpp"] = ("not installed", f"no gguf for convert.py in "
                                      f"{Path(peers_python).parent.parent / 'convert-libs'}; {SETUP_HINT}")
    if reference_python is None:
        out["pytorch"] = ("not installed", why_reference)
    return out


# ---- the run --------------------------------------------------------------------------------

def run_vocable(s: Setup, weight_type: str, gguf: Path, clip: Path) -> Row:
    say(f"Vocable, {weight_type}: {gguf.name}")
    res = run_child(child_command(sys.executable, "vocable", str(gguf), clip, s.threads, s.frames, s.repeats,
                                  s.text, s.language))
    return row_from_child("vocable", weight_type, res)


def prepare_peer(s: Setup, engine: str, weight_type: str) -> Path | str:
    """The peer's model for `weight_type`, or why it could not be made."""
    try:
        return prepare_qwentts(s, weight_type) if engine == "qwentts.cpp" else prepare_vox(s, weight_type)
    except PrepareError as e:
        return str(e)


def run_peer(s: Setup, engine: str, weight_type: str, model: Path | str, clip: Path) -> Row:
    if isinstance(model, str):
        return not_measured(engine, weight_type, "failed", model)
    say(f"{LABELS[engine]}, {weight_type}: {model}")
    res = run_child(child_command(s.peers_python, engine, str(model), clip, s.threads, s.frames, s.repeats,
                                  s.text, s.language))
    return row_from_child(engine, weight_type, res)


def run_pytorch(s: Setup, clip: Path) -> Row:
    """The official package through `vocable bench`'s reference script, in its own process."""
    from vocable.bench.reference import SYNTHESIS_SCRIPT, TOOLS_DIR

    script = TOOLS_DIR / SYNTHESIS_SCRIPT
    outputs = s.work / f"pytorch-{os.getpid()}.npz"
    cmd = python_child(s.reference_python, str(script), "--model-dir", str(s.hf_dir), "--clip", str(clip),
                       "--outputs", str(outputs), "--threads", str(s.threads), "--repeats", str(s.repeats),
                       "--frames", str(s.frames), "--text", s.text, "--language", s.language)
    env = dict(os.environ, OMP_NUM_THREADS=str(s.threads), MKL_NUM_THREADS=str(s.threads), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    say(f"PyTorch, f32: {script.name} ({s.reference_python})")
    try:
        res = run_child(cmd, env=env)
    finally:
        outputs.unlink(missing_ok=True)
    row = Row("pytorch", "f32", RECIPES[("pytorch", "f32")], peak_rss_mib=res.peak_rss_mib)
    if res.returncode != 0:
        row.status, row.reason = "failed", res.why()
        return row
    try:
        out = res.last_json()
        runs = out["runs_ms"]
        row.wall_ms, row.first_audio_ms = list(runs["wall_ms"]), list(runs["first_audio_ms"])
        row.samples = [int(out["samples"])] * len(row.wall_ms)   # greedy: every call makes the same
    except (ValueError, KeyError, TypeError) as e:
        row.status, row.reason = "failed", f"unreadable result ({e})"
        return row
    row.load_s = out.get("load_s")
    row.info = {"package": out.get("package"), "torch": out.get("versions", {}).get("torch"),
                "reached_eos": out.get("reached_eos")}
    return row


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default=",".join(TYPES), help=f"weight types, of {', '.join(TYPES)}")
    ap.add_argument("--frames", type=int, default=DEFAULT_FRAMES, help="codec frames per synthesis (80 ms each)")
    ap.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    ap.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, help="timed runs after 1 warm-up")
    ap.add_argument("--peers", default=",".join(PEERS), help=f"the peers to run beside Vocable, of {', '.join(PEERS)}")
    ap.add_argument("--peers-python", help=f"the peers' venv Python (default ${PEERS_PYTHON_ENV}, else .venv-peers)")
    ap.add_argument("--qwentts-convert", help=f"qwentts.cpp's convert.py (default ${QWENTTS_CONVERT_ENV})")
    ap.add_argument("--model", help="a Hugging Face model folder to use instead of the random real-shape 0.6B one")
    ap.add_argument("--cache-dir", help="where models are built and converted (default: vocable bench's cache)")
    ap.add_argument("--ref-seconds", type=float, default=DEFAULT_REF_SECONDS, help="length of the reference clip")
    # the children (not for direct use)
    ap.add_argument("--child", choices=sorted(CHILD_ENGINES), help=argparse.SUPPRESS)
    ap.add_argument("--child-quantize", nargs=3, metavar=("SRC", "DST", "VARIANT"), help=argparse.SUPPRESS)
    ap.add_argument("--clip", help=argparse.SUPPRESS)
    ap.add_argument("--text", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--language", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child or a.child_quantize:
        return a
    a.types = [t.strip().lower() for t in a.types.split(",") if t.strip()]
    bad = [t for t in a.types if t not in TYPES]
    if bad or not a.types:
        ap.error(f"--types: unknown weight type(s) {', '.join(bad) or '(none)'}; choose from {', '.join(TYPES)}")
    a.types = [t for t in TYPES if t in a.types]
    a.peers = [p.strip().lower() for p in a.peers.split(",") if p.strip()]
    bad = [p for p in a.peers if p not in PEERS]
    if bad:
        ap.error(f"--peers: unknown peer(s) {', '.join(bad)}; choose from {', '.join(PEERS)}")
    if a.frames < 1 or a.threads < 1 or a.repeats < 1:
        ap.error("--frames, --threads and --repeats must be at least 1")
    convert = a.qwentts_convert or os.environ.get(QWENTTS_CONVERT_ENV)
    a.qwentts_convert = Path(convert).expanduser().resolve() if convert else None
    return a


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.child:
        child_main(a)
        return 0
    if a.child_quantize:
        requantize_qwentts(*a.child_quantize)
        return 0

    from vocable.bench.measure import GEN_LANGUAGE, GEN_TEXT, make_reference_clip
    from vocable.bench.reference import find_reference_python
    from vocable.bench.report import cpu_name
    from vocable.bench.model import default_cache_dir, ensure_bench_model, user_model

    cache = Path(a.cache_dir).expanduser() if a.cache_dir else default_cache_dir()
    load_before = _loadavg()
    models = {}
    for wt in a.types:   # Vocable's GGUF per type, and the folder every engine converts
        models[wt] = (user_model(Path(a.model), cache, wt, progress=say) if a.model else
                      ensure_bench_model(cache_dir=cache, weight_type=wt, progress=say))
    hf_dir = models[a.types[0]].hf_dir
    if hf_dir is None:
        raise SystemExit("--model must be a Hugging Face model folder (the peers convert it), not a .gguf")
    work = cache / "peers" / "work"
    work.mkdir(parents=True, exist_ok=True)
    s = Setup(hf_dir=hf_dir, cache=cache, work=work, threads=a.threads, frames=a.frames, repeats=a.repeats,
              text=GEN_TEXT, language=GEN_LANGUAGE, qwentts_convert=a.qwentts_convert)

    peers_python, why_python = find_peers_python(a.peers_python)
    s.peers_python = peers_python
    s.peers_versions = probe_peers(peers_python) if peers_python else {}
    ref_python, why_reference = (find_reference_python() if ("pytorch" in a.peers or "qwentts.cpp" in a.peers)
                                 else (None, "not asked for"))
    s.reference_python = ref_python
    blockers = peer_blockers(peers_python, why_python, s.peers_versions, a.qwentts_convert, ref_python, why_reference)
    for peer, (status, reason) in blockers.items():
        if peer in a.peers:
            say(f"{LABELS[peer]}: {status}: {reason}")

    import numpy as np

    wav, clip_source = make_reference_clip(a.ref_seconds)
    clip = work / f"clip-{os.getpid()}.npy"
    np.save(clip, wav)
    # every model first (converting is not timed), then the timed runs back to back
    peer_models = {(p, wt): prepare_peer(s, p, wt) for wt in a.types for p in ("qwentts.cpp", "vox")
                   if p in a.peers and p not in blockers}
    load_timed = _loadavg()
    rows: list[Row] = []
    try:
        for wt in a.types:
            rows.append(run_vocable(s, wt, models[wt].gguf, clip))
            for peer in a.peers:
                if peer == "pytorch" and wt != "f32":
                    rows.append(not_measured(peer, wt, "not run",
                                             "the official package runs fp32 weights only (its row is under f32)"))
                elif peer in blockers:
                    rows.append(not_measured(peer, wt, *blockers[peer]))
                elif peer == "pytorch":
                    rows.append(run_pytorch(s, clip))
                else:
                    rows.append(run_peer(s, peer, wt, peer_models[(peer, wt)], clip))
    finally:
        clip.unlink(missing_ok=True)

    backend = next((r.info.get("backend") for r in rows if r.engine == "vocable" and r.info.get("backend")), None)
    notes = {"qwentts.cpp": f"its convert.py at {a.qwentts_convert}" if a.qwentts_convert else None,
             "vox": f"vox-tts {s.peers_versions.get('vox')}" if isinstance(s.peers_versions.get("vox"), str) else None}
    rep = {
        "bench": "vocable-peers", "model": ("random weights, real Qwen3-TTS-12Hz-0.6B-Base shapes" if not a.model
                                            else f"the model at {hf_dir}"),
        "hf_dir": str(hf_dir), "threads": a.threads, "frames": a.frames, "repeats": a.repeats,
        "ref_seconds": a.ref_seconds, "clip_source": clip_source, "text": s.text, "language": s.language,
        "cpu": cpu_name(), "cpus": os.cpu_count(), "vocable_backend": backend,
        "loadavg": [load_before, load_timed, _loadavg()],   # at the start, when timing began, at the end
        "notes": {k: v for k, v in notes.items() if v}, "missed_targets": missed_targets(rows),
        "rows": [{**asdict(r), **r.figures(), "vs_vocable": ratios(rows).get((r.engine, r.weight_type))} for r in rows],
    }
    print_report(rep, rows)
    print(json.dumps(rep), flush=True)
    return 1 if any(r.status == "failed" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
