"""What the reference scripts of `vocable bench` share: the official PyTorch package (qwen-tts
0.1.1) loaded in fp32 on the CPU from a Hugging Face model folder, and their one JSON line of
result on stdout."""
from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.metadata
import json
import os
import sys
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TextIO


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


@dataclass
class Reference:
    tts: Any  # qwen_tts.Qwen3TTSModel
    load_s: float
    stubbed_modules: list[str]
    stdout: TextIO  # the real one: the result line goes there, all else to stderr

    def write_result(self, args, runs_ms: dict[str, list[float]], **fields) -> None:
        """The one JSON line on stdout: the script's own `fields` and its timed runs, with what
        every reference run reports (package, threads, load time, versions)."""
        import torch
        import transformers

        result = {
            "side": "reference", "package": f"qwen-tts {importlib.metadata.version('qwen-tts')}",
            "threads": args.threads, "torch_threads": torch.get_num_threads(), "repeats": args.repeats,
            **fields, "load_s": round(self.load_s, 2),
            "median_ms": {k: round(median(v), 2) for k, v in runs_ms.items()},
            "runs_ms": {k: [round(x, 2) for x in v] for k, v in runs_ms.items()},
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
            "stubbed_modules": self.stubbed_modules,
        }
        self.stdout.write(json.dumps(result) + "\n")
        self.stdout.flush()


@contextlib.contextmanager
def load_reference(args) -> Iterator[Reference]:
    """The package's model from args.model_dir, its load timed, with torch on args.threads
    threads. Within, stdout goes to stderr (qwen_tts prints a flash-attn banner on stdout), so
    that Reference.write_result's line is alone there."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    real_stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        import torch
        import transformers  # noqa: F401  (before stubbing: its availability probes use find_spec)

        stubbed = stub_unused_modules()
        from qwen_tts import Qwen3TTSModel

        torch.set_num_threads(args.threads)
        t0 = time.perf_counter()
        tts = Qwen3TTSModel.from_pretrained(args.model_dir, device_map="cpu", dtype=torch.float32)
        yield Reference(tts, time.perf_counter() - t0, stubbed, real_stdout)
