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
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also under python -P / PYTHONSAFEPATH
from reference_model import load_reference  # noqa: E402


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True, help="Hugging Face model folder (Qwen3-TTS 12 Hz Base layout)")
    ap.add_argument("--clip", required=True, help="mono float32 24 kHz clip as .npy")
    ap.add_argument("--outputs", required=True, help="where to write the outputs (.npz)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    with load_reference(args) as reference:
        import numpy as np

        wav = np.ascontiguousarray(np.load(args.clip), dtype=np.float32)
        model = reference.tts.model

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
        reference.write_result(args, runs, clip_seconds=round(len(wav) / 24000.0, 3))


if __name__ == "__main__":
    main()
