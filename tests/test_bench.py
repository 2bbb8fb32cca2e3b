"""`vocable bench` plumbing, on small models: the random-model builder (safetensors writer, the real
text tokenizer, conversion cache), the table and JSON report, the reference subprocess and the
agreement check. The full-size benchmark itself is not run here."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import fixture_dir
from vocable.bench import agreement as bench_agreement, groups as bench_groups, measure as bench_measure
from vocable.bench import model as bench_model, reference as bench_reference, report as bench_report, runner as bench
from vocable.errors import VocableError
from vocable.library.voice import Voice


def bench_args(tmp_path, **kw):
    args = dict(threads=1, ref_seconds=2.0, repeats=2, cache_dir=str(tmp_path / "cache"), no_reference=True,
                model=None, frames=6, types="f32,q8_0", no_long_text=True)
    args.update(kw)
    return argparse.Namespace(**args)


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


# ---- the random model builder ---------------------------------------------------------------

def test_bf16_rounds_to_nearest_even():
    x = np.array([1.0, -2.5, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, 1.0 + 2 ** -9, 3.14159], dtype=np.float32)
    bits = bench_model.f32_to_bf16_bits(x)
    back = (bits.astype(np.uint32) << 16).view(np.float32)
    # 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even mantissa (1.0); 1 + 3*2^-8 rounds up to 1 + 2^-6
    assert back.tolist()[:5] == [1.0, -2.5, 1.0, 1.0 + 2 ** -6, 1.0]
    assert abs(back[5] - 3.14159) < 0.01


def test_real_spec_has_the_published_sizes():
    spec = bench_model.real_0_6b_spec()
    main = sum(int(np.prod(s)) for _, s in spec.main_params)
    speech = sum(int(np.prod(s)) for _, s in spec.speech_params)
    assert (main, speech) == (914_643_008, 170_557_441)
    assert spec.speech_config["encoder_config"]["frame_rate"] == 12.5
    # every tensor is one the converter knows (or knowingly skips)
    from vocable.engine.convert import engine_name
    for name, _ in spec.main_params + spec.speech_params:
        engine_name(name)


def test_bench_model_speaks_through_the_real_qwen_tokenizer(tmp_path):
    spec = bench_model.real_0_6b_spec()
    files = bench_model.read_tokenizer_files(spec.tokenizer_dir)
    # the shipped vocabulary and merges are Qwen's bytes (checksums of data/qwen-tokenizer/SOURCE.md)
    assert hashlib.sha256(files["vocab.json"]).hexdigest() == \
        "ca10d7e9fb3ed18575dd1e277a2579c16d108e32f27439684afa0e10b1440910"
    assert hashlib.sha256(files["merges.txt"]).hexdigest() == \
        "b8e04af9c950e393054010dcef499c3f005e803e9b2da1a09b96a26c33266eb1"
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "config.json").write_text(json.dumps(spec.config))
    from vocable.engine.text import TextTokenizer
    # from_folder refuses a config whose special ids differ from the tokenizer's
    tok = TextTokenizer.from_folder(tmp_path)
    assert tok.vocab_size == 151674
    prompt = tok.target_prompt("The dog was a bass.")
    assert prompt.role == [151644, 77091, 198] and list(prompt.ids[-5:]) == [151645, 198, 151644, 77091, 198]
    assert len(prompt.text) == 6   # "The", " dog", " was", " a", " bass", ".": words, not bytes


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    """The tiny fixture's layout, rebuilt with random values by the benchmark's builder."""
    cache = tmp_path_factory.mktemp("bench-cache")
    spec = bench_model.spec_from_folder(fixture_dir("0.6b") / "model", seed=3, name="tiny-random")
    return spec, cache, bench_model.ensure_bench_model(spec, cache)


def test_builder_writes_a_loadable_checkpoint(small_model):
    from safetensors import safe_open

    spec, cache, model = small_model
    assert model.build_s is not None and model.convert_s is not None and model.gguf.is_file()
    for sub, params, dtype in (("", spec.main_params, "BF16"), ("speech_tokenizer", spec.speech_params, "F32")):
        path = model.hf_dir / sub / "model.safetensors"
        with safe_open(str(path), framework="numpy") as f:
            assert sorted(f.keys()) == sorted(n for n, _ in params)
        header = json.loads(path.read_bytes()[8:8 + int.from_bytes(path.read_bytes()[:8], "little")])
        assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {dtype}
        for name, shape in params:
            assert tuple(header[name]["shape"]) == shape
    from vocable.engine.safetensors_reader import open_checkpoint
    main = open_checkpoint(model.hf_dir)
    head = main["talker.codec_head.weight"].f32()
    assert np.all(head[2150] == 0) and np.abs(head[2149]).max() > 0
    speech = open_checkpoint(model.hf_dir / "speech_tokenizer")
    usage = [t.f32() for n, t in speech.items() if n.endswith("cluster_usage")]
    assert all(0.5 <= u.min() and u.max() <= 1.5 for u in usage)
    assert all(float(t.f32()[0]) == 1.0 for n, t in speech.items() if n.endswith("initialized"))
    for name in ("model.safetensors", "vocab.json", "merges.txt", "tokenizer_config.json", "generation_config.json",
                 "speech_tokenizer/preprocessor_config.json"):
        assert (model.hf_dir / name).is_file()


def test_builder_is_deterministic_and_cached(small_model, tmp_path):
    spec, cache, model = small_model
    again = bench_model.ensure_bench_model(spec, cache)
    assert again.build_s is None and again.convert_s is None
    other = bench_model.build_hf_folder(spec, tmp_path / "again")
    assert other["key"] == spec.key()
    for rel in ("model.safetensors", "speech_tokenizer/model.safetensors"):
        assert (tmp_path / "again" / rel).read_bytes() == (model.hf_dir / rel).read_bytes()


def test_chunks_do_not_change_values(monkeypatch):
    whole = np.concatenate(list(bench_model.random_chunks("a.weight", (64, 48), 1, zero_rows=[5])))
    for chunk, n_parts in ((100, 32), (40, 77)):   # whole rows (2 of 48) / rows split across chunks
        monkeypatch.setattr(bench_model, "CHUNK_ELEMENTS", chunk)
        parts = list(bench_model.random_chunks("a.weight", (64, 48), 1, zero_rows=[5]))
        assert len(parts) == n_parts and np.array_equal(np.concatenate(parts), whole)
    assert np.all(whole.reshape(64, 48)[5] == 0) and abs(whole.std() * np.sqrt(48) - 1) < 0.1


# ---- run_bench --------------------------------------------------------------------------------

def audio_of(codes):
    """The fakes' "decoder": a waveform that depends on the codes (both fakes use it)."""
    rate = 1 + int(np.asarray(codes).sum()) % 7
    return (0.5 * np.sin(np.arange(len(codes) * 1920) * rate * 1e-3)).astype(np.float32)


