#!/usr/bin/env python3
"""Reference side of `vocable bench`, voice stages: the official PyTorch package (qwen-tts
0.1.1) on the same Hugging Face model folder and the same clip as the engine.

Times `model.extract_speaker_embedding(wav, 24000)` (mel + ECAPA-TDNN) and
`model.speech_tokenizer.encode(wav, sr=24000)` (Mimi encoder + RVQ) in fp32 on the CPU with
torch.set_num_threads(--threads): one warm-up call, then --repeats timed calls each. Writes the
outputs (speaker embedding, reference codes) to --outputs (.npz) for the agreement check and
prints ONE JSON line on stdout; everything else goes to stderr.

Needs a Python with torch and qwen-tts (`pip install --no-deps qwen-tts==0.1.1` plus
transformers 4.57.3, accelerate, einops, librosa, soundfile). sox, onnxruntime and torchaudio
are only imported by the package's 25 Hz tokenizer and are stubbed when missing.

Usage: python reference_voice_timing.py --model-dir HF_DIR --clip CLIP.npy --outputs OUT.npz
                                        [--threads 2] [--repeats 3]
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.machinery
import importlib.metadata
import json
import os
import sys
import time
import types


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True, help="Hugging Face model folder (Qwen3-TTS 12 Hz Base layout)")
    ap.add_argument("--clip", required=True, help="mono float32 24 kHz clip as .npy")
    ap.add_argument("--outputs", required=True, help="where to write the outputs (.npz)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    return ap.parse_args()


def stub_unused_modules() -> list[str]:
    """qwen_tts/__init__ imports its 25 Hz tokenizer, whose module imports sox, onnxruntime and
    torchaudio.compliance.kaldi at load time. The 12 Hz path never calls them: install
    placeholder modules for the ones that do not import, so the package loads without them."""
    def unavailable(*_a, **_k):
        raise RuntimeError("placeholder module: only qwen_tts' 25 Hz tokenizer uses this")

    stubbed = []
    for name in ("torchaudio.compliance.kaldi", "sox", "onnxruntime"):
        try:
            __import__(name)
            continue
        except Exception:  # noqa: BLE001  (ImportError, or OSError from a mismatched torchaudio build)
            pass
        top = name.split(".")[0]
        for key in [k for k in sys.modules if k == top or k.startswith(top + ".")]:
            del sys.modules[key]
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            sub = ".".join(parts[:i])
            mod = types.ModuleType(sub)
            mod.__spec__ = importlib.machinery.ModuleSpec(sub, None)  # transformers probes find_spec
            sys.modules[sub] = mod
            if i > 1:
                setattr(sys.modules[".".join(parts[:i - 1])], parts[i - 1], mod)
        for attr in ("fbank", "Transformer", "InferenceSession", "SessionOptions"):
            setattr(sys.modules[name], attr, unavailable)
        stubbed.append(name)
    return stubbed


def median(values):
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def main() -> None:
    args = parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    real_stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):  # qwen_tts prints a flash-attn banner on stdout
        import numpy as np
        import torch
        import transformers  # noqa: F401  (before stubbing: its availability probes use find_spec)

        stubbed = stub_unused_modules()
        from qwen_tts import Qwen3TTSModel

        torch.set_num_threads(args.threads)
        wav = np.ascontiguousarray(np.load(args.clip), dtype=np.float32)
        t0 = time.perf_counter()
        tts = Qwen3TTSModel.from_pretrained(args.model_dir, device_map="cpu", dtype=torch.float32)
        load_s = time.perf_counter() - t0
        model = tts.model

        def speaker_embedding():
            return model.extract_speaker_embedding(wav, 24000)

        def reference_codes():
            return model.speech_tokenizer.encode(wav, sr=24000).audio_codes[0]

        stages = {"speaker_embedding": speaker_embedding, "reference_codes": reference_codes}
        runs: dict[str, list[float]] = {}
        outputs = {}
        for key, fn in stages.items():
            outputs[key] = fn()  # warm-up
            runs[key] = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                fn()
                runs[key].append(1e3 * (time.perf_counter() - t0))
        np.savez(args.outputs, speaker_embedding=outputs["speaker_embedding"].float().numpy(),
                 reference_codes=outputs["reference_codes"].numpy().astype(np.int32))
        result = {
            "side": "reference", "package": f"qwen-tts {importlib.metadata.version('qwen-tts')}",
            "threads": args.threads, "torch_threads": torch.get_num_threads(), "repeats": args.repeats,
            "clip_seconds": round(len(wav) / 24000.0, 3), "load_s": round(load_s, 2),
            "median_ms": {k: round(median(v), 2) for k, v in runs.items()},
            "runs_ms": {k: [round(x, 2) for x in v] for k, v in runs.items()},
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
            "stubbed_modules": stubbed,
        }
    real_stdout.write(json.dumps(result) + "\n")
    real_stdout.flush()


if __name__ == "__main__":
    main()
