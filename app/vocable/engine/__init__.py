"""The engine layer: text in, audio out, through the native engine (`vocable._engine`).

`engine` wraps the native context (`Engine`); `synthesis` is its stream (`Synthesis`), which
speaks a long text as `segments`, one after the other or side by side (`batch`); `text` is the text
front end (normalisation, segmentation, the BPE tokenizer); `models` finds, downloads and
converts models (`convert`, with the `gguf_header` and `safetensors_reader` readers of untrusted
files); `runaway` watches a stream for generation that does not end. It reads and writes audio
files (`vocable.audio.files`) but never touches an audio device.
"""
from .engine import Engine, devices
from .segments import FILE_BATCH, stream_frame_cap
from .synthesis import IN_CONTEXT, X_VECTOR, AudioChunk, Progress, Synthesis, SynthesisResult

__all__ = ["FILE_BATCH", "IN_CONTEXT", "X_VECTOR", "AudioChunk", "Engine", "Progress", "Synthesis", "SynthesisResult",
           "devices", "stream_frame_cap"]