AUDIO_OF = textwrap.dedent('''
    def audio_of(codes):
        rate = 1 + int(np.asarray(codes).sum()) % 7
        return (0.5 * np.sin(np.arange(len(codes) * 1920) * rate * 1e-3)).astype(np.float32)
''')


class FakeStream:
    """Stands in for the engine's synthesis stream: float32 chunks, then the whole result."""
    def __init__(self, result, n_chunks):
        self._result, self._n = result, n_chunks

    def __iter__(self):
        yield from np.array_split(self._result.audio, self._n)

    def result(self):
        return self._result

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


class FakeEngine:
    """Stands in for vocable.Engine: logs the engine's [Perf] lines, returns fixed outputs."""
    embedding = np.linspace(-1, 1, 16, dtype=np.float32)
    codes = (np.arange(4 * 16, dtype=np.int32).reshape(4, 16) * 7) % 2048

    def __init__(self, path, threads=None, device="cpu"):
        self.path = path
        self.threads = threads
        self.device, self.device_fallback = "cpu", "" if device == "cpu" else f"no device {device}"
        self.calls = 0
        self.forgot = False
        self.closed = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def forget_prompts(self):
        self.forgot = True

    def close(self):
        self.closed = True

    def embed_voice(self, samples, rate):
        import logging
        self.calls += 1
        assert rate == 24000 and samples.dtype == np.float32
        logging.getLogger("vocable.engine").info(
            "[Perf] speaker embedding: %.1f ms, reference codes: %.1f ms (2.00 s clip, 4 frames)",
            10.0 * self.calls, 20.0 * self.calls)
        return Voice(self.embedding, self.codes)

    # per weight type (from the file name): talker, code predictor ms/frame of the first call;
    # codec decode ms per s of audio, time to first audio ms (+ call number), real-time factor
    PERF = {"f32": (40.0, 80.0), "q8_0": (10.0, 20.0), "q4_k": (5.0, 10.0)}
    AUDIO_PERF = {"f32": (600.0, 400.0, 1.8), "q8_0": (200.0, 150.0, 0.6), "q4_k": (150.0, 100.0, 1.2)}
    CHUNKS = 3

    def synthesize(self, text, voice, language="auto", ref_text=None, *, greedy=False, max_frames=None, **kw):
        import logging
        from vocable.engine import X_VECTOR
        assert greedy and voice.ref_text is None and language == "English" and max_frames
        self.calls += 1
        wt = next((t for t in ("q8_0", "q4_k") if t in str(self.path)), "f32")
        talker, predictor = self.PERF[wt]
        log = logging.getLogger("vocable.engine")
        log.info("[Perf] prompt build: 0.1 ms (12 positions), prefill: %.1f ms (%d positions from the cache), "
                 "time to first frame: %.1f ms", 5.0, 0 if self.forgot else 12, 7.0 + self.calls)
        self.forgot = False
        log.info("[Perf] %d frames (frame cap): talker %.1f ms/frame, code predictor %.1f ms/frame, total %.1f ms",
                 max_frames, talker + self.calls, predictor, 100.0)
        decode, first, rtf = self.AUDIO_PERF[wt]
        seconds = max_frames * 0.08
        log.info("[Perf] codec decode: %.1f ms per second of audio (%d frames in %d chunks)", decode, max_frames,
                 self.CHUNKS)
        log.info("[Perf] time to first audio: %.1f ms", first + self.calls)
        log.info("[Perf] synthesis: %.2f s of audio in %.2f s, real-time factor %.3f", seconds, seconds * rtf, rtf)
        codes = (np.arange(max_frames * 16, dtype=np.int32).reshape(max_frames, 16) * 5) % 2048
        if wt != "f32":
            codes[-1] += 1 if wt == "q8_0" else 2
        result = SimpleNamespace(codes=codes, audio=audio_of(codes), mode=X_VECTOR, mode_reason="no transcript",
                                 reached_eos=False, seed=0)
        return FakeStream(result, self.CHUNKS)


