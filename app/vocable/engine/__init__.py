"""The engine layer: text in, audio out, through the native engine (`vocable._engine`).

`synthesis` wraps the native context (`Engine`, its `Synthesis` streams); `text` is the text
front end (normalisation, segmentation, the BPE tokenizer); `models` finds, downloads and
converts models (`convert`, with the `gguf_header` and `safetensors_reader` readers of untrusted
files); `runaway` watches a stream for generation that does not end. It reads and writes audio
files (`vocable.audio.files`) but never touches an audio device.
"""
from .synthesis import (FILE_BATCH, IN_CONTEXT, X_VECTOR, AudioChunk, Engine, Progress, Synthesis, SynthesisResult,
                        stream_frame_cap)

__all__ = ["FILE_BATCH", "IN_CONTEXT", "X_VECTOR", "AudioChunk", "Engine", "Progress", "Synthesis", "SynthesisResult",
           "stream_frame_cap"]
