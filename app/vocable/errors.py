"""Exceptions with messages meant for the user: each says what is wrong and what to do."""


class VocableError(Exception):
    """Base of every error Vocable reports to the user."""


class AudioError(VocableError):
    """An audio file or buffer cannot be used (missing, empty, corrupt, unsupported, bad samples)."""


class VoiceError(VocableError):
    """A voice file is missing, corrupt, or not a Vocable voice."""


class ModelError(VocableError):
    """A model file is missing, truncated, corrupt, or of the wrong kind."""


class SynthesisCancelled(VocableError):
    """A synthesis was stopped on request."""


class AudioDeviceError(VocableError):
    """Audio cannot be played: no PortAudio library, no output device, or the device refused."""


class ConversionError(Exception):
    """The input folder is not a convertible Qwen3-TTS 12 Hz Base model, or writing failed."""


class ConversionCancelled(ConversionError):
    """A conversion was stopped on request; it left no partial model behind."""
