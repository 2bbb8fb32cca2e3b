"""A soak: MINUTES of mixed work on the engine, the library and the history, as a long session
of the app would do it, checking that memory stays flat and nothing is lost.

    python tools/soak.py --minutes 30 [--seed 1] [--json out.json]

Runs on the tiny test models (converted here, f32 and q8_0, both sizes): synthesize (streamed,
both clone modes, short and multi-segment texts), cancel mid-stream, switch voice (embed a new
clip), change model, a second request while one runs, and bad inputs between good ones (empty
text, unknown language, a damaged voice, a foreign voice file, a broken audio file, a missing
model), each of which must fail with its own clear error and leave the engine working. Voices
go to a library and results to a history in a private VOCABLE_HOME; at the end every saved
entry must load back. Resident memory is sampled throughout: after the first fifth of the run
(warm-up: allocator pools, graph caches) it may grow by at most RSS_GROWTH_LIMIT_MIB (checked
in runs of MEMORY_CHECK_MIN_MINUTES or more). Prints a summary; exit status 1 when a check
failed.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
RSS_GROWTH_LIMIT_MIB = 24.0
# Under this, the allocator's own settling (glibc arenas per thread, freed pages kept) is as large
# as a leak would be: a shorter run checks everything but memory.
MEMORY_CHECK_MIN_MINUTES = 5.0
TEXTS = ["Hello there.", "How are you today? I hope that all is well.",
         "The quick brown fox jumps over the lazy dog. " * 6, "Numbers: 3, 14, 159; and 26.5 %!",
         "你好，世界。", "Short one."]


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def malloc_heap_mib() -> tuple[float, float] | None:
    """glibc's heap: (in use, free but kept) in MiB, over all arenas and mmapped blocks; None
    without glibc. Growth in use is a leak; growth of the free part is fragmentation."""
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (AttributeError, OSError):
        return None
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return (info.uordblks + info.hblkhd) / 2 ** 20, info.fordblks / 2 ** 20


class Soak:
    def __init__(self, work: Path, seed: int):
        from vocable.engine.convert import convert
        from vocable.library.history import History
        from vocable.library.voices import VoiceLibrary

        self.rng = random.Random(seed)
        self.models = []
        for variant in ("0.6b", "1.7b"):
            for weight_type in ("f32", "q8_0"):
                out = work / f"tiny-{variant}-{weight_type}.gguf"
                convert(FIXTURES / f"tiny-{variant}" / "model", out, weight_type=weight_type)
                self.models.append(out)
        import soundfile as sf
        self.clip, self.rate = sf.read(str(FIXTURES / "tiny-0.6b" / "reference" / "ref_24k.wav"), dtype="float32")
        self.library, self.history = VoiceLibrary(work / "home" / "voices"), History(work / "home" / "history")
        self.work = work
        self.counts: dict[str, int] = {}
        self.failures: list[str] = []
        self.saved_voices: set[str] = set()
        self.saved_history: set[str] = set()
        self.engine = None
        self.voices = []
        # every model once first, so that the warm-up covers each one's buffers
        for model in self.models[::-1]:
            self.open_model(model)

    # -- operations ---------------------------------------------------------------------------------

    def open_model(self, path: Path) -> None:
        from vocable import Engine
        if self.engine is not None:
            self.engine.close()
        self.engine = Engine(path, threads=2)
        self.voices = [self.embed()]

    def embed(self):
        start = self.rng.randrange(0, max(1, self.clip.shape[0] - 3 * self.rate))
        voice = self.engine.embed_voice(self.clip[start:start + self.rng.randint(3, 8) * self.rate], self.rate,
                                        ref_text=self.rng.choice([None, "Okay. Yeah. I resent you."]))
        entry = self.library.save(voice, f"soak {len(self.saved_voices)}")
        self.saved_voices.add(entry.id)
        return voice

    def synthesize(self) -> None:
        voice = self.rng.choice(self.voices)
        text = self.rng.choice(TEXTS)
        with self.engine.synthesize(text, voice, seed=self.rng.randrange(2 ** 32),
                                    max_segment_units=self.rng.choice([None, 40])) as stream:
            chunks = [c.audio for c in stream.chunks()]
            result = stream.result()
        self.check(result.audio.size == result.codes.shape[0] * 1920, "audio and codes disagree")
        self.check(np.array_equal(np.concatenate(chunks) if chunks else result.audio[:0], result.audio),
                   "the streamed chunks are not the result")
        self.check(bool(np.all(np.isfinite(result.audio))), "non-finite audio")
        if self.rng.random() < 0.3:
            entry = self.history.add(text, "soak", {"seed": result.seed}, result.audio, result.sample_rate)
            self.saved_history.add(entry.id)

    def cancel(self) -> None:
        from vocable import SynthesisCancelled
        stream = self.engine.synthesize(TEXTS[2], self.rng.choice(self.voices))
        try:
            for i, _ in enumerate(stream):
                if i >= self.rng.randint(0, 3):
                    stream.cancel()
            stream.result()
            self.count("cancel came after the end")
        except SynthesisCancelled:
            pass
        finally:
            stream.close()

    def busy(self) -> None:
        """A second request while one runs: it waits its turn, both finish."""
        results = []
        first = self.engine.synthesize(TEXTS[1], self.voices[0], max_frames=20)
        worker = threading.Thread(target=lambda: results.append(
            self.engine.synthesize(TEXTS[0], self.voices[-1], max_frames=10).result()))
        worker.start()
        results.append(first.result())
        worker.join(120)
        self.check(len(results) == 2 and not worker.is_alive(), "a queued request did not finish")

    def bad_input(self) -> None:
        from vocable import Voice
        from vocable.errors import AudioError, ModelError, VocableError, VoiceError
        from vocable.audio.files import read_reference
        kind = self.rng.choice(["empty", "language", "damaged", "voice-file", "audio-file", "model"])
        expected = {"empty": VocableError, "language": VocableError, "damaged": VocableError,
                    "voice-file": VoiceError, "audio-file": AudioError, "model": ModelError}[kind]
        try:
            if kind == "empty":
                self.engine.synthesize("   \u200b ", self.voices[0])
            elif kind == "language":
                self.engine.synthesize("Hello.", self.voices[0], language="klingon")
            elif kind == "damaged":
                good = self.voices[0]
                codes = np.full((5, 16), 3000, dtype=np.int32)
                self.engine.synthesize("Hello.", Voice(good.speaker_embedding, codes, "Hi.")).result()
            elif kind == "voice-file":
                path = self.work / "bad.voice"
                path.write_bytes(os.urandom(self.rng.randint(0, 300)))
                Voice.load(path)
            elif kind == "audio-file":
                path = self.work / "bad.wav"
                path.write_bytes(b"RIFF" + os.urandom(self.rng.randint(0, 300)))
                read_reference(path)
            else:
                from vocable import Engine
                Engine(self.work / "missing.gguf")
            self.failures.append(f"bad input '{kind}' was accepted")
        except expected:
            pass
        except Exception as e:  # noqa: BLE001 (any other type is the finding)
            self.failures.append(f"bad input '{kind}' raised {type(e).__name__}: {e}")

    # -- bookkeeping --------------------------------------------------------------------------------

    def check(self, ok: bool, what: str) -> None:
        if not ok:
            self.failures.append(what)

    def count(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1

    OPERATIONS = {"synthesize": 40, "cancel": 15, "voice": 10, "model": 5, "busy": 10, "bad": 20}

    def step(self, only: list[str] | None = None) -> None:
        ops = only or list(self.OPERATIONS)
        op = self.rng.choices(ops, weights=[self.OPERATIONS[o] for o in ops])[0]
        if op == "synthesize":
            self.synthesize()
        elif op == "cancel":
            self.cancel()
        elif op == "voice":
            self.voices = (self.voices + [self.embed()])[-4:]
        elif op == "model":
            self.open_model(self.rng.choice(self.models))
        elif op == "busy":
            self.busy()
        else:
            self.bad_input()
        self.count(op)

    def verify_saved(self) -> None:
        from vocable.library.voices import VoiceLibrary
        from vocable.library.history import History
        library, history = VoiceLibrary(self.library.root), History(self.history.root)
        voice_ids = {e.id for e in library.entries()}
        history_ids = {e.id for e in history.entries()}
        self.check(self.saved_voices <= voice_ids, f"voices lost: {sorted(self.saved_voices - voice_ids)}")
        self.check(self.saved_history <= history_ids, f"history lost: {sorted(self.saved_history - history_ids)}")
        for voice_id in self.saved_voices:
            library.load(voice_id)
        for entry_id in self.saved_history:
            history.load_audio(entry_id)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="write the summary here too")
    p.add_argument("--only", help="comma-separated operations to run (to find which one holds memory): "
                                  + ", ".join(Soak.OPERATIONS))
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vocable-soak-") as tmp:
        work = Path(tmp)
        os.environ["VOCABLE_HOME"] = str(work / "home")
        soak = Soak(work, args.seed)
        started = time.monotonic()
        deadline = started + 60 * args.minutes
        only = [o for o in args.only.split(",") if o] if args.only else None
        samples: list[tuple[float, float]] = [(0.0, rss_mib())]
        blocks: list[int] = [sys.getallocatedblocks()]  # Python objects, to tell their growth from native
        heap = [malloc_heap_mib()]
        while time.monotonic() < deadline:
            soak.step(only)
            now = time.monotonic() - started
            if now - samples[-1][0] >= 5.0:
                samples.append((now, rss_mib()))
                blocks.append(sys.getallocatedblocks())
                heap.append(malloc_heap_mib())
        soak.engine.close()
        samples.append((time.monotonic() - started, rss_mib()))
        blocks.append(sys.getallocatedblocks())
        heap.append(malloc_heap_mib())
        soak.verify_saved()
    warm = next(r for t, r in samples if t >= samples[-1][0] / 5)
    after_warm = [r for t, r in samples if t >= samples[-1][0] / 5]
    growth = max(after_warm) - warm
    memory_checked = args.minutes >= MEMORY_CHECK_MIN_MINUTES
    if memory_checked:
        soak.check(growth <= RSS_GROWTH_LIMIT_MIB,
                   f"memory grew by {growth:.1f} MiB after the warm-up (limit {RSS_GROWTH_LIMIT_MIB:g} MiB)")
    summary = {"minutes": round(samples[-1][0] / 60, 2), "operations": soak.counts,
               "rss_mib": {"start": round(samples[0][1], 1), "after_warmup": round(warm, 1),
                           "max_after_warmup": round(max(after_warm), 1), "end": round(samples[-1][1], 1)},
               "rss_growth_after_warmup_mib": round(growth, 1), "memory_checked": memory_checked, "voices_saved": len(soak.saved_voices),
               "history_saved": len(soak.saved_history), "failures": soak.failures,
               "python_blocks": {"start": blocks[0], "end": blocks[-1]},
               "rss_series_mib": [[round(t, 1), round(r, 1)] for t, r in samples],
               "malloc_in_use_free_mib": [[round(v, 1) for v in h] if h else None for h in heap]}
    print(f"soak: {summary['minutes']} min, {sum(soak.counts.values())} operations "
          f"({', '.join(f'{k} {v}' for k, v in sorted(soak.counts.items()))})")
    print(f"  RSS {summary['rss_mib']['start']} MiB at the start, {warm:.1f} after the warm-up, at most "
          f"{max(after_warm):.1f} after it (+{growth:.1f} MiB, "
          + (f"limit {RSS_GROWTH_LIMIT_MIB:g}" if memory_checked else
             f"not checked in a run under {MEMORY_CHECK_MIN_MINUTES:g} min")
          + f"), {summary['rss_mib']['end']} at the end")
    print(f"  Python heap blocks: {blocks[0]} at the start, {blocks[-1]} at the end")
    print(f"  saved and read back: {len(soak.saved_voices)} voices, {len(soak.saved_history)} history entries")
    print("  failures: " + ("none" if not soak.failures else "\n    " + "\n    ".join(soak.failures)))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return 1 if soak.failures else 0


if __name__ == "__main__":
    sys.exit(main())
