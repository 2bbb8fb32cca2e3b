"""A result checked against what was asked: its transcript's word error rate against the text
(a runaway or garbled segment shows as a high one), and its speaker similarity to the voice (the
engine's own ECAPA encoder embeds the result; a drift away from the voice shows as a low one)."""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field

import numpy as np

MAX_WORD_ERROR_RATE = 0.35     # above: flagged (Whisper's own errors on clean speech stay well under)
MIN_SPEAKER_SIMILARITY = 0.5   # below: flagged (cosine of ECAPA embeddings)


# Chinese characters and Japanese kana: scripts written without spaces between words, where a
# clause would count as one word and any slip as a whole clause wrong. Each is a token of its own
# there, so the rate is per character, as Chinese and Japanese error rates are counted.
_UNSPACED = re.compile("([\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff])")


def normalize_words(text: str) -> str:
    """Lower case, no punctuation, one space between words (and between the characters of
    Chinese and Japanese): what a word error rate compares."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = re.sub(r"[^\w\s']|(?<!\w)'|'(?!\w)", " ", text)
    return " ".join(_UNSPACED.sub(r" \1 ", text).split())


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word error rate of `hypothesis` against `reference` (jiwer), after normalize_words: per
    character in Chinese and Japanese."""
    import jiwer

    ref, hyp = normalize_words(reference), normalize_words(hypothesis)
    if not ref:
        return 0.0 if not hyp else 1.0
    return float(jiwer.wer(ref, hyp or ""))


def speaker_similarity(engine, voice, audio: np.ndarray, sample_rate: int) -> float:
    """Cosine similarity of the voice's speaker embedding and the audio's (the engine's ECAPA)."""
    made = engine.embed_voice(audio, sample_rate).speaker_embedding.astype(np.float64).ravel()
    want = np.asarray(voice.speaker_embedding, dtype=np.float64).ravel()
    return float(made @ want / (np.linalg.norm(made) * np.linalg.norm(want) + 1e-12))


@dataclass(frozen=True)
class OutputCheck:
    transcript: str
    word_error_rate: float
    speaker_similarity: float | None = None
    flags: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.flags

    def describe(self) -> str:
        parts = [f"word error rate {100 * self.word_error_rate:.0f} %"]
        if self.speaker_similarity is not None:
            parts.append(f"speaker similarity {self.speaker_similarity:.2f}")
        return ", ".join(parts) + ("" if self.ok else ": " + "; ".join(self.flags))


def check_output(transcriber, text: str, audio: np.ndarray, sample_rate: int, engine=None, voice=None,
                 language: str | None = None) -> OutputCheck:
    """Transcribes `audio` and compares it with `text`; with `engine` and `voice`, also the speaker."""
    heard = transcriber.transcribe(audio, sample_rate, language)
    wer = word_error_rate(text, heard.text)
    flags = []
    if wer > MAX_WORD_ERROR_RATE:
        flags.append(f"the speech does not match the text (word error rate {100 * wer:.0f} % > "
                     f"{100 * MAX_WORD_ERROR_RATE:.0f} %): a garbled or runaway passage?")
    similarity = None
    if engine is not None and voice is not None and audio.size >= sample_rate:   # the encoder needs 1 s
        similarity = speaker_similarity(engine, voice, audio, sample_rate)
        if similarity < MIN_SPEAKER_SIMILARITY:
            flags.append(f"the voice drifted from the reference (speaker similarity {similarity:.2f} < "
                         f"{MIN_SPEAKER_SIMILARITY})")
    return OutputCheck(heard.text, wer, similarity, tuple(flags))
