"""`vocable bench --background-load N --background-engines M`: synthesis beside other work.

A desktop is rarely idle: a browser, a compiler or a second synthesis compete for the cores.
For each weight type this times the same streamed synthesis as the bench's synthesis group,
first quiet, then with N busy processes (each spins one core) and/or with M other engine
processes synthesizing in a loop on the same model, all started and stopped here, and reports
the real-time factors and their ratios to the quiet one, next to the targets: at most 1.6x
the quiet factor with one busy process (two engine threads on two cores would get 2/3 of the
machine, 1.5x, at a fair share), at most 2.3x with two engines at once (a fair share is 2x).
"""
from __future__ import annotations

import re
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np

from ..errors import VocableError

TARGET_BUSY_RATIO = 1.6      # with one busy process
TARGET_ENGINES_RATIO = 2.3   # two engines at once (one in the background)
READY_TIMEOUT_S = 600        # a background engine loads its model and embeds the clip first
_THREADS_LINE = re.compile(r"\[Perf\] threads: \d+ -> (\d+)")


def engine_load_loop(gguf: str, clip_path: str, threads: str, text: str, language: str, frames: str) -> None:
    """A background engine (run in a child process): synthesizes `text` over and over until it
    is killed; prints "ready" once its first synthesis starts."""
    from ..engine import Engine

    with Engine(gguf, threads=int(threads)) as engine:
        voice = engine.embed_voice(np.load(clip_path), 24000)
        print("ready", flush=True)
        while True:
            with engine.synthesize(text, voice, language, greedy=True, max_frames=int(frames)) as stream:
                for _ in stream:
                    pass


@contextmanager
def background_work(busy: int, engines: int, engine_args: list[str]) -> Iterator[None]:
    """Starts `busy` processes that spin one core each and `engines` background engines, waits
    until the engines synthesize, and stops them all on exit."""
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(busy):
            procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        loop = ("import sys; from vocable.bench.contention import engine_load_loop; "
                "engine_load_loop(*sys.argv[1:])")
        starting = [subprocess.Popen([sys.executable, "-c", loop, *engine_args], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True) for _ in range(engines)]
        procs += starting
        deadline = time.monotonic() + READY_TIMEOUT_S
        for p in starting:
            line = p.stdout.readline()   # blocks until "ready" or the child ends
            if line.strip() != "ready" or time.monotonic() > deadline:
                raise VocableError(f"a background engine did not start (exit status {p.poll()})")
        time.sleep(1.0)   # let the scheduler see the new load, and the engine measure it
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def measure(synthesize: Callable[[], object], repeats: int) -> dict:
    """Median real-time factor of `repeats` calls of `synthesize` (after a warm-up; it returns
    the bench's SynthesisCall), and the thread counts the engine switched to on the way."""
    rtfs, threads = [], set()
    for i in range(1 + repeats):
        call = synthesize()
        threads.update(int(m.group(1)) for line in call.lines for m in [_THREADS_LINE.search(line)] if m)
        if i:
            rtfs.append(call.wall_ms / 1e3 / call.result.seconds)
    return {"rtf": float(np.median(rtfs)), "runs": [round(r, 3) for r in rtfs], "threads_switched_to": sorted(threads)}


def contention(synthesize: Callable[[], object], repeats: int, busy: int, engines: int, engine_args: list[str]) -> dict:
    """Quiet, busy-loaded and engine-loaded real-time factors of `synthesize` (see the module doc);
    `engine_args` are engine_load_loop's for the background engines."""
    out: dict = {"quiet": measure(synthesize, repeats)}
    quiet = out["quiet"]["rtf"]
    for key, n_busy, n_engines, target in (("busy", busy, 0, TARGET_BUSY_RATIO if busy == 1 else None),
                                           ("engines", 0, engines, TARGET_ENGINES_RATIO if engines == 1 else None)):
        if not (n_busy or n_engines):
            continue
        with background_work(n_busy, n_engines, engine_args):
            r = measure(synthesize, repeats)
        r.update(count=n_busy or n_engines, ratio=r["rtf"] / quiet, target_ratio=target,
                 met=None if target is None else r["rtf"] / quiet <= target)
        out[key] = r
    return out


def describe(wt: str, c: dict) -> list[str]:
    """The report's lines for one weight type."""
    q = c["quiet"]
    lines = [f"{wt}: quiet real-time factor {q['rtf']:.3f}"]
    for key, what in (("busy", "busy process(es)"), ("engines", "other engine(s) synthesizing")):
        r = c.get(key)
        if not r:
            continue
        target = "" if r["target_ratio"] is None else \
            f"; target <= {r['target_ratio']:g}x: {'yes' if r['met'] else 'NO'}"
        switched = ", ".join(map(str, r["threads_switched_to"])) or "none"
        lines.append(f"{wt}: with {r['count']} {what}: {r['rtf']:.3f}, {r['ratio']:.2f}x quiet{target} "
                     f"(thread switches during the runs: to {switched})")
    return lines


def missed(contention_by_type: dict) -> list[str]:
    out = []
    for wt, c in contention_by_type.items():
        for key, what in (("busy", "busy process"), ("engines", "other engine")):
            r = c.get(key)
            if r and r["met"] is False:
                out.append(f"contention {wt}, with {r['count']} {what}: {r['ratio']:.2f}x the quiet real-time "
                           f"factor, target <= {r['target_ratio']:g}x: "
                           f"{100 * (r['ratio'] / r['target_ratio'] - 1):.0f} % over")
    return out