FAKE_SYNTHESIS_REFERENCE = "import argparse, json, pathlib, numpy as np\n" + AUDIO_OF + textwrap.dedent("""
    ap = argparse.ArgumentParser()
    for a in ("--model-dir", "--clip", "--outputs", "--threads", "--repeats", "--frames", "--text", "--language",
              "--speaker-embedding", "--decode-codes"):
        ap.add_argument(a)
    a = ap.parse_args()
    with open(pathlib.Path(__file__).with_suffix(".calls"), "a") as f:
        f.write("call\\n")
    n, r = int(a.frames), int(a.repeats)
    codes = (np.arange(n * 16, dtype=np.int32).reshape(n, 16) * 5) % 2048
    codes[2, 3] += 1
    out = dict(codes=codes, audio=audio_of(codes), speaker_embedding=np.load(a.speaker_embedding))
    with np.load(a.decode_codes) as given:
        for name in given.files:
            wav = audio_of(given[name])
            if name == "q8_0":   # another decoder: a small difference
                wav = wav + 0.01 * np.cos(np.arange(len(wav)) * 0.02).astype(np.float32)
            out["decoded_" + name] = wav
    np.savez(a.outputs, **out)
    print(json.dumps({"package": "fake-qwen-tts", "load_s": 0.2, "frames": n, "frames_requested": n,
                      "reached_eos": False, "prefill_tokens": 12, "codec_eos_row_zero": True, "language": a.language,
                      "audio_s": n * 0.08, "decoded": {k: {} for k in out if k.startswith("decoded_")},
                      "runs_ms": {"talker_ms_per_frame": [90.0] * r, "code_predictor_ms_per_frame": [240.0] * r,
                                  "prefill_ms": [50.0] * r, "prompt_build_ms": [1.0] * r,
                                  "decode_ms_per_audio_s": [490.0] * r, "first_audio_ms": [20000.0] * r,
                                  "synthesis_ms_per_audio_s": [4700.0] * r},
                      "versions": {"torch": "0"}}))
""")


FAKE_REFERENCE = textwrap.dedent("""
    import argparse, json, numpy as np
    ap = argparse.ArgumentParser()
    for a in ("--model-dir", "--clip", "--outputs", "--threads", "--repeats"):
        ap.add_argument(a)
    a = ap.parse_args()
    clip = np.load(a.clip)
    codes = (np.arange(64, dtype=np.int32).reshape(4, 16) * 7) % 2048
    codes[3, 5] += 1
    np.savez(a.outputs, speaker_embedding=np.linspace(-1, 1, 16, dtype=np.float32), reference_codes=codes)
    print("chatter")
    print(json.dumps({"package": "fake-qwen-tts", "load_s": 0.1, "clip_seconds": len(clip) / 24000,
                      "runs_ms": {"speaker_embedding": [100.0] * int(a.repeats),
                                  "reference_codes": [400.0] * int(a.repeats)},
                      "versions": {"torch": "0"}}))
""")


