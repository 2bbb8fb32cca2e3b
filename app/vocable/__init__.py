"""Vocable: clone a voice from a few seconds of audio and speak any text in it, locally.

The engine is native (C++ on ggml, module `vocable._engine`); this package wraps it:
`Engine` loads a converted model, `Engine.embed_voice` turns a reference clip into a `Voice`.
"""
from ._engine import EngineError, __version__
from .engine import Engine
from .errors import AudioError, ModelError, VocableError, VoiceError
from .voice import Voice

__all__ = ["AudioError", "Engine", "EngineError", "ModelError", "VocableError", "Voice", "VoiceError", "__version__"]
