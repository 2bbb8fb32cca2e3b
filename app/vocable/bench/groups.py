"""The stage groups of `vocable bench`, each timed on both sides and compared.

Stage groups (`STAGE_GROUPS`) each own a reference script and an agreement check:
  - voice: speaker embedding and reference codes of the clip (`Engine.embed_voice`);
  - generation: `Engine.synthesize` of a fixed text for a fixed number of frames (--frames,
    default 50, 4 s of audio), x-vector mode with the clip's voice, greedy, for each weight type
    (f32, f16, q8_0, q4_k: the random model converted once per type and cached); talker and code
    predictor ms/frame, prefill and time to first frame from the engine's `[Perf]` lines, next to
    the reference's fp32 talker and code predictor ms/frame (tools/bench/reference_synthesis_timing.py,
    same speaker embedding, `max_new_tokens` = frames + 1). The issue's targets are shown with
    them: talker + code predictor under 60 ms/frame at q4_k and under 90 ms/frame at q8_0 (a
    frame is 80 ms of audio), and at least 4x faster than the reference. The random model's
    codec_head row of codec EOS is zeroed, so neither side stops early (reached_eos is reported).
    Per frame means per generated frame on both sides: for N frames the engine runs N - 1 talker
    steps after the prefill (none after the last frame), HF generate runs N (the last token it
    samples is discarded by the package); both run the code predictor N times.
  - synthesis: the audio of the same calls (the stream is consumed chunk by chunk as a player
    would): codec decode ms per second of audio, time to first audio, and the whole synthesis'
    wall time per second of audio (real-time factor x 1000), from the engine's `[Perf]` lines,
    next to the same reference run, whose speech tokenizer decodes all codes after generate (its
    first audio is the end of the whole call). Targets: first audio under 300 ms (x-vector mode,
    voice loaded), decode faster than the reference, real-time factor under 1 at q4_k. Agreement:
    the reference's decoder on the engine's codes of each type against the engine's audio.
The generation and synthesis groups share one set of engine calls and one reference process.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import VocableError
from .agreement import codes_agreement, describe, embedding_agreement, waveform_agreement
from .measure import (DEFAULT_FRAMES, FRAME_MS, GEN_LANGUAGE, GEN_TEXT, SAMPLE_RATE, SAMPLES_PER_FRAME, BenchInput,
                      GroupResult, engine_perf_lines, median, perf_value, round_ms, say, temp_file)
from .reference import SYNTHESIS_SCRIPT

# the targets for talker + code predictor per frame: (ms limit by weight type, min speedup)
TARGET_MS = {"q4_k": 60.0, "q8_0": 90.0}
TARGET_SPEEDUP = 4.0
# the audio issue's targets: time to first audio (x-vector, voice loaded), codec decode at least
# as fast as the reference, whole synthesis faster than real time (by weight type)
TARGET_FIRST_AUDIO_MS = 300.0
TARGET_DECODE_SPEEDUP = 1.0
TARGET_RTF = {"q4_k": 1.0}


class StageGroup:
    """Stages timed together: one engine call (or a few) and one reference script."""
    name = ""
    stages: list[tuple[str, str]] = []    # (key, label), in table order
    total: tuple[str, str] | None = None  # (key, label) of a row summing the stages, per run
    reference_script = ""
    agreement_title = ""                  # the heading of its comparisons in the report

    def run_vocable(self, engine, inp: BenchInput) -> GroupResult:
        raise NotImplementedError

    def reference_args(self, inp: BenchInput) -> list[str]:
        return []

    def agreement(self, ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray]) -> dict[str, dict]:
        """The group's outputs against the reference's: a name for each comparison (agreement.py)."""
        return {}

    def describe_agreement(self, agreement: dict[str, dict]) -> str:
        return describe(self.agreement_title, agreement)

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
    row = {"group": group, "key": key, "label": label, "vocable_ms": round_ms(v), "reference_ms": round_ms(r),
           "speedup": round(r / v, 3) if v and r else None,
           "vocable_min_ms": round_ms(min(ours or [None])),  # least disturbed
           "reference_min_ms": round_ms(min(theirs or [None])),
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
    agreement_title = "voice: the engine's against the reference's"
    _PERF = re.compile(r"\[Perf\] speaker embedding: ([\d.]+) ms, reference codes: ([\d.]+) ms")

    def run_vocable(self, engine, inp: BenchInput) -> GroupResult:
        res = GroupResult(runs_ms={k: [] for k, _ in self.stages})
        walls = []
        for i in range(1 + inp.repeats):
            with engine_perf_lines() as lines:
                t0 = time.perf_counter()
                voice = engine.embed_voice(inp.clip, SAMPLE_RATE)
                wall = 1e3 * (time.perf_counter() - t0)
            spk_ms, codes_ms = perf_value(lines, self._PERF)
            if i == 0:   # warm-up
                res.outputs = {"speaker_embedding": voice.speaker_embedding, "reference_codes": voice.codes}
                continue
            res.runs_ms["speaker_embedding"].append(spk_ms)
            res.runs_ms["reference_codes"].append(codes_ms)
            walls.append(wall)
        res.extra["embed_voice_wall_ms"] = round(median(walls), 2)
        return res

    def agreement(self, ours, theirs) -> dict[str, dict]:
        return {"speaker_embedding": embedding_agreement(ours["speaker_embedding"], theirs["speaker_embedding"]),
                "reference_codes": codes_agreement(ours["reference_codes"], theirs["reference_codes"])}


@dataclass
class SynthesisCall:
    """One `Engine.synthesize` call as the bench saw it."""
    result: object                 # the SynthesisResult: codes, audio, mode, reached_eos, ...
    lines: list[str]               # the engine's [Perf] lines of this call
    wall_ms: float                 # from the call to the whole result
    first_chunk_ms: float | None   # from the call to the first audio chunk in this thread (a stream)
    chunks: int                    # audio chunks the stream yielded


@dataclass
class TypeRuns:
    """The synthesis calls of one weight type: a warm-up, then `repeats` timed calls."""
    info: dict                                                  # model file, load time, mode ...
    calls: list[SynthesisCall] = field(default_factory=list)    # [0] is the warm-up
    error: str | None = None


def synthesis_runs(engine, inp: BenchInput) -> dict[str, TypeRuns]:
    """`Engine.synthesize` of the generation text for `inp.frames` frames (x-vector mode with the
    clip's voice, greedy) for each weight type: 1 warm-up + `repeats` calls each. Run once and
    shared by the generation and synthesis groups (one call gives both groups' [Perf] lines):
    kept in inp.shared, with the speaker embedding and the engine's codes saved for the
    reference process."""
    if "synthesis_runs" in inp.shared:
        return inp.shared["synthesis_runs"]
    from ..engine import X_VECTOR, Engine

    voice = engine.embed_voice(inp.clip, SAMPLE_RATE)   # no transcript: x-vector mode
    speaker = np.asarray(voice.speaker_embedding, dtype=np.float32)
    inp.shared["speaker_embedding"] = speaker
    inp.shared["speaker_path"] = temp_file(inp, "speaker", ".npy")
    np.save(inp.shared["speaker_path"], speaker)
    runs: dict[str, TypeRuns] = {}
    for wt in list(inp.models) or [inp.main_type]:
        model = inp.models.get(wt)
        own = model is not None and wt != inp.main_type
        tr = runs[wt] = TypeRuns({"gguf": str(model.gguf) if model else None,
                                  "gguf_bytes": model.gguf_bytes if model else None,
                                  "convert_s": model.convert_s if model else None})
        try:
            say(f"engine: synthesis, {wt}, {inp.frames} frames, 1 warm-up + {inp.repeats} run(s)")
            if own:
                with engine_perf_lines():
                    t0 = time.perf_counter()
                    eng = Engine(model.gguf, threads=inp.threads, device=inp.device)
                    tr.info["load_s"] = round(time.perf_counter() - t0, 3)
            else:
                eng = engine
            try:
                for _ in range(1 + inp.repeats):
                    tr.calls.append(timed_synthesis(eng, voice, inp.frames))
            finally:
                if own:
                    eng.close()
            first = tr.calls[0].result
            tr.info.update(frames=int(first.codes.shape[0]), frames_requested=inp.frames,
                           reached_eos=bool(first.reached_eos), mode=first.mode, mode_reason=first.mode_reason)
            if any(not np.array_equal(c.result.codes, first.codes) for c in tr.calls[1:]):
                tr.info["codes_vary_between_runs"] = True
            if first.mode != X_VECTOR:
                raise VocableError(f"the engine ran {first.mode} mode, not {X_VECTOR}")
        except VocableError as e:
            tr.error = str(e)
    codes = {wt: tr.calls[0].result.codes for wt, tr in runs.items() if tr.calls}
    if codes:   # for the reference's decoder (the waveform agreement)
        inp.shared["codes_path"] = temp_file(inp, "codes", ".npz")
        np.savez(inp.shared["codes_path"], **{wt: np.asarray(c, dtype=np.int32) for wt, c in codes.items()})
    inp.shared["synthesis_runs"] = runs
    return runs


def timed_synthesis(eng, voice, frames: int) -> SynthesisCall:
    """One greedy synthesis, timed: the stream is consumed chunk by chunk, as a player would. The
    engine's cached prompts are dropped first, so every call times a new prompt's prefill."""
    eng.forget_prompts()
    with engine_perf_lines() as lines:
        t0 = time.perf_counter()
        first, chunks = None, 0
        with eng.synthesize(GEN_TEXT, voice, GEN_LANGUAGE, greedy=True, max_frames=frames) as stream:
            for _ in stream:
                if first is None:
                    first = 1e3 * (time.perf_counter() - t0)
                chunks += 1
            result = stream.result()
        wall = 1e3 * (time.perf_counter() - t0)
    return SynthesisCall(result, list(lines), wall, first, chunks)


def synthesis_reference_args(inp: BenchInput) -> list[str]:
    """The reference process's arguments, one set for both groups that read it (so it runs once)."""
    args = ["--frames", str(inp.frames), "--text", GEN_TEXT, "--language", GEN_LANGUAGE]
    for flag, key in (("--speaker-embedding", "speaker_path"), ("--decode-codes", "codes_path")):
        path = inp.shared.get(key)
        if path is not None and Path(path).is_file():
            args += [flag, str(path)]
    return args


class PerTypeStages(StageGroup):
    """Figures of the shared synthesis runs (synthesis_runs), per weight type, against the shared
    reference run: subclasses read theirs from each type's calls (`figures`)."""
    reference_script = SYNTHESIS_SCRIPT

    def __init__(self) -> None:
        self.frames = DEFAULT_FRAMES
        self.types: list[str] = []

    def run_vocable(self, engine, inp: BenchInput) -> GroupResult:
        self.frames = inp.frames
        self.types = list(inp.models) or [inp.main_type]
        res = GroupResult()
        if "synthesis_runs" in inp.shared:
            say(f"engine: {self.name} stages from the same runs")
        runs = synthesis_runs(engine, inp)
        errors = []
        for wt, tr in runs.items():
            info = res.extra[wt] = self.type_info(tr)
            try:
                if tr.error:
                    raise VocableError(tr.error)
                self.figures(wt, tr, res, info)
            except VocableError as e:
                info["error"] = str(e)
                errors.append(f"{wt}: {e}")
        if errors:
            res.error = "; ".join(errors)
        return res

    def type_info(self, tr: TypeRuns) -> dict:
        """The start of a weight type's entry in the group's extra."""
        return {}

    def figures(self, wt: str, tr: TypeRuns, res: GroupResult, info: dict) -> None:
        """Puts the type's runs (res.runs_ms), outputs and info from its calls; VocableError
        when they lack something."""
        raise NotImplementedError

    def reference_args(self, inp: BenchInput) -> list[str]:
        return synthesis_reference_args(inp)


class GenerationStages(PerTypeStages):
    """`Engine.synthesize` (x-vector, greedy, a fixed frame count) for each weight type, against
    the reference's fp32 `generate_voice_clone` with the same speaker embedding: the talker and
    code predictor."""
    name = "generation"
    agreement_title = "greedy generation codes vs the reference (near-ties may flip on random weights)"
    _PROMPT = re.compile(r"\[Perf\] prompt build: ([\d.]+) ms \((\d+) positions\), prefill: ([\d.]+) ms "
                         r"\((\d+) positions from the cache\), time to first frame: ([\d.]+) ms")
    _FRAMES = re.compile(r"\[Perf\] (\d+) frames \((?:EOS|frame cap)\): talker ([\d.]+) ms/frame, "
                         r"code predictor ([\d.]+) ms/frame, total ([\d.]+) ms")
    # (key suffix, label, reference key): per weight type; "total" is the per-run sum of the first two
    ROWS = [("talker", "talker ms/frame", "talker_ms_per_frame"),
            ("code_predictor", "code predictor ms/frame", "code_predictor_ms_per_frame"),
            ("total", "talker + code predictor ms/frame", "total_ms_per_frame"),
            ("prefill", "prefill ms", "prefill_ms"),
            ("first_frame", "time to first frame ms", None)]

    def run_vocable(self, engine, inp: BenchInput) -> GroupResult:
        res = super().run_vocable(engine, inp)
        res.outputs["speaker_embedding"] = inp.shared["speaker_embedding"]
        return res

    def type_info(self, tr: TypeRuns) -> dict:
        return dict(tr.info)   # the model and the run: file, load time, frames, mode ...

    def figures(self, wt: str, tr: TypeRuns, res: GroupResult, info: dict) -> None:
        runs = {k: [] for k, _, _ in self.ROWS}
        for i, call in enumerate(tr.calls):
            _, positions, prefill, cached, first = perf_value(call.lines, self._PROMPT)
            _, talker, predictor, _ = perf_value(call.lines, self._FRAMES)
            if i == 0:   # warm-up: its codes are the output (greedy: every run gives the same)
                res.outputs[f"{wt}:codes"] = call.result.codes
                info["prompt_positions"] = int(positions)
                continue
            info["prompt_positions_cached"] = int(cached)   # 0: timed_synthesis drops the cached prompts
            for key, v in (("talker", talker), ("code_predictor", predictor), ("total", talker + predictor),
                           ("prefill", prefill), ("first_frame", first)):
                runs[key].append(v)
        for key, v in runs.items():
            res.runs_ms[f"{wt}:{key}"] = v
        info["synthesize_wall_ms"] = round_ms(median([c.wall_ms for c in tr.calls[1:]]))
        total = median(runs["total"])
        info["real_time_factor"] = round(total / FRAME_MS, 3) if total else None   # generation only

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
                    label = f"prefill ms ({info['prompt_positions']} positions"
                    cached = info.get("prompt_positions_cached")
                    label += f", {cached} from the cache)" if cached else ")"
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

    def agreement(self, ours, theirs) -> dict[str, dict]:
        out: dict[str, dict] = {}
        if "speaker_embedding" in ours and "speaker_embedding" in theirs:   # both sides were given the same one
            out["speaker_embedding"] = embedding_agreement(ours["speaker_embedding"], theirs["speaker_embedding"])
        ref = theirs.get("codes")
        for wt in self.types:
            if f"{wt}:codes" in ours and ref is not None:
                out[wt] = codes_agreement(ours[f"{wt}:codes"], ref)
        return out


class SynthesisStages(PerTypeStages):
    """Audio out, from the same `Engine.synthesize` calls as the generation stages (streamed,
    decoded while generating), for each weight type: codec decode ms per second of audio, time
    to first audio and the whole synthesis' wall time per second of audio (the real-time factor
    x 1000), from the engine's [Perf] lines. The reference (the same process as the generation
    stages) decodes all codes after generate and does not stream: its first audio is the end of
    the whole call. Agreement: the reference's decoder on the engine's codes of each weight
    type against the engine's audio."""
    name = "synthesis"
    agreement_title = "audio: the reference's decoder on the engine's codes vs the engine's audio"
    _DECODE = re.compile(r"\[Perf\] codec decode: ([\d.]+) ms per second of audio \((\d+) frames in (\d+) chunks\)")
    _FIRST_AUDIO = re.compile(r"\[Perf\] time to first audio: ([\d.]+) ms")
    _SYNTHESIS = re.compile(r"\[Perf\] synthesis: ([\d.]+) s of audio in ([\d.]+) s, real-time factor ([\d.]+)")
    ROWS = [("decode", "codec decode ms per s of audio", "decode_ms_per_audio_s"),
            ("first_audio", "time to first audio ms", "first_audio_ms"),
            ("synthesis", "whole synthesis ms per s of audio (RTF x 1000)", "synthesis_ms_per_audio_s")]

    def figures(self, wt: str, tr: TypeRuns, res: GroupResult, info: dict) -> None:
        first = tr.calls[0].result
        audio = np.asarray(first.audio, dtype=np.float32)
        if not audio.size:
            raise VocableError("the engine returned no audio")
        runs = {k: [] for k, _, _ in self.ROWS}
        for i, call in enumerate(tr.calls):
            decode, frames, chunks = perf_value(call.lines, self._DECODE)
            first_audio, = perf_value(call.lines, self._FIRST_AUDIO)
            audio_s, _, rtf = perf_value(call.lines, self._SYNTHESIS)
            if i == 0:   # warm-up: its audio is the output (greedy: every run gives the same)
                res.outputs[f"{wt}:audio"] = audio
                info.update(frames=int(frames), engine_chunks=int(chunks), audio_s=audio_s, samples=int(audio.size),
                            samples_expected=int(first.codes.shape[0]) * SAMPLES_PER_FRAME)
                continue
            runs["decode"].append(decode)
            runs["first_audio"].append(first_audio)
            runs["synthesis"].append(1e3 * rtf)
        for key, v in runs.items():
            res.runs_ms[f"{wt}:{key}"] = v
        timed = tr.calls[1:]
        info["stream_chunks"] = timed[0].chunks if timed else None
        firsts = [c.first_chunk_ms for c in timed if c.first_chunk_ms is not None]
        info["first_chunk_wall_ms"] = round_ms(median(firsts))   # in this thread, through the stream
        wall = median([c.wall_ms for c in timed])
        info["synthesize_wall_ms"] = round_ms(wall)
        rtf = median(runs["synthesis"])
        info["real_time_factor"] = round(rtf / 1e3, 3) if rtf else None
        # the same from this thread: tokenizing the text and the stream's queue included
        info["wall_real_time_factor"] = round(wall / 1e3 / audio_s, 3) if wall and audio_s else None

    def rows(self, o: GroupResult, t: GroupResult | None) -> list[dict]:
        out = []
        audio_s = self.frames * FRAME_MS / 1e3
        for wt in self.types:
            info = o.extra.get(wt, {})
            for key, label, ref_key in self.ROWS:
                row = stage_row(self.name, f"{wt}:{key}", label, o, t, ref_key=ref_key,
                                section=f"synthesis {wt} ({self.frames} frames = {audio_s:g} s of audio, x-vector, "
                                        f"greedy, streamed)",
                                weight_type=wt, error=info.get("error"))
                if key == "synthesis":
                    row["vocable_rtf"] = _rtf(row["vocable_ms"])
                    row["reference_rtf"] = _rtf(row["reference_ms"])
                row["targets"] = self.targets(wt, key, row)
                out.append(row)
        return out

    @staticmethod
    def targets(wt: str, key: str, row: dict) -> list[dict]:
        """The issue's targets for a synthesis row, each with met: True/False/None."""
        v, speedup = row["vocable_ms"], row["speedup"]
        if key == "decode":
            return [{"what": "speedup_at_least", "value": TARGET_DECODE_SPEEDUP,
                     "met": None if speedup is None else speedup >= TARGET_DECODE_SPEEDUP}]
        if key == "first_audio":
            return [{"what": "ms_below", "value": TARGET_FIRST_AUDIO_MS,
                     "met": None if v is None else v < TARGET_FIRST_AUDIO_MS}]
        if key == "synthesis" and wt in TARGET_RTF:
            return [{"what": "rtf_below", "value": TARGET_RTF[wt],
                     "met": None if v is None else v / 1e3 < TARGET_RTF[wt]}]
        return []

    def agreement(self, ours, theirs) -> dict[str, dict]:
        out: dict[str, dict] = {}
        for wt in self.types:
            a, b = ours.get(f"{wt}:audio"), theirs.get(f"decoded_{wt}")
            if a is not None and b is not None:   # both decoders on the same (the engine's) codes
                out[wt] = waveform_agreement(a, b)
        return out


def _rtf(ms_per_audio_s: float | None) -> float | None:
    return None if ms_per_audio_s is None else round(ms_per_audio_s / 1e3, 3)


STAGE_GROUPS: list[StageGroup] = [VoiceStages(), GenerationStages(), SynthesisStages()]
