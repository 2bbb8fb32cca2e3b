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

Missed targets are listed after the table ("MISSED TARGETS") and in the JSON ("missed_targets").
Output: progress on stderr; the table, then one JSON line with every figure, on stdout.

The parts: measure.py (the input, the [Perf] lines), groups.py (the voice, generation and
synthesis stages and their targets), agreement.py (the outputs compared), reference.py (the
official package in a subprocess), report.py (the table); batch.py, memory.py, contention.py and
variants.py measure long texts, peak memory, other work beside the engine and the CPU variants.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from ..errors import VocableError
from . import batch as bench_batch, contention as bench_contention, memory as bench_memory, variants as bench_variants
from . import reference
from .groups import STAGE_GROUPS, timed_synthesis
from .measure import (DEFAULT_FRAMES, GEN_LANGUAGE, GEN_TEXT, SAMPLE_RATE, BenchInput, GroupResult, engine_perf_lines,
                      make_reference_clip, say)
from .report import cpu_name, missed_targets, print_report

DEFAULT_TYPES = ("f32", "f16", "q8_0", "q4_k")


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
            return user_model(Path(given), cache, weight_type=weight_type, progress=say)
        return ensure_bench_model(cache_dir=cache, weight_type=weight_type, progress=say)
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
    inp = BenchInput(clip, clip_path, work, threads, repeats, frames, models, model.weight_type,
                     device=str(getattr(args, "device", None) or "cpu"))
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
    say(f"engine: {model.gguf.name}, {inp.threads} thread(s)")
    with engine_perf_lines():
        t0 = time.perf_counter()
        engine = Engine(model.gguf, threads=inp.threads, device=inp.device)
        load_s = time.perf_counter() - t0
    if engine.device_fallback and inp.device != "cpu":
        say(f"engine: {inp.device} is not in use, the CPU runs it: {engine.device_fallback}")
    device = {"asked": inp.device, "in_use": engine.device, "fallback": engine.device_fallback,
              "description": next((d["description"] for d in _engine.devices() if d["id"] == engine.device), "")}
    busy, engines = int(getattr(args, "background_load", 0) or 0), int(getattr(args, "background_engines", 0) or 0)
    contention: dict[str, dict] = {}
    with engine:
        for g in STAGE_GROUPS:
            say(f"engine: {g.name} stages, 1 warm-up + {inp.repeats} run(s)")
            try:
                ours[g.name] = g.run_vocable(engine, inp)
            except VocableError as e:
                ours[g.name] = GroupResult(error=str(e))
        if busy or engines:
            contention = contention_runs(engine, inp, busy, engines)
        long_text: dict[str, dict] = {}
        long_text_batch = 0
        if not getattr(args, "no_long_text", False):   # on the main engine where it is the type benched
            from ..engine import FILE_BATCH
            long_text_batch = int(getattr(args, "batch", None) or FILE_BATCH)
            long_text = long_text_runs(engine, inp, long_text_batch)
    memory: dict[str, dict] = {}
    if "speaker_path" in inp.shared:   # the synthesis stages ran and saved the voice
        for wt in list(inp.models) or [inp.main_type]:
            gguf = inp.models[wt].gguf if wt in inp.models else model.gguf
            say(f"engine: peak memory of a whole synthesis, {wt}: a process of its own")
            memory[wt] = bench_memory.peak_rss(str(gguf), str(inp.shared["speaker_path"]), inp.threads, inp.frames,
                                               wt)
    variants: dict[str, dict] = {}
    if getattr(args, "cpu_variants", None):
        names = bench_variants.parse(args.cpu_variants)
        for wt in list(inp.models) or [inp.main_type]:
            gguf = inp.models[wt].gguf if wt in inp.models else model.gguf
            say(f"engine: CPU variants {', '.join(names)}, {wt}: one process each")
            variants[wt] = bench_variants.compare(str(gguf), str(inp.clip_path), inp.threads, inp.frames,
                                                  inp.repeats, names, long_text_batch)

    theirs: dict[str, GroupResult] = {}
    ref = {"status": "skipped", "reason": "--no-reference"}
    if not args.no_reference:
        python, why = reference.find_reference_python()
        if model.hf_dir is None:
            ref = {"status": "skipped", "reason": "the reference needs the Hugging Face folder, not a .gguf"}
        elif python is None:
            ref = {"status": "skipped", "reason": why}
        else:
            ref = {"status": "ok", "python": python}
            seen: dict[int, str] = {}   # one run shared by several groups is reported once
            for g in STAGE_GROUPS:
                say(f"reference: {g.name} stages ({python})")
                r = theirs[g.name] = reference.run_reference(g, python, model.hf_dir, inp)
                if r.error:
                    ref = {"status": r.error.split(":", 1)[0], "reason": r.error.split(":", 1)[1].strip(),
                           "python": python}
                    break
                if id(r) in seen:
                    say(f"reference: {g.name} stages from the same run as {seen[id(r)]}")
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
        "cpu_backend": _engine.system_info(), "device": device,
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
    print_report(report)
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
        say(f"engine: {what.format(wt=wt)}")
        own = model is not None and wt != inp.main_type
        eng = Engine(model.gguf, threads=inp.threads, device=inp.device) if own else engine
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
        return bench_contention.contention(lambda: timed_synthesis(eng, voice, inp.frames), inp.repeats, busy, engines,
                                           engine_args)
    return _per_type(engine, inp, list(inp.models) or [inp.main_type],
                     f"contention, {{wt}}: quiet, {busy} busy process(es), {engines} other engine(s)", run)
