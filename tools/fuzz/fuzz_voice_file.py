"""Fuzzes the voice file reader (Voice.load, which the library's import uses too): any bytes
give a Voice or a VoiceError."""
from vocable.errors import VoiceError
from vocable.library.voice import Voice

from harness import ScratchFile, run

scratch = ScratchFile(".voice")


def target(data: bytes) -> None:
    voice = Voice.load(scratch.write(data))
    assert voice.speaker_embedding.ndim == 1


if __name__ == "__main__":
    run(target, (VoiceError,))
