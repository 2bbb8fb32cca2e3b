"""Long texts in batches: a 10-segment text spoken one segment after the other, then with its
segments generated side by side (Engine.synthesize(batch=N)), on the same engine, with the same
seed and frame cap; the audio seconds each produces per wall second, their ratio against the
target of issue 15 (at least 2x at q4_k), and whether both gave the same codes and audio.

Random weights never emit EOS, so every segment runs to the frame cap: both runs generate the
same frames, and the comparison is one of throughput alone.
"""
from __future__ import annotations

import time

import numpy as np

N_SEGMENTS = 10
TARGET_SPEEDUP = {"q4_k": 2.0}
SENTENCES = ("The quick brown fox jumps over the lazy dog.", "A long text is spoken a segment at a time.",
             "Each segment has its own seed, derived from the stream's.", "The voice stays the same throughout.",
             "Batches share every read of the weights.", "The talker and the code predictor step together.",
             "The codec decoder turns every segment into audio.", "Nothing here is ever sent to a server.",
             "The result is written to a file at the end.", "And this is the tenth and last sentence.")


def _run(engine, voice, frames: int, batch: int, seed: int) -> tuple[float, object]:
    t0 = time.perf_counter()
    # one segment per sentence: each is shorter than this many speech units
    result = engine.synthesize(" ".join(SENTENCES), voice, "English", seed=seed, max_frames=frames,
                               max_segment_units=60, batch=batch).result()
    return time.perf_counter() - t0, result


def batched_audio_per_s(engine, voice, frames: int, batch: int, seed: int = 1) -> float:
    """The 10-segment text `batch` at a time, once (the engine warmed up already): seconds of
    audio per wall second."""
    seconds, result = _run(engine, voice, frames, batch, seed)
    return result.seconds / seconds


def compare(engine, voice, frames: int, batch: int, weight_type: str, seed: int = 1) -> dict:
    """Times both ways (one warm-up segment first) and checks that they agree."""
    engine.synthesize(SENTENCES[0], voice, "English", seed=seed, max_frames=2).result()
    alone_s, alone = _run(engine, voice, frames, 1, seed)
    batched_s, batched = _run(engine, voice, frames, batch, seed)
    audio = alone.seconds
    out = {"segments": len(alone.segments), "frames": int(alone.codes.shape[0]), "batch": batch,
           "audio_s": round(audio, 2), "one_by_one_s": round(alone_s, 2), "batched_s": round(batched_s, 2),
           "one_by_one_audio_per_s": round(audio / alone_s, 3), "batched_audio_per_s": round(audio / batched_s, 3),
           "speedup": round(alone_s / batched_s, 3),
           "identical": bool(np.array_equal(alone.codes, batched.codes) and np.array_equal(alone.audio, batched.audio))}
    target = TARGET_SPEEDUP.get(weight_type)
    if target is not None:
        out.update(target_speedup=target, met=out["speedup"] >= target)
    return out


def describe(by_type: dict) -> list[str]:
    lines = []
    for wt, r in by_type.items():
        if "error" in r:
            lines.append(f"long text {wt} failed: {r['error']}")
            continue
        text = (f"long text {wt}, {r['segments']} segments x {r['frames'] // max(r['segments'], 1)} frames "
                f"({r['audio_s']:.1f} s of audio): one by one {r['one_by_one_audio_per_s']:.2f} s of audio per "
                f"second, {r['batch']} at a time {r['batched_audio_per_s']:.2f} ({r['speedup']:.2f}x"
                + (f", target >= {r['target_speedup']:g}x: {'met' if r['met'] else 'MISSED'}" if "met" in r else "")
                + "), " + ("the same codes and audio" if r["identical"] else "DIFFERENT codes or audio"))
        lines.append(text)
    return lines


def missed(by_type: dict) -> list[str]:
    out = [f"long text {wt}: {r['speedup']:.2f}x the audio per second one by one with {r['batch']} at a time, "
           f"target >= {r['target_speedup']:g}x" for wt, r in by_type.items() if r.get("met") is False]
    out += [f"long text {wt}: the batch gave other codes or audio than one by one"
            for wt, r in by_type.items() if r.get("identical") is False]
    return out
