"""Vocable: clone a voice from a few seconds of audio and speak any text in it, locally.

The engine is native (C++ on ggml, module `vocable._engine`); this package wraps it:
`Engine` loads a converted model, `Engine.embed_voice` turns a reference clip into a `Voice`,
`Engine.synthesize` speaks a text in it as a `Synthesis` stream of audio chunks.
"""
from ._engine import EngineError, __version__
from .engine import IN_CONTEXT, X_VECTOR, AudioChunk, Engine, Progress, Synthesis, SynthesisResult
from .errors import AudioDeviceError, AudioError, ModelError, SynthesisCancelled, VocableError, VoiceError
from .library.voice import Voice

__all__ = ["IN_CONTEXT", "X_VECTOR", "AudioChunk", "AudioDeviceError", "AudioError", "Engine", "EngineError",
           "ModelError", "Progress", "Synthesis", "SynthesisCancelled", "SynthesisResult", "VocableError", "Voice",
           "VoiceError", "__version__"]
