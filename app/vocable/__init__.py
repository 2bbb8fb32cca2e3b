"""Vocable: clone a voice from a few seconds of audio and speak any text in it, locally.

The engine is native (C++ on ggml, module `vocable._engine`); this package wraps it:
`Engine` loads a converted model, `Engine.embed_voice` turns a reference clip into a `Voice`.
"""
from ._engine import EngineError, __version__
from .engine import IN_CONTEXT, X_VECTOR, Engine, SynthesisResult
from .errors import AudioError, ModelError, SynthesisCancelled, VocableError, VoiceError
from .voice import Voice

__all__ = ["IN_CONTEXT", "X_VECTOR", "AudioError", "Engine", "EngineError", "ModelError", "SynthesisCancelled",
           "SynthesisResult", "VocableError", "Voice", "VoiceError", "__version__"]
