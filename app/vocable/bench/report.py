"""The report of `vocable bench`: the table, the notes under it, the targets met and missed."""
from __future__ import annotations

import platform

from . import batch as bench_batch, contention as bench_contention, memory as bench_memory, variants as bench_variants
from .measure import FRAME_MS
from .groups import TARGET_FIRST_AUDIO_MS, TARGET_MS, TARGET_RTF, TARGET_SPEEDUP

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


def targets_text(targets: list[dict] | None) -> str:
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


def print_report(rep: dict) -> None:
    m = rep["model"]
    what = ("random weights, real Qwen3-TTS-12Hz-0.6B-Base shapes" if m["random_weights"] and m["hf_dir"] else
            "the given model")
    print(f"vocable bench {rep['vocable_version']}: {what} ({m['weight_type']})")
    print(f"  {rep['threads']} thread(s), {rep['ref_seconds']:g} s reference clip ({rep['clip_source']}), "
          f"{rep['cpu']} ({rep['cpus']} CPUs); median of {rep['repeats']} run(s) after 1 warm-up")
    if rep.get("cpu_backend"):
        print(f"  ggml CPU backend: {rep['cpu_backend']}")
    device = rep.get("device") or {}
    if device.get("in_use", "cpu") != "cpu":
        software = "llvmpipe" in device.get("description", "") or "lavapipe" in device.get("description", "")
        print(f"  talker, code predictor, codec decoder and speaker encoder on {device['in_use']} ({device.get('description', '')})" +
              (": a software driver, so these figures show correctness, not a GPU's speed" if software else ""))
    elif device.get("fallback"):
        print(f"  {device['asked']} is not in use, the CPU runs it: {device['fallback']}")
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
        rows.append((label, _ms(s["vocable_ms"]), _ms(s["reference_ms"]), speed, targets_text(s.get("targets"))))
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
        print(f"  CPU variants (streamed synthesis, {rep['frames']} frames, greedy, and the long text's better of "
              f"two runs where timed; one process each):")
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