def test_run_bench_report_with_a_fake_reference(small_model, tmp_path, monkeypatch, capsys):
    spec, cache, model = small_model
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "reference_voice_timing.py").write_text(FAKE_REFERENCE)
    (tools / "reference_synthesis_timing.py").write_text(FAKE_SYNTHESIS_REFERENCE)
    monkeypatch.setattr(bench_reference, "TOOLS_DIR", tools)
    monkeypatch.setattr(bench_reference, "find_reference_python", lambda: (sys.executable, ""))  # no torch needed
    monkeypatch.setattr("vocable.engine.Engine", FakeEngine)
    rc = bench.run_bench(bench_args(tmp_path, no_reference=False, model=str(model.hf_dir), repeats=3,
                                    types="f32,q8_0,q4_k"))
    out = capsys.readouterr().out
    assert rc == 0, out
    rep = last_json(out)
    stages = {s["key"]: s for s in rep["stages"]}
    # warm-up (call 1) dropped; median of calls 2..4
    assert stages["speaker_embedding"]["vocable_runs_ms"] == [20.0, 30.0, 40.0]
    assert stages["speaker_embedding"]["vocable_ms"] == 30.0 and stages["reference_codes"]["vocable_ms"] == 60.0
    assert stages["speaker_embedding"]["speedup"] == pytest.approx(100 / 30, rel=1e-3)
    assert stages["reference_codes"]["reference_ms"] == 400.0
    assert rep["reference"]["status"] == "ok" and rep["threads"] == 1 and rep["ref_seconds"] == 2.0
    ag = rep["agreement"]["voice"]
    assert ag["speaker_embedding"]["cosine"] == pytest.approx(1.0)
    codes = ag["reference_codes"]
    assert codes["identical"] == pytest.approx(63 / 64, abs=1e-4) and codes["frames_identical"] == 0.75
    assert "speaker embedding (mel + ECAPA)" in out and "6.67x" in out and "98.4% identical" in out

    # generation: the f32 engine (calls 1-4: voice stages, 5: the generation's voice, 6: warm-up) and a q8_0 one
    assert rep["frames"] == 6
    assert stages["f32:talker"]["vocable_runs_ms"] == [47.0, 48.0, 49.0]
    assert stages["q8_0:talker"]["vocable_runs_ms"] == [12.0, 13.0, 14.0]  # its own engine: calls 2..4
    assert stages["q8_0:total"]["vocable_ms"] == 33.0 and stages["q8_0:total"]["reference_ms"] == 330.0
    assert stages["q8_0:total"]["speedup"] == 10.0 and stages["f32:total"]["speedup"] == pytest.approx(330 / 128, abs=1e-3)
    assert stages["q8_0:prefill"]["reference_ms"] == 50.0 and stages["q8_0:first_frame"]["reference_ms"] is None
    assert stages["q8_0:prefill"]["label"] == "prefill ms (12 positions)"
    assert stages["q8_0:total"]["targets"] == [{"what": "ms_per_frame_below", "value": 90.0, "met": True},
                                               {"what": "speedup_at_least", "value": 4.0, "met": True}]
    assert stages["f32:total"]["targets"] == [{"what": "speedup_at_least", "value": 4.0, "met": False}]
    gen = rep["vocable_extra"]["generation"]
    assert gen["f32"]["frames"] == 6 and gen["f32"]["reached_eos"] is False and gen["f32"]["mode"] == "x-vector"
    assert gen["q8_0"]["gguf"].endswith("q8_0.gguf") and "load_s" in gen["q8_0"]
    assert rep["reference_extra"]["generation"]["prefill_tokens"] == 12
    ag = rep["agreement"]["generation"]
    assert ag["speaker_embedding"]["max_abs_diff"] == 0 and ag["f32"]["identical"] == pytest.approx(1 - 1 / 96, abs=1e-4)
    assert ag["f32"]["first_different_frame"] == 2 and ag["q8_0"]["frames_identical"] == pytest.approx(4 / 6, abs=1e-4)
    assert "< 90 ms: yes, >= 4x: yes" in out and ">= 4x: NO" in out and "reached EOS: none" in out
    assert "f32 99.0% identical" in out

    # synthesis: the same engine calls (no more of them: see the talker runs above), the same reference run
    assert (tools / "reference_synthesis_timing.calls").read_text() == "call\n"
    assert list(rep["reference"]["load_s"]) == ["voice", "generation"]
    assert rep["reference"]["same_run"] == {"synthesis": "generation"} and "0.2 s (generation, synthesis)" in out
    assert stages["f32:decode"]["vocable_runs_ms"] == [600.0] * 3 and stages["f32:decode"]["reference_ms"] == 490.0
    assert stages["f32:decode"]["speedup"] == pytest.approx(490 / 600, abs=1e-3)
    assert stages["f32:decode"]["targets"] == [{"what": "speedup_at_least", "value": 1.0, "met": False}]
    assert stages["q8_0:decode"]["targets"] == [{"what": "speedup_at_least", "value": 1.0, "met": True}]
    assert stages["f32:first_audio"]["vocable_runs_ms"] == [407.0, 408.0, 409.0]   # calls 7..9, as the talker's
    assert stages["q8_0:first_audio"]["vocable_ms"] == 153.0 and stages["q8_0:first_audio"]["reference_ms"] == 20000.0
    assert stages["q8_0:first_audio"]["targets"] == [{"what": "ms_below", "value": 300.0, "met": True}]
    assert stages["f32:first_audio"]["targets"] == [{"what": "ms_below", "value": 300.0, "met": False}]
    assert stages["q4_k:synthesis"]["vocable_ms"] == 1200.0 and stages["q4_k:synthesis"]["vocable_rtf"] == 1.2
    assert stages["q4_k:synthesis"]["reference_rtf"] == 4.7
    assert stages["q4_k:synthesis"]["targets"] == [{"what": "rtf_below", "value": 1.0, "met": False}]
    assert stages["q8_0:synthesis"]["targets"] == [] and stages["q8_0:synthesis"]["vocable_rtf"] == 0.6
    syn = rep["vocable_extra"]["synthesis"]
    assert syn["f32"]["stream_chunks"] == 3 and syn["f32"]["engine_chunks"] == 3 and syn["f32"]["frames"] == 6
    assert syn["q4_k"]["samples"] == syn["q4_k"]["samples_expected"] == 6 * 1920
    assert syn["q4_k"]["first_chunk_wall_ms"] is not None and syn["q4_k"]["real_time_factor"] == 1.2
    ag = rep["agreement"]["synthesis"]
    assert ag["f32"]["cosine"] == 1.0 and ag["f32"]["residual_db"] is None and ag["f32"]["samples"] == [11520, 11520]
    assert 0.99 < ag["q8_0"]["cosine"] < 1.0 and -40 < ag["q8_0"]["residual_db"] < -20
    assert "synthesis q4_k (6 frames = 0.48 s of audio, x-vector, greedy, streamed):" in out
    assert "RTF < 1: NO" in out and "< 300 ms: NO" in out and ">= 1x: NO" in out
    assert "f32 waveform cosine 1.000000 (exact" in out
    missed = rep["missed_targets"]
    assert "synthesis q4_k, whole synthesis ms per s of audio (RTF x 1000): real-time factor 1.200, target < 1: 20 % over" in missed
    assert "synthesis f32, time to first audio ms: 408.0 ms, target < 300 ms: 108.0 ms (36 %) over" in missed
    assert "synthesis f32, codec decode ms per s of audio: 0.82x the reference, target >= 1x" in missed
    assert "generation f32, talker + code predictor ms/frame: 2.58x the reference, target >= 4x" in missed
    assert len(missed) == 4 and "MISSED TARGETS (4):" in out
    assert not list((tmp_path / "cache" / "work").glob("speaker-*.npy"))
    assert not list((tmp_path / "cache" / "work").glob("codes-*.npz"))


