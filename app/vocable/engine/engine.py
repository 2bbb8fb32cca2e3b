"""The engine wrapper: loads a converted model, turns reference audio into voices and text into
speech, streamed.

No Qt here; the GUI drives this from a worker thread. The native calls release the GIL.

    with Engine("model.gguf") as engine:
        with engine.synthesize("Hello there.", voice, seed=7) as stream:   # returns at once
            for chunk in stream:            # float32 audio as it is produced (first: one frame)
                player.write(chunk)
            result = stream.result()        # SynthesisResult: whole audio, codes, mode, timings
"""
from __future__ import annotations

import ctypes
import logging
import os
import secrets
import sys
import threading
import time
from pathlib import Path

import numpy as np

from .. import _engine
from ..audio.export import check_output, save_speech
from ..audio.files import prepare_reference
from ..errors import ModelError, VocableError
from ..library.voice import MAX_CLIPS, Voice
from .segments import FILE_BATCH, Segment, segment_seed, stream_frame_cap
from .synthesis import IN_CONTEXT, X_VECTOR, Synthesis, SynthesisResult

LANGUAGES_KEY = "qwen3-tts.talker.language_names"

log = logging.getLogger("vocable.engine")

_LEVELS = {0: logging.DEBUG, 1: logging.INFO, 2: logging.WARNING, 3: logging.ERROR}


def _forward_log(level: int, text: str) -> None:
    log.log(_LEVELS.get(level, logging.INFO), "%s", text)



def devices() -> list[dict]:
    """The devices the engine can run on, the CPU first: dicts of id ("cpu", "vulkan:0"),
    description, kind ("cpu", "gpu", "igpu", "accel"), memory_total and memory_free (bytes)."""
    return _engine.devices()


_M_MMAP_THRESHOLD = -3               # glibc's mallopt parameter
_LARGE_BLOCK_BYTES = 128 << 10       # glibc's default threshold
_large_blocks_mapped_apart = False


def map_large_blocks_apart() -> None:
    """Has glibc's malloc serve every block of 128 KiB or more from a mapping of its own, which
    goes back to the system when freed. By default glibc raises that threshold (up to 32 MiB) each
    time such a block is freed, after which the engine's compute buffers, reallocated as its graphs
    grow, and the text tokenizer's parsing land in the heap, whose freed space stays resident: a
    q8_0 synthesis of the bench's real-shape model peaked 29-35 MiB higher that way (measured, AMD
    EPYC Zen 4). Once per process; nothing elsewhere than on glibc."""
    global _large_blocks_mapped_apart
    if _large_blocks_mapped_apart or not sys.platform.startswith("linux"):
        return
    _large_blocks_mapped_apart = True
    try:
        ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, _LARGE_BLOCK_BYTES)
    except (OSError, AttributeError):  # a C library without mallopt
        pass


