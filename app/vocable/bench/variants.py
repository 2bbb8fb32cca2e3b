"""`vocable bench --cpu-variants haswell,zen4`: the same synthesis on several ggml CPU variants.

ggml's CPU backend is loaded once per process, so each variant runs in a child process with
VOCABLE_CPU_VARIANT set (which lowers the engine's own kernels with it: haswell runs the AVX2
GEMM, zen4 the AVX512 one, alderlake the AVX2 one with AVX-VNNI dots). Every child times the
bench's streamed synthesis on the same model and clip, and, unless --no-long-text, the long text
--batch segments at a time (the better of two runs); the report gives each variant's real-time
factor and its speed-up over the first variant listed, next to the target for AVX512 over AVX2
(1.3x), and the long text's audio per second with its speed-up.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from ..errors import VocableError

TARGET_AVX512_SPEEDUP = 1.3
LONG_TEXT_RUNS = 2
CHILD_TIMEOUT_S = 1800


def variant_run(gguf: str, clip_path: str, threads: str, frames: str, repeats: str, batch: str = "0") -> None:
    """In a child process: 1 warm-up + `repeats` timed syntheses, then (batch > 1) the long text
    `batch` segments at a time, the better of LONG_TEXT_RUNS runs; prints one JSON line."""
    import numpy as np

    from .. import _engine
    from .batch import batched_audio_per_s
    from .groups import timed_synthesis
    from .measure import SAMPLE_RATE
    from .contention import measure
    from ..engine import Engine

    with Engine(gguf, threads=int(threads)) as engine:
        voice = engine.embed_voice(np.load(clip_path), SAMPLE_RATE)
        result = measure(lambda: timed_synthesis(engine, voice, int(frames)), int(repeats))
        if int(batch) > 1:   # the better of two runs: one run is at the mercy of a neighbour's burst
            result["long_text_batch"] = int(batch)
            result["long_text_audio_per_s"] = max(batched_audio_per_s(engine, voice, int(frames), int(batch))
                                                  for _ in range(LONG_TEXT_RUNS))
    print(json.dumps({"info": _engine.system_info(), **result}), flush=True)


def kernels_of(info: str) -> str | None:
    """The engine's kernels ("avx2", "avx512", "generic") from a system_info() line."""
    for part in info.split("; "):
        if part.startswith("kernels: "):
            return part[len("kernels: "):]
    return None


def compare(gguf: str, clip_path: str, threads: int, frames: int, repeats: int, variants: list[str],
            batch: int = 0) -> dict:
    """Each variant's timing (or its error), in the order given, with speed-ups over the first;
    with batch > 1, also the long text that many segments at a time (where the products of
    several columns, not memory, set the pace: the AVX-VNNI kernels show there)."""
    runs: dict[str, dict] = {}
    code = ("import sys; from vocable.bench.variants import variant_run; variant_run(*sys.argv[1:])")
    for variant in variants:
        env = dict(os.environ, VOCABLE_CPU_VARIANT=variant)
        try:
            proc = subprocess.run([sys.executable, "-c", code, gguf, clip_path, str(threads), str(frames),
                                   str(repeats), str(batch)], env=env, capture_output=True, text=True,
                                  timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            runs[variant] = {"error": f"no result within {CHILD_TIMEOUT_S} s"}
            continue
        if proc.returncode != 0:
            lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
            runs[variant] = {"error": lines[-1] if lines else f"exit status {proc.returncode}"}
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        r["kernels"] = kernels_of(r["info"])
        r["features"] = r["info"].split(" (", 1)[1].split(")", 1)[0] if " (" in r["info"] else ""
        runs[variant] = r
    base_name = variants[0]
    base = runs.get(base_name, {})
    for variant, r in runs.items():
        if "error" in r or "error" in base or variant == base_name:
            continue
        r["speedup"] = base["rtf"] / r["rtf"]
        if "long_text_audio_per_s" in r and "long_text_audio_per_s" in base:
            r["long_text_speedup"] = r["long_text_audio_per_s"] / base["long_text_audio_per_s"]
        if base.get("kernels") == "avx2" and r.get("kernels") == "avx512":
            r["target_speedup"] = TARGET_AVX512_SPEEDUP
            r["met"] = r["speedup"] >= TARGET_AVX512_SPEEDUP
    return {"baseline": base_name, "runs": runs}


def describe(wt: str, c: dict) -> list[str]:
    lines = []
    for variant, r in c["runs"].items():
        if "error" in r:
            lines.append(f"{wt}: {variant}: failed: {r['error']}")
            continue
        line = f"{wt}: {variant} (kernels {r['kernels']}): real-time factor {r['rtf']:.3f}"
        if "speedup" in r:
            line += f", {r['speedup']:.2f}x the speed of {c['baseline']}"
        if "target_speedup" in r:
            line += f"; target >= {r['target_speedup']:g}x: {'yes' if r['met'] else 'NO'}"
        if "long_text_audio_per_s" in r:
            line += (f"; long text {r['long_text_batch']} at a time {r['long_text_audio_per_s']:.2f} s of audio per s"
                     + (f" ({r['long_text_speedup']:.2f}x)" if "long_text_speedup" in r else ""))
        lines.append(line)
    return lines


def missed(by_type: dict) -> list[str]:
    out = []
    for wt, c in by_type.items():
        for variant, r in c["runs"].items():
            if r.get("met") is False:
                out.append(f"cpu variants {wt}: {variant} ({r['kernels']}) {r['speedup']:.2f}x the speed of "
                           f"{c['baseline']} ({c['runs'][c['baseline']]['kernels']}), target >= "
                           f"{r['target_speedup']:g}x")
    return out


def parse(value: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    if len(names) < 2:
        raise VocableError("--cpu-variants needs at least two variants to compare, e.g. haswell,zen4 "
                           "(`vocable about` lists this build's variants)")
    return names