class CodesOnlyEngine(FakeEngine):
    """An engine whose synthesis decodes nothing: codes, empty audio."""
    def synthesize(self, *a, **kw):
        result = super().synthesize(*a, **kw).result()
        result.audio = np.zeros(0, dtype=np.float32)
        return FakeStream(result, 1)


def test_run_bench_engine_without_audio(small_model, tmp_path, monkeypatch, capsys):
    """The synthesis rows fail with the reason; the generation rows still come out."""
    spec, cache, model = small_model
    monkeypatch.setattr("vocable.engine.Engine", CodesOnlyEngine)
    rc = bench.run_bench(bench_args(tmp_path, model=str(model.hf_dir), repeats=1, types="f32"))
    out = capsys.readouterr().out
    rep = last_json(out)
    assert rc == 1
    stages = {s["key"]: s for s in rep["stages"]}
    assert stages["f32:total"]["vocable_ms"] is not None and stages["f32:total"]["error"] is None
    assert "no audio" in stages["f32:decode"]["error"] and stages["f32:decode"]["vocable_ms"] is None
    assert stages["f32:first_audio"]["targets"] == [{"what": "ms_below", "value": 300.0, "met": None}]
    assert out.count("vocable failed") == 1
    assert "synthesis f32 (6 frames = 0.48 s of audio, x-vector, greedy, streamed): vocable failed: the engine " \
           "returned no audio" in out
    assert rep["missed_targets"] == [] and "MISSED" not in out


def test_synthesis_perf_lines():
    """The engine's audio [Perf] lines, as its C format strings print them."""
    g = bench_groups.SynthesisStages
    lines = ["[Perf] codec decode: %.1f ms per second of audio (%d frames in %d chunks)" % (1234.56, 50, 6),
             "[Perf] time to first audio: %.1f ms" % 187.25,
             "[Perf] synthesis: %.2f s of audio in %.2f s, real-time factor %.3f" % (4.0, 3.456, 0.864)]
    assert bench_measure.perf_value(lines, g._DECODE) == (1234.6, 50.0, 6.0)
    assert bench_measure.perf_value(lines, g._FIRST_AUDIO) == (187.2,)
    assert bench_measure.perf_value(lines, g._SYNTHESIS) == (4.0, 3.46, 0.864)


def test_targets_and_missed_targets():
    row = {"group": "synthesis", "weight_type": "q4_k", "label": "x", "vocable_ms": 950.0, "speedup": 5.0}
    assert bench_groups.SynthesisStages.targets("q4_k", "synthesis", row) == [{"what": "rtf_below", "value": 1.0, "met": True}]
    assert bench_groups.SynthesisStages.targets("q8_0", "synthesis", row) == []
    row["targets"] = [{"what": "rtf_below", "value": 1.0, "met": False}, {"what": "ms_below", "value": 300.0, "met": None}]
    row["vocable_ms"] = 1500.0
    assert bench_report.missed_targets([row]) == ["synthesis q4_k, x: real-time factor 1.500, target < 1: 50 % over"]
    assert bench_report.targets_text(row["targets"]) == "RTF < 1: NO, < 300 ms: ?"
    ours = np.sin(np.arange(1000) * 0.01)
    ag = bench_agreement.waveform_agreement(ours, np.concatenate([ours * 1.001, np.zeros(5)]))
    assert ag["samples"] == [1000, 1005] and ag["cosine"] == 1.0 and ag["residual_db"] == pytest.approx(-60, abs=0.1)


def test_run_bench_reference_unavailable(small_model, tmp_path, monkeypatch, capsys):
    spec, cache, model = small_model
    monkeypatch.setenv(bench_reference.REFERENCE_PYTHON_ENV, str(tmp_path / "no-python"))
    monkeypatch.setattr("vocable.engine.Engine", FakeEngine)
    rc = bench.run_bench(bench_args(tmp_path, no_reference=False, model=str(model.hf_dir), repeats=1))
    captured = capsys.readouterr()
    assert rc == 0
    rep = last_json(captured.out)
    assert rep["reference"]["status"] == "skipped" and "no-python" in rep["reference"]["reason"]
    assert "reference skipped" in captured.err and rep["stages"][0]["reference_ms"] is None


