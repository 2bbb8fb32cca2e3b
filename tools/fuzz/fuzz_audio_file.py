"""Fuzzes the audio reader behind every reference clip (audio_io.read_reference: libsndfile's
decoders, then the rate, channel and size checks): any bytes give samples or an AudioError."""
import numpy as np

from vocable.audio.files import read_reference
from vocable.errors import AudioError

from harness import ScratchFile, run

scratch = {suffix: ScratchFile(suffix) for suffix in (".wav", ".flac", ".ogg", ".mp3")}
suffixes = list(scratch)


def target(data: bytes) -> None:
    if not data:
        return
    path = scratch[suffixes[data[0] % len(suffixes)]].write(data[1:])
    samples, rate, seconds = read_reference(path)
    assert samples.dtype == np.float32 and samples.ndim == 2 and samples.shape[0] > 0 and rate > 0


if __name__ == "__main__":
    run(target, (AudioError,))
