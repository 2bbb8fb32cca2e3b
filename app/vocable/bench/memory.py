"""The peak memory of a whole synthesis: load the model and synthesize, in a process of its own.

The bench's main process holds every weight type's engine and the reference's outputs, so its
own peak says nothing about one synthesis. For each weight type a child process loads the model,
synthesizes the bench text from the bench voice's speaker embedding (x-vector mode, greedy, the
bench's frame count) and reports its own peak resident set, which includes the interpreter,
numpy and the engine's library, next to the target of issue 15 (at most 1.0 GB at q8_0 for the
0.6B shapes).
"""
from __future__ import annotations

import json
import subprocess
import sys

TARGET_PEAK_RSS_BYTES = {"q8_0": 1.0e9}
CHILD_TIMEOUT_S = 1800


def _own_peak_rss_bytes() -> int:
    """This process's peak resident set. Linux's ru_maxrss is not it: a child started from a large
    parent inherits the parent's peak through fork and exec (measured: the bench's children
    reported the bench's own 1.8 GB), so VmHWM of this address space is read instead."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024   # bytes on macOS, KiB elsewhere


def synthesis_run(gguf: str, speaker_path: str, threads: str, frames: str) -> None:
    """In a child process: one synthesis; prints one JSON line with its peak RSS."""
    import numpy as np

    from .measure import GEN_LANGUAGE, GEN_TEXT
    from ..engine import Engine
    from ..library.voice import Voice

    voice = Voice(np.load(speaker_path))
    with Engine(gguf, threads=int(threads)) as engine:
        result = engine.synthesize(GEN_TEXT, voice, GEN_LANGUAGE, greedy=True, max_frames=int(frames)).result()
    print(json.dumps({"frames": int(result.codes.shape[0]), "peak_rss_bytes": _own_peak_rss_bytes()}), flush=True)


def peak_rss(gguf: str, speaker_path: str, threads: int, frames: int, weight_type: str) -> dict:
    """{"peak_rss_bytes", "frames"} and the target where there is one, or {"error": why}."""
    code = "import sys; from vocable.bench.memory import synthesis_run; synthesis_run(*sys.argv[1:])"
    try:
        proc = subprocess.run([sys.executable, "-c", code, gguf, speaker_path, str(threads), str(frames)],
                              capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {CHILD_TIMEOUT_S} s"}
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        return {"error": lines[-1] if lines else f"exit status {proc.returncode}"}
    run = json.loads(proc.stdout.strip().splitlines()[-1])
    target = TARGET_PEAK_RSS_BYTES.get(weight_type)
    if target is not None:
        run.update(target_bytes=target, met=run["peak_rss_bytes"] <= target)
    return run


def describe(by_type: dict, frames: int) -> list[str]:
    parts = []
    for wt, r in by_type.items():
        if "error" in r:
            parts.append(f"{wt} failed: {r['error']}")
            continue
        text = f"{wt} {r['peak_rss_bytes'] / 2 ** 20:.0f} MiB"
        if "target_bytes" in r:
            text += f" (target <= {r['target_bytes'] / 1e9:g} GB: {'met' if r['met'] else 'MISSED'})"
        parts.append(text)
    return [f"peak RSS of a whole synthesis (load + {frames} frames, a process of its own): " + ", ".join(parts)] \
        if parts else []


def missed(by_type: dict) -> list[str]:
    return [f"memory {wt}: peak RSS {r['peak_rss_bytes'] / 1e9:.2f} GB of a whole synthesis, target <= "
            f"{r['target_bytes'] / 1e9:g} GB" for wt, r in by_type.items() if r.get("met") is False]