def test_run_bench_real_engine_on_a_small_model(small_model, tmp_path, capsys):
    """The engine itself, end to end (voice stages, generation, synthesis), on the small random model's .gguf."""
    spec, cache, model = small_model
    rc = bench.run_bench(bench_args(tmp_path, model=str(model.gguf), repeats=1))
    out = capsys.readouterr().out
    rep = last_json(out)
    assert rc == 0, out
    stages = {s["key"]: s for s in rep["stages"]}
    for key in ("speaker_embedding", "reference_codes", "voice_total", "as converted:first_frame",
                "as converted:decode", "as converted:first_audio", "as converted:synthesis"):
        assert stages[key]["vocable_ms"] > 0, key
    assert stages["as converted:prefill"]["vocable_ms"] > 0   # computed: the bench drops cached prompts
    assert stages["as converted:total"]["vocable_ms"] is not None
    gen = rep["vocable_extra"]["generation"]["as converted"]
    assert gen["frames"] == 6 and gen["reached_eos"] is False   # the EOS row of codec_head is zero
    assert gen["prompt_positions_cached"] == 0 and gen["prompt_positions"] > 0
    syn = rep["vocable_extra"]["synthesis"]["as converted"]
    assert syn["frames"] == 6 and syn["samples"] == syn["samples_expected"] == 6 * 1920
    assert syn["stream_chunks"] >= 1 and syn["first_chunk_wall_ms"] > 0
    assert stages["as converted:first_audio"]["vocable_ms"] <= syn["synthesize_wall_ms"]
    assert rep["reference"]["status"] == "skipped"


def test_run_bench_real_engine_weight_types(small_model, tmp_path, capsys):
    """An HF folder: converted per weight type (cached), every type's engine runs the full frame count."""
    spec, cache, model = small_model
    rc = bench.run_bench(bench_args(tmp_path, model=str(model.hf_dir), repeats=1, frames=4, types="q4_k,f32",
                                    no_long_text=False))
    out = capsys.readouterr().out
    rep = last_json(out)
    assert rc == 0, out
    gen = rep["vocable_extra"]["generation"]
    assert list(gen) == ["f32", "q4_k"]
    assert all(gen[t]["frames"] == 4 and not gen[t]["reached_eos"] for t in gen)
    assert gen["q4_k"]["convert_s"] is not None and gen["f32"].get("load_s") is None   # f32: the main engine
    assert [s["key"] for s in rep["stages"] if s.get("weight_type") == "q4_k"] == \
        ["q4_k:talker", "q4_k:code_predictor", "q4_k:total", "q4_k:prefill", "q4_k:first_frame",
         "q4_k:decode", "q4_k:first_audio", "q4_k:synthesis"]
    assert "generation q4_k (4 frames, x-vector, greedy):" in out and "< 60 ms: yes, >= 4x: ?" in out
    assert "synthesis q4_k (4 frames = 0.32 s of audio, x-vector, greedy, streamed):" in out
    syn = rep["vocable_extra"]["synthesis"]
    assert all(syn[t]["samples"] == 4 * 1920 for t in ("f32", "q4_k"))
    memory = rep["memory"]   # each type's whole synthesis in a process of its own
    assert list(memory) == ["f32", "q4_k"]
    assert all(memory[t]["frames"] == 4 and 20 * 2**20 < memory[t]["peak_rss_bytes"] < 2**31 for t in memory)
    assert "peak RSS of a whole synthesis (load + 4 frames, a process of its own): f32 " in out
    long_text = rep["long_text"]   # 10 segments one by one, then 4 at a time, on the quantized type
    assert list(long_text) == ["q4_k"]
    lt = long_text["q4_k"]
    assert lt["segments"] == 10 and lt["frames"] == 40 and lt["batch"] == 4 and lt["identical"] is True
    assert lt["one_by_one_audio_per_s"] > 0 and lt["batched_audio_per_s"] > 0 and lt["target_speedup"] == 2.0
    assert "long text q4_k, 10 segments x 4 frames (3.2 s of audio): one by one " in out
    assert "4 at a time" in out and "the same codes and audio" in out


def test_the_long_text_target_is_reported():
    from vocable.bench import batch as bench_batch
    runs = {"q4_k": {"segments": 10, "frames": 500, "batch": 4, "audio_s": 40.0, "one_by_one_s": 36.0,
                     "batched_s": 25.0, "one_by_one_audio_per_s": 1.111, "batched_audio_per_s": 1.6, "speedup": 1.44,
                     "identical": True, "target_speedup": 2.0, "met": False},
            "q8_0": {"segments": 10, "frames": 500, "batch": 4, "audio_s": 40.0, "one_by_one_s": 40.0,
                     "batched_s": 20.0, "one_by_one_audio_per_s": 1.0, "batched_audio_per_s": 2.0, "speedup": 2.0,
                     "identical": False}}
    assert bench_batch.missed(runs) == [
        "long text q4_k: 1.44x the audio per second one by one with 4 at a time, target >= 2x",
        "long text q8_0: the batch gave other codes or audio than one by one"]
    lines = bench_batch.describe(runs)
    assert "(1.44x, target >= 2x: MISSED), the same codes and audio" in lines[0]
    assert "DIFFERENT codes or audio" in lines[1]


