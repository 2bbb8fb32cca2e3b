"""The codec decoder's products at lower precision, simulated in the official package: each
convolution's and linear layer's weights and/or inputs rounded (f16, bf16, or int8, int12, int14
or int16 with one scale per output channel of the weights and per frame of the inputs, as an
integer GEMM would take them; the wider integers from the f16 weights the engine ships),
the products still summed in f32. Prints the waveform's cosine against the same codes decoded in
f32, the bar a faster decoder must keep (issue 15: >= 0.998). Run it with the reference venv:

    .venv-ref/bin/python tools/bench/decoder_precision.py [MODEL_DIR] [--frames 50] [--seed 1]

MODEL_DIR defaults to the bench's random real-shape 0.6B model (built by `vocable bench`).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reference_model  # noqa: E402

DEFAULT_MODEL = Path.home() / ".cache/vocable/bench/qwen3-tts-12hz-0.6b-base-random-s0"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", nargs="?", default=str(DEFAULT_MODEL))
    ap.add_argument("--frames", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    args.threads = 2
    with reference_model.load_reference(args) as ref:
        import torch

        tokenizer = ref.tts.model.speech_tokenizer
        layers = [(name, m) for name, m in tokenizer.model.named_modules()
                  if name.startswith("decoder") and isinstance(m, (torch.nn.Conv1d, torch.nn.ConvTranspose1d,
                                                                   torch.nn.Linear))]
        codes = np.random.default_rng(args.seed).integers(0, 2048, size=(args.frames, 16)).astype(np.int64)

        def decode() -> np.ndarray:
            with torch.no_grad():
                out, _ = tokenizer.decode([{"audio_codes": torch.from_numpy(codes)}])
            return np.asarray(out[0], dtype=np.float64)

        def int_rows(x, dim, bits):
            top = float(2 ** (bits - 1) - 1)
            scale = x.abs().amax(dim=dim, keepdim=True).clamp_min(1e-30) / top
            return torch.round(x / scale).clamp(-top, top) * scale

        def rounded_weight(kind, m):
            w = m.weight.data
            if kind == "f16":
                return w.half().float()
            if kind == "bf16":
                return w.bfloat16().float()
            bits = int(kind[3:])
            if bits > 8:   # the integers a wide GEMM would take are made from the shipped f16 weights
                w = w.half().float()
            if isinstance(m, torch.nn.ConvTranspose1d):  # its output channels are dim 1
                t = w.transpose(0, 1)
                return int_rows(t.reshape(t.shape[0], -1), 1, bits).reshape(t.shape).transpose(0, 1).contiguous()
            return int_rows(w.reshape(w.shape[0], -1), 1, bits).reshape(w.shape)

        def rounded_input(kind, x, channel_dim):
            return x.bfloat16().float() if kind == "bf16" else int_rows(x, channel_dim, int(kind[3:]))

        want = decode()

        def cosine(weights: str | None, inputs: str | None, prefix: str = "decoder") -> float:
            saved, hooks = [], []
            for name, m in layers:
                if not name.startswith(prefix):
                    continue
                if weights:
                    saved.append((m, m.weight.data))
                    m.weight.data = rounded_weight(weights, m)
                if inputs:
                    dim = -1 if isinstance(m, torch.nn.Linear) else 1
                    hooks.append(m.register_forward_pre_hook(
                        lambda _m, inp, dim=dim: (rounded_input(inputs, inp[0], dim),) + tuple(inp[1:])))
            got = decode()
            for m, w in saved:
                m.weight.data = w
            for h in hooks:
                h.remove()
            return round(float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want))), 6)

        result = {
            "f16 weights": cosine("f16", None),
            "bf16 weights": cosine("bf16", None),
            "bf16 weights and inputs": cosine("bf16", "bf16"),
            "int8 weights": cosine("int8", None),
            "int8 inputs": cosine(None, "int8"),
            "int8 weights and inputs": cosine("int8", "int8"),
        }
        for block in range(1, 5):  # the upsampling blocks, 400 Hz to 24 kHz
            result[f"int8 weights and inputs, block {block} only"] = cosine("int8", "int8", f"decoder.decoder.{block}.")
        # int16 products (vpdpwssd) take two multiply-adds per lane and instruction, twice an f32 FMA's
        result["int16 weights"] = cosine("int16", None)
        result["int16 inputs"] = cosine(None, "int16")
        for bits in (16, 14, 12):
            result[f"int{bits} weights and inputs"] = cosine(f"int{bits}", f"int{bits}")
        print(json.dumps({"frames": args.frames, "seed": args.seed, "model": args.model_dir, "cosine": result}),
              file=ref.stdout)


if __name__ == "__main__":
    main()
