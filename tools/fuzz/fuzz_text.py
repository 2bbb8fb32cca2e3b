"""Fuzzes the text front end: sentence and segment splitting, the speech-length estimate, and
the prompt ids of the tiny model's tokenizer, on any text. Text with nothing to speak is a
TextError; anything else gives segments that keep all the speech."""
from pathlib import Path

import atheris

from vocable.engine.sentences import expected_speech_seconds, speech_units, split_for_synthesis
from vocable.engine.text import TextError, TextTokenizer, has_speech

from harness import run

TOKENIZER = TextTokenizer.from_folder(Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "tiny-0.6b" / "model")


def target(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    text = fdp.ConsumeUnicodeNoSurrogates(fdp.remaining_bytes())
    assert expected_speech_seconds(text) >= 0.0
    segments = split_for_synthesis(text)
    assert has_speech(text), "split_for_synthesis accepted text with nothing to speak"
    assert segments and all(has_speech(s) for s in segments)
    assert sum(speech_units(s) for s in segments) <= speech_units(text)
    ids = TOKENIZER.target_prompt(segments[0])
    assert all(0 <= i < TOKENIZER.vocab_size for i in ids.text)


if __name__ == "__main__":
    run(target, (TextError,))