def test_the_memory_target_is_reported_where_there_is_one():
    from vocable.bench import memory as bench_memory
    runs = {"q8_0": {"frames": 50, "peak_rss_bytes": 1.2e9, "target_bytes": 1.0e9, "met": False},
            "q4_k": {"frames": 50, "peak_rss_bytes": 0.9e9}, "f16": {"error": "no result within 1800 s"}}
    assert bench_memory.missed(runs) == ["memory q8_0: peak RSS 1.20 GB of a whole synthesis, target <= 1 GB"]
    line, = bench_memory.describe(runs, 50)
    assert "q8_0 1144 MiB (target <= 1 GB: MISSED), q4_k 858 MiB, f16 failed: no result within 1800 s" in line


def test_parse_types():
    from vocable.errors import VocableError
    assert bench.parse_types(None) == ["f32", "f16", "q8_0", "q4_k"]
    assert bench.parse_types("Q4_K, f32,q4_k") == ["f32", "q4_k"]
    with pytest.raises(VocableError, match="q5"):
        bench.parse_types("f32,q5")


def reference_run_input(small_model, tmp_path, **kw):
    """(Python with the official package, the small model, a bench input with a 2 s clip);
    skips the test where there is no such Python."""
    python, why = bench_reference.find_reference_python()
    if python is None:
        pytest.skip(why)
    spec, cache, model = small_model
    clip, _ = bench_measure.make_reference_clip(2.0)
    np.save(tmp_path / "clip.npy", clip)
    return python, model, bench_measure.BenchInput(clip, tmp_path / "clip.npy", tmp_path, threads=1, repeats=1, **kw)


@pytest.mark.reference
def test_reference_script_on_a_small_model(small_model, tmp_path):
    """tools/bench/reference_voice_timing.py against the real qwen-tts package."""
    python, model, inp = reference_run_input(small_model, tmp_path)
    clip = inp.clip
    res = bench_reference.run_reference(bench_groups.VoiceStages(), python, model.hf_dir, inp)
    assert res.error is None, res.error
    assert set(res.runs_ms) == {"speaker_embedding", "reference_codes"}
    cfg = json.loads((model.hf_dir / "config.json").read_text())
    assert res.outputs["speaker_embedding"].shape == (cfg["speaker_encoder_config"]["enc_dim"],)
    assert res.outputs["reference_codes"].shape == (int(np.ceil(len(clip) / 1920)), 16)


@pytest.mark.reference
def test_reference_synthesis_script_on_a_small_model(small_model, tmp_path):
    """tools/bench/reference_synthesis_timing.py against the real qwen-tts package: the full frame
    count (EOS row zeroed), the speaker embedding it was given, codes close to the engine's, its
    decode timed, and its decoder on the engine's codes agreeing with the engine's audio."""
    from vocable import Engine
    python, model, inp = reference_run_input(small_model, tmp_path, frames=8, main_type="f32")
    inp.models["f32"] = model
    group, audio = bench_groups.GenerationStages(), bench_groups.SynthesisStages()
    with Engine(model.gguf, threads=1) as engine:
        ours = group.run_vocable(engine, inp)
        ours_audio = audio.run_vocable(engine, inp)
    assert ours.error is None, ours.error
    assert ours_audio.error is None, ours_audio.error
    res = bench_reference.run_reference(group, python, model.hf_dir, inp)
    assert res.error is None, res.error
    assert bench_reference.run_reference(audio, python, model.hf_dir, inp) is res   # one process for both groups
    assert {"talker_ms_per_frame", "code_predictor_ms_per_frame", "prefill_ms", "decode_ms_per_audio_s",
            "first_audio_ms", "synthesis_ms_per_audio_s"} <= set(res.runs_ms)
    assert res.extra["frames"] == 8 and res.extra["reached_eos"] is False and res.extra["codec_eos_row_zero"]
    assert res.extra["talker_steps"] == 8 and res.extra["code_predictor_calls"] == 8 and res.extra["decode_calls"] == 1
    assert res.extra["prefill_tokens"] == ours.extra["f32"]["prompt_positions"]
    assert res.extra["samples"] == 8 * 1920 and res.extra["audio_s"] == pytest.approx(0.64)
    assert res.outputs["codes"].shape == (8, 16) and res.outputs["audio"].shape == (8 * 1920,)
    assert res.outputs["decoded_f32"].shape == (8 * 1920,) and res.extra["decoded"]["f32"]["frames"] == 8
    ag = group.agreement(ours.outputs, res.outputs)
    assert ag["speaker_embedding"]["max_abs_diff"] == 0
    print(group.describe_agreement(ag))   # reported, not asserted: near-ties may flip
    wav = audio.agreement(ours_audio.outputs, res.outputs)
    print(audio.describe_agreement(wav))
    assert wav["f32"]["samples"] == [8 * 1920, 8 * 1920] and wav["f32"]["cosine"] >= 0.999


