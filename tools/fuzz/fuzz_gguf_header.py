"""Fuzzes the Python side of reading a model: the GGUF header reader (models, about, the app's
model list) and the text tokenizer built from the header's tokenizer files. Any bytes give the
values or a ModelError."""
from vocable.errors import ModelError
from vocable.engine.gguf_header import read_gguf_header
from vocable.engine.text import GGUF_TOKENIZER_KEYS, TextTokenizer

from harness import ScratchFile, run

scratch = ScratchFile(".gguf")
KEYS = ("general.architecture", "general.name", "general.license", "qwen3-tts.model_size",
        "qwen3-tts.talker.language_names", *GGUF_TOKENIZER_KEYS)


def target(data: bytes) -> None:
    path = scratch.write(data)
    meta = read_gguf_header(path, KEYS)
    assert isinstance(meta, dict)
    if any(k in meta for k in GGUF_TOKENIZER_KEYS):
        TextTokenizer.from_metadata(meta, path).encode("Hello there.")


if __name__ == "__main__":
    run(target, (ModelError,))
