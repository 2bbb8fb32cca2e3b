"""Audio encoded as it is generated, for a network stream: WAV, raw PCM, MP3, Ogg Opus, FLAC and
(with PyAV installed) AAC, the formats of OpenAI's speech API.

libsndfile (through soundfile, which Vocable reads files with already) encodes MP3 and Opus. It
writes them into a pipe, so it knows it cannot seek back to patch a header: the MP3 has no VBR
tag to fill in later (and is constant-bitrate, so readers that estimate its length from the size,
libsndfile's among them, get it right). A FLAC header holds the length, and some readers
(libsndfile again) refuse a stream without it, so FLAC comes whole, once the audio is complete.
AAC needs FFmpeg: PyAV's, which is optional because its wheels carry GPL code (x264, x265) that
the bundle does not ship.

    encoder = StreamEncoder("mp3", 24000)
    for chunk in stream:
        send(encoder.feed(chunk))
    send(encoder.finish())
"""
from __future__ import annotations

import io
import os
import struct
import threading

import numpy as np

from ..errors import AudioError

MEDIA_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac",
               "wav": "audio/wav", "pcm": "audio/pcm"}
FORMATS = tuple(MEDIA_TYPES)
MP3_QUALITY = 0.5        # libsndfile's compression level: about 80 kbit/s for 24 kHz mono
_UNKNOWN_SIZE = 0xFFFFFFFF


def aac_available() -> bool:
    try:
        import av  # noqa: F401
    except ImportError:
        return False
    return True


def _pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


class StreamEncoder:
    """Encodes mono float32 audio into `fmt` (one of FORMATS). feed() returns the bytes ready so
    far (maybe none), finish() the rest; close() frees it early (a cancelled stream)."""

    def __init__(self, fmt: str, sample_rate: int):
        if fmt not in MEDIA_TYPES:
            raise AudioError(f"unknown audio format '{fmt}'; one of {', '.join(FORMATS)}")
        self.format = fmt
        self.media_type = MEDIA_TYPES[fmt]
        self.sample_rate = sample_rate
        if fmt == "wav":
            self._impl = _Pcm(sample_rate, header=True)
        elif fmt == "pcm":
            self._impl = _Pcm(sample_rate, header=False)
        elif fmt == "flac":
            self._impl = _Whole(sample_rate)
        elif fmt == "aac":
            self._impl = _Aac(sample_rate)
        else:
            self._impl = _Piped(sample_rate, fmt)

    def feed(self, samples: np.ndarray) -> bytes:
        return self._impl.feed(np.asarray(samples, dtype=np.float32).reshape(-1))

    def finish(self) -> bytes:
        return self._impl.finish()

    def close(self) -> None:
        self._impl.close()

    def __enter__(self) -> "StreamEncoder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Pcm:
    """16-bit little-endian PCM; as WAV, behind a header whose sizes say "unknown", as OpenAI's."""

    def __init__(self, rate: int, header: bool):
        self._header = struct.pack("<4sI4s4sIHHIIHH4sI", b"RIFF", _UNKNOWN_SIZE, b"WAVE", b"fmt ", 16, 1, 1, rate,
                                   rate * 2, 2, 16, b"data", _UNKNOWN_SIZE) if header else b""

    def feed(self, samples: np.ndarray) -> bytes:
        out, self._header = self._header + _pcm16(samples), b""
        return out

    def finish(self) -> bytes:
        out, self._header = self._header, b""
        return out

    def close(self) -> None:
        pass


class _Piped:
    """libsndfile writing into a pipe that a thread empties: MP3 and Ogg Opus."""

    _FORMATS = {"mp3": ("MP3", "MPEG_LAYER_III"), "opus": ("OGG", "OPUS")}

    def __init__(self, rate: int, fmt: str):
        import soundfile as sf

        read_end, write_end = os.pipe()
        self._read_end = read_end
        self._lock = threading.Lock()
        self._ready: list[bytes] = []
        self._reader = threading.Thread(target=self._drain, name="vocable-encoder", daemon=True)
        self._reader.start()
        container, subtype = self._FORMATS[fmt]
        extra = dict(bitrate_mode="CONSTANT", compression_level=MP3_QUALITY) if fmt == "mp3" else {}
        try:
            self._file = sf.SoundFile(write_end, "w", samplerate=rate, channels=1, format=container,
                                      subtype=subtype, closefd=True, **extra)
        except (sf.LibsndfileError, TypeError) as e:
            os.close(write_end)
            self._reader.join()
            os.close(read_end)
            raise AudioError(f"cannot encode {fmt}: {e}") from e

    def _drain(self) -> None:
        while True:
            data = os.read(self._read_end, 1 << 16)
            if not data:
                return
            with self._lock:
                self._ready.append(data)

    def _take(self) -> bytes:
        with self._lock:
            out, self._ready = b"".join(self._ready), []
        return out

    def feed(self, samples: np.ndarray) -> bytes:
        if samples.size:
            self._file.write(samples)
        return self._take()

    def finish(self) -> bytes:
        self.close()
        return self._take()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()   # closes the write end: the reader sees the end and stops
            self._file = None
            self._reader.join()
            os.close(self._read_end)


class _Whole:
    """FLAC, 16 bit: encoded when complete, so that its header holds the length."""

    def __init__(self, rate: int):
        self._rate = rate
        self._parts: list[np.ndarray] = []

    def feed(self, samples: np.ndarray) -> bytes:
        self._parts.append(samples)
        return b""

    def finish(self) -> bytes:
        import soundfile as sf

        buffer = io.BytesIO()
        audio = np.concatenate(self._parts) if self._parts else np.zeros(0, np.float32)
        # the same 16-bit samples as wav and pcm (libsndfile would round floats its own way)
        sf.write(buffer, np.frombuffer(_pcm16(audio), "<i2"), self._rate, format="FLAC", subtype="PCM_16")
        self._parts = []
        return buffer.getvalue()

    def close(self) -> None:
        self._parts = []


class _Sink(io.RawIOBase):
    """A write-only file that hands back what was written since the last take()."""

    def __init__(self):
        self._data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self._data += data
        return len(data)

    def take(self) -> bytes:
        out, self._data = bytes(self._data), bytearray()
        return out


class _Aac:
    """AAC-LC in ADTS frames, through PyAV (FFmpeg's encoder)."""

    def __init__(self, rate: int):
        try:
            import av
        except ImportError:
            raise AudioError("aac needs PyAV (pip install av), which Vocable's bundle leaves out: its FFmpeg "
                             "build carries GPL code; use mp3, opus, flac, wav or pcm") from None
        self._av = av
        self._sink = _Sink()
        self._container = av.open(self._sink, mode="w", format="adts")
        self._stream = self._container.add_stream("aac", rate=rate, layout="mono")
        self._rate = rate
        self._pts = 0

    def _mux(self, frame) -> bytes:
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
        return self._sink.take()

    def feed(self, samples: np.ndarray) -> bytes:
        if not samples.size:
            return b""
        frame = self._av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="fltp", layout="mono")
        frame.sample_rate = self._rate
        frame.pts = self._pts
        self._pts += samples.size
        return self._mux(frame)

    def finish(self) -> bytes:
        out = self._mux(None)
        self.close()
        return out + self._sink.take()

    def close(self) -> None:
        if self._container is not None:
            self._container.close()
            self._container = None