class Engine:
    """A loaded model. Calls from several threads are serialised (a context computes one
    request at a time, a synthesis stream holds it until it ends); use one Engine per thread for
    parallel work."""

    def __init__(self, model_path: str | os.PathLike, threads: int | None = None,
                 dump_dir: str | os.PathLike | None = None, codec_chunk_sec: float | None = None,
                 share_cores: bool = True, device: str = "cpu"):
        """`threads`: the most threads a computation runs on (None: every core). `share_cores`:
        run on fewer while other processes keep cores busy (measured every quarter second), so a
        busy desktop slows synthesis by its share of the cores instead of stalling it.
        `codec_chunk_sec`: width of the codec decoder's chunks (and the largest streamed chunk),
        None for the engine's default (_engine.DEFAULT_CODEC_CHUNK_SEC). `device`: where the
        talker, the code predictor and the codec decoder run (the decoder stays on the CPU
        where the device has no room for its buffers, said in the log): "cpu", "auto" (the best GPU, else the CPU) or a device
        id from `vocable.engine.devices()` ("vulkan:0"); one that is missing or fails to start
        leaves them on the CPU (`device_fallback` says why), and one that runs out of memory for a
        request before its first audio hands that request and the ones after it to the CPU
        (`device` and `device_fallback` change when the request ends). Of the voice's stages, the
        speaker encoder runs on the device too; the codec encoder stays on the CPU, whose exact
        f32 products keep the reference codes' near-ties as the reference decides them."""
        path = Path(model_path)
        if not path.is_file():
            raise ModelError(f"model file not found: {path}" + (" (it is a folder: convert it first with "
                                                                "`vocable convert`)" if path.is_dir() else ""))
        if threads is not None and threads < 1:
            raise ValueError("threads must be at least 1")
        if codec_chunk_sec is not None and not codec_chunk_sec > 0:
            raise ValueError("codec_chunk_sec must be positive (None: the default)")
        if dump_dir is not None:
            Path(dump_dir).mkdir(parents=True, exist_ok=True)
        map_large_blocks_apart()
        # The metadata is read first, in one bounded pass that checks every length and string,
        # so the engine only gets files whose header is well formed; and the tokenizer is ready
        # before the first synthesis, which then starts as quickly as the next.
        from .gguf_header import read_gguf_header
        from .text import GGUF_TOKENIZER_KEYS, TextTokenizer
        meta = read_gguf_header(path, GGUF_TOKENIZER_KEYS | {LANGUAGES_KEY})
        self._tokenizer = TextTokenizer.from_metadata(meta, path)
        languages = meta.get(LANGUAGES_KEY) or []
        if not (isinstance(languages, list) and all(isinstance(name, str) for name in languages)):
            raise ModelError(f"{path} has a malformed language list ({LANGUAGES_KEY})")
        self._languages = tuple(languages)
        try:
            self._ctx = _engine.Context(str(path), threads or 0, str(dump_dir) if dump_dir else None, _forward_log,
                                        float(codec_chunk_sec or 0.0), bool(share_cores), str(device))
            self.info: dict = self._ctx.model_info()
            self.device, self.device_fallback = self._ctx.device()
        except _engine.EngineError as e:
            raise ModelError(e.args[0]) from e
        except UnicodeDecodeError:  # text the header check did not see: the file replaced since
            raise ModelError(f"{path} has text that is not UTF-8: not a usable model file") from None
        self.model_path = path
        self._lock = threading.Lock()
        self._active: Synthesis | None = None

    def close(self) -> None:
        """Cancels a running synthesis and frees the model."""
        self.cancel()
        with self._lock:
            self._ctx.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def sample_rate(self) -> int:
        return int(self.info["sample_rate"])

    @property
    def max_chunk_seconds(self) -> float:
        """The longest audio chunk a stream hands over (codec_chunk_sec in whole frames)."""
        return self.info["codec_chunk_frames"] * self.info["samples_per_frame"] / self.sample_rate

    @property
    def languages(self) -> tuple[str, ...]:
        """The languages the model knows ("auto" picks by itself), read from the model file."""
        return self._languages

    def embed_voice(self, samples: np.ndarray, sample_rate: int, ref_text: str | None = None, name: str = "") -> Voice:
        """The voice of a reference clip: any sample rate, mono or multichannel (mixed down),
        1 to 60 s (longer clips keep their first 60 s; see Voice.warnings)."""
        clip = prepare_reference(samples, sample_rate)
        try:
            with self._lock:
                embedding, codes = self._ctx.extract_voice_ref(clip.samples)
        except _engine.EngineError as e:
            raise VocableError(f"cannot embed the reference voice: {e.args[0]}") from e
        text = ref_text.strip() if ref_text and ref_text.strip() else None
        return Voice(embedding, codes, text, name, self.info["variant"], clip.seconds, clip.warnings)

    def add_clip(self, voice: Voice, samples: np.ndarray, sample_rate: int) -> Voice:
        """The voice with one more reference clip averaged into its speaker embedding (a steadier
        voice from several recordings); its reference codes and transcript, the clip in-context
        cloning continues, stay as they are."""
        self._check_model_size(voice)
        if voice.clips >= MAX_CLIPS:
            raise VocableError(f"the voice averages {voice.clips} clips already, the most it can")
        added = self.embed_voice(samples, sample_rate)
        n = voice.clips
        embedding = (voice.speaker_embedding.astype(np.float64) * n + added.speaker_embedding) / (n + 1)
        return Voice(embedding.astype(np.float32), voice.codes, voice.ref_text, voice.name, voice.model_variant,
                     voice.reference_seconds, voice.warnings + added.warnings, clips=n + 1)

    def _check_model_size(self, voice: Voice) -> None:
        if voice.speaker_embedding.size != self.info["n_speaker_embd"]:
            raise VocableError(f"the voice was made with another model size ({voice.model_variant or 'unknown'}: "
                               f"embedding width {voice.speaker_embedding.size}, this model's is "
                               f"{self.info['n_speaker_embd']}); make it again with this model")

    @property
    def tokenizer(self):
        """The model's text tokenizer (text.TextTokenizer), read from the model file."""
        return self._tokenizer

    def synthesize(self, text: str, voice: Voice, language: str = "auto", ref_text: str | None = None, *,
                   temperature: float = 0.9, top_k: int = 50, top_p: float = 1.0, repetition_penalty: float = 1.05,
                   seed: int | None = None, max_frames: int | None = None, greedy: bool = False,
                   max_segment_units: int | None = None, watchdog: bool | None = None, batch: int = 1) -> Synthesis:
        """Starts speaking `text` in `voice` and returns the Synthesis stream at once (the work
        runs on a background thread; iterate it for audio chunks, or call result()). Errors in
        the arguments (empty text, unknown language, a voice of another model) are raised here.

        In-context cloning runs when the voice carries reference codes and a transcript is known
        (`ref_text`, or the one saved with the voice); otherwise the speaker embedding alone is
        used (x-vector). `greedy` (or temperature 0) picks the most likely codes; a seed makes a
        sampled run reproducible (a random one is drawn and reported when None).

        Markdown headings ("# Title") divide the text into chapters (chapters.split_chapters):
        each heading is spoken as a sentence, and SynthesisResult.chapters says where each
        chapter's audio lies. A text longer than `max_segment_units` (sentences.MAX_SEGMENT_UNITS, about 20 s of speech) is
        split at sentence boundaries into segments spoken one after the other in the same
        stream, in the same voice; segment i samples with a seed derived from (seed, i).
        `max_frames` is the frame cap of each segment (the model can run on without ending).
        By default a segment stops at _engine.default_max_frames(its text tokens), and the whole
        stream at stream_frame_cap(text) (see STREAM_CAP_FACTOR): then the segments left are not
        spoken, and reached_eos is False.

        The runaway watchdog (runaway.py) stops a segment that goes on in silence, loops, or runs
        far past its text, and generates it once more with another seed when it stopped before
        its text can have been spoken; SynthesisResult.runaway says what it did. It is on unless
        `max_frames` is given (a caller that fixes the length wants exactly that many frames);
        `watchdog` overrides that.

        `batch`: how many segments generate side by side (1 to _engine.MAX_BATCH). They share
        every weight read, so a long text takes less time in all (see README, Speed), with the
        same audio and codes as one by one; but a segment's audio is handed over only once those
        before it are complete, so the first audio comes no sooner. For files, not for playback."""
        from .chapters import split_chapters
        from .sentences import MAX_SEGMENT_UNITS, split_for_synthesis

        started = time.perf_counter()
        language = language.lower()
        known = self.languages
        if language != "auto" and known and language not in known:
            raise VocableError(f"unknown language '{language}'; the model knows: auto, {', '.join(known)}")
        self._check_model_size(voice)
        if max_frames is not None and max_frames < 1:
            raise ValueError("max_frames must be at least 1")
        if not 1 <= batch <= _engine.MAX_BATCH:
            raise ValueError(f"batch must be 1 to {_engine.MAX_BATCH}")
        chapters = split_chapters(text)
        texts = [(part, c) for c, chapter in enumerate(chapters)
                 for part in split_for_synthesis(chapter.text, max_segment_units or MAX_SEGMENT_UNITS)]
        if seed is None:
            seed = secrets.randbits(63)
        seed = int(seed)
        if not 0 <= seed < 2 ** 64:
            raise ValueError("seed must be in [0, 2**64)")
        segments = [Segment(t, np.asarray(self.tokenizer.target_prompt(t).ids, dtype=np.int32), segment_seed(seed, i), c)
                    for i, (t, c) in enumerate(texts)]
        transcript = ref_text if ref_text is not None and ref_text.strip() else voice.ref_text
        ref_codes = ref_ids = None
        if voice.codes is not None and transcript:
            mode, reason = IN_CONTEXT, "the voice has reference codes and a transcript"
            ref_codes = voice.codes
            low, high = int(ref_codes.min(initial=0)), int(ref_codes.max(initial=0))
            if low < 0 or high >= self.info["codebook_size"]:
                raise VocableError(f"the voice's reference codes are out of range ({low} to {high}; this model's "
                                   f"codebooks have codes 0 to {self.info['codebook_size'] - 1}): the voice is "
                                   "damaged, make it again")
            ref_ids = np.asarray(self.tokenizer.ref_prompt(transcript).ids, dtype=np.int32)
        elif voice.codes is None:
            mode, reason = X_VECTOR, "the voice has no reference codes"
        else:
            mode, reason = X_VECTOR, "no transcript of the reference was given"
        if greedy:
            temperature = 0.0
        talker = dict(temperature=temperature, top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty)
        predictor = dict(temperature=temperature, top_k=top_k, top_p=top_p)
        self._ctx.model_info()  # raises ValueError("...closed") now rather than in the stream
        return Synthesis(self, segments, voice, language, ref_codes, ref_ids, mode, reason, seed, talker, predictor,
                         max_frames, stream_frame_cap(text), started,
                         watchdog if watchdog is not None else max_frames is None, batch,
                         tuple(chapter.title for chapter in chapters))

    def synthesize_to_file(self, text: str, voice: Voice, path: str | os.PathLike, language: str = "auto",
                           ref_text: str | None = None, **kwargs) -> SynthesisResult:
        """Speaks `text` into an audio file: WAV or FLAC (16 bit), OGG Vorbis, Opus, MP3, or an
        M4B audiobook with the text's chapters marked (with PyAV), by its extension. Takes synthesize()'s keyword arguments; returns its SynthesisResult. A long
        text's segments generate FILE_BATCH at a time unless `batch` says otherwise."""
        check_output(path)  # before the work: a wrong name fails at once
        kwargs.setdefault("batch", FILE_BATCH)
        with self.synthesize(text, voice, language, ref_text, **kwargs) as stream:
            result = stream.result()
        save_speech(path, result.audio, result.sample_rate, result.chapters, voice.name)
        return result

    def decode(self, codes: np.ndarray, chunk_frames: int | None = None) -> np.ndarray:
        """Audio (float32 [frames * 1920]) of codec codes int32 [frames, 16], decoded in chunks of
        `chunk_frames` (None: the engine's codec chunk) with the same result for any width."""
        codes = np.asarray(codes)
        if codes.ndim != 2 or codes.shape[0] < 1 or codes.shape[1] != self.info["n_codebooks"]:
            raise ValueError(f"codes must be [frames >= 1, {self.info['n_codebooks']}], got {list(codes.shape)}")
        try:
            with self._lock:
                return self._ctx.decode(np.ascontiguousarray(codes, dtype=np.int32), int(chunk_frames or 0))
        except _engine.EngineError as e:
            raise VocableError(f"cannot decode: {e.args[0]}") from e

    def forget_prompts(self) -> None:
        """Drops the engine's cached prompts and primed decoder states, so that the next
        synthesis computes its prefill (and, in-context, primes the decoder with the reference)
        even for a prompt or voice it has seen (the bench times a new prompt this way). Waits for
        a running synthesis to end."""
        with self._lock:
            self._ctx.forget_prompts()

    def cancel(self) -> None:
        """Stops the synthesis running on this engine, if any (it raises SynthesisCancelled)."""
        active = self._active
        if active is not None:
            active.cancel()
        self._ctx.cancel()