def test_reference_clip():
    clip, source = bench_measure.make_reference_clip(1.5)
    assert clip.dtype == np.float32 and clip.shape == (36000,)
    assert source in ("espeak-ng", "synthetic") and abs(np.abs(clip).max() - 0.5) < 1e-3


def test_bad_arguments(tmp_path):
    from vocable.errors import VocableError
    with pytest.raises(VocableError, match="ref-seconds"):
        bench.run_bench(bench_args(tmp_path, ref_seconds=0.5))


def test_perf_capture_restores_logging():
    import logging
    logger = logging.getLogger("vocable.engine")
    before = (logger.level, logger.propagate, list(logger.handlers))
    with bench_measure.engine_perf_lines() as lines:
        logger.info("[Perf] x: 1 ms")
        logger.info("not perf")
    assert lines == ["[Perf] x: 1 ms"]
    assert (logger.level, logger.propagate, list(logger.handlers)) == before


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("VOCABLE_BENCH_FULL"),
                    reason="the full-size benchmark takes minutes and ~7 GB of disk: set VOCABLE_BENCH_FULL=1")
def test_full_size_bench(capsys):
    rc = bench.run_bench(argparse.Namespace(threads=2, ref_seconds=10.0, repeats=3, cache_dir=None,
                                            no_reference=False, model=None))
    out = capsys.readouterr().out
    assert rc == 0, out
    rep = last_json(out)
    assert {s["key"] for s in rep["stages"]} >= {"f32:decode", "f32:first_audio", "q4_k:synthesis"}
    if rep["reference"]["status"] == "ok":
        assert rep["agreement"]["voice"]["speaker_embedding"]["cosine"] > 0.999
        assert rep["agreement"]["synthesis"]["f32"]["cosine"] > 0.999   # both decoders on the engine's f32 codes


def test_run_bench_beside_other_work(small_model, tmp_path, capsys):
    """--background-load / --background-engines: quiet, then beside a busy process and beside a
    second engine (both started and stopped by the bench), with ratios and targets."""
    spec, cache, model = small_model
    rc = bench.run_bench(bench_args(tmp_path, model=str(model.gguf), repeats=1, threads=2, background_load=1,
                                    background_engines=1))
    out = capsys.readouterr().out
    assert rc == 0, out
    c = last_json(out)["contention"]["as converted"]
    assert c["quiet"]["rtf"] > 0
    for key, target in (("busy", 1.6), ("engines", 2.3)):
        r = c[key]
        assert r["count"] == 1 and r["rtf"] > 0 and r["target_ratio"] == target, r
        assert r["ratio"] == pytest.approx(r["rtf"] / c["quiet"]["rtf"]) and r["met"] == (r["ratio"] <= target)
    assert "with 1 busy process(es):" in out and "with 1 other engine(s) synthesizing:" in out


def test_run_bench_on_several_cpu_variants(small_model, tmp_path, capsys):
    """--cpu-variants: each variant in its own process (the generic x64 one and the best this
    processor runs), with the kernels each used, speed-ups over the first, the long text a batch
    at a time in each, and a clear failure for a variant that does not exist."""
    from vocable import _engine

    best = _engine.system_info().split(" ", 1)[0]
    spec, cache, model = small_model
    rc = bench.run_bench(bench_args(tmp_path, model=str(model.gguf), repeats=1, cpu_variants=f"x64,{best},pentium3",
                                    no_long_text=False, batch=3))
    out = capsys.readouterr().out
    assert rc == 0, out
    c = last_json(out)["cpu_variants"]["as converted"]
    assert c["baseline"] == "x64" and list(c["runs"]) == ["x64", best, "pentium3"]
    generic, fast = c["runs"]["x64"], c["runs"][best]
    assert generic["kernels"] == "generic" and generic["info"].startswith("x64 (")
    assert fast["info"].startswith(f"{best} (") and fast["rtf"] > 0
    assert fast["speedup"] == pytest.approx(generic["rtf"] / fast["rtf"])
    assert generic["long_text_batch"] == fast["long_text_batch"] == 3 and fast["long_text_audio_per_s"] > 0
    assert fast["long_text_speedup"] == pytest.approx(fast["long_text_audio_per_s"] / generic["long_text_audio_per_s"])
    assert "no such CPU variant" in c["runs"]["pentium3"]["error"]
    assert f"as converted: {best} (kernels {fast['kernels']}): real-time factor" in out
    assert "; long text 3 at a time " in out
    assert "as converted: pentium3: failed:" in out


def test_cpu_variants_needs_two():
    with pytest.raises(VocableError, match="at least two variants"):
        bench.run_bench(bench_args(Path("/nonexistent"), cpu_variants="zen4"))


def test_background_work_is_stopped(monkeypatch):
    """The busy processes run while the block runs and are gone after it."""
    import subprocess

    from vocable.bench import contention as bench_contention
    procs, real_popen = [], subprocess.Popen

    def spy(*a, **kw):
        procs.append(real_popen(*a, **kw))
        return procs[-1]
    monkeypatch.setattr(bench_contention.subprocess, "Popen", spy)
    with bench_contention.background_work(2, 0, []):
        assert len(procs) == 2 and all(p.poll() is None for p in procs)
    assert all(p.poll() is not None for p in procs)
