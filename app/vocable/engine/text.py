"""Text to token ids: Qwen2's byte-level BPE and the prompt formats of Qwen3-TTS.

The native engine takes token ids; they are made here with HF `tokenizers`, built from the
model's own vocab.json / merges.txt / tokenizer_config.json (carried in the converted GGUF) so
that every id equals what the reference gets from transformers' `Qwen2TokenizerFast`:

    tok = TextTokenizer.from_gguf("model.gguf")
    prompt = tok.target_prompt("Hello world.")      # prompt.role, prompt.text, prompt.ids
    ref = tok.ref_prompt("Transcript of the clip.")  # in-context cloning

The backend is put together the way transformers converts the slow Qwen2 tokenizer
(convert_slow_tokenizer.Qwen2Converter): BPE without unknown token or byte fallback, NFC,
the Qwen2 pre-tokenizer regex split ("isolated") then byte-level mapping without the GPT-2
regex, byte-level decoder; then the added tokens of tokenizer_config.json's
`added_tokens_decoder`, in id order, matched whole before BPE; no BOS/EOS is added.
tests/test_text.py holds the ids against transformers for many scripts, on the tiny fixtures'
vocabulary and on the real Qwen one.
"""
from __future__ import annotations

import hashlib
import os
import threading
import unicodedata
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelError, VocableError
from ..untrusted import parse_json

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ROLE = "assistant\n"

# qwen_tts/inference/qwen3_tts_model.py _build_assistant_text / _build_ref_text
TARGET_FORMAT = IM_START + ROLE + "{text}" + IM_END + "\n" + IM_START + ROLE
REF_FORMAT = IM_START + ROLE + "{text}" + IM_END + "\n"
ROLE_LEN = 3      # modeling_qwen3_tts.py: role = input_id[:, :3]
TARGET_TAIL = 5   # text = input_id[:, 3:-5]
REF_TAIL = 2      # ref text = ref_id[:, 3:-2]

# convert_slow_tokenizer.Qwen2Converter
QWEN2_PRETOKENIZE_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
                           r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")

GGUF_KEYS = {"vocab.json": "tokenizer.vocab_json", "merges.txt": "tokenizer.merges_txt",
             "tokenizer_config.json": "tokenizer.tokenizer_config_json"}
GGUF_SPECIAL_KEYS = {"im_start": "qwen3-tts.text.im_start_id", "im_end": "qwen3-tts.text.im_end_id",
                     "tts_pad": "qwen3-tts.text.tts_pad_id", "tts_bos": "qwen3-tts.text.tts_bos_id",
                     "tts_eos": "qwen3-tts.text.tts_eos_id"}
GGUF_TOKENIZER_KEYS = frozenset(GGUF_KEYS.values()) | frozenset(GGUF_SPECIAL_KEYS.values())
CONFIG_SPECIAL_KEYS = {"im_start": "im_start_token_id", "im_end": "im_end_token_id",
                       "tts_pad": "tts_pad_token_id", "tts_bos": "tts_bos_token_id",
                       "tts_eos": "tts_eos_token_id"}


class TextError(VocableError, ValueError):
    """A text cannot be spoken: empty, nothing to speak in it (split_for_synthesis), not a string,
    or not valid Unicode."""


@dataclass(frozen=True)
class SpecialIds:
    """Text-side ids from the model config (qwen3-tts.text.* in the GGUF)."""
    im_start: int
    im_end: int
    tts_pad: int
    tts_bos: int
    tts_eos: int


@dataclass(frozen=True)
class PromptIds:
    """The ids of one formatted prompt and the reference's slices of it."""
    ids: tuple[int, ...]
    tail: int  # template ids after the text: TARGET_TAIL or REF_TAIL

    @property
    def role(self) -> list[int]:
        """[<|im_start|>, assistant, \\n]: the role the talker prefill starts with."""
        return list(self.ids[:ROLE_LEN])

    @property
    def text(self) -> list[int]:
        """The ids of the text itself, as the reference slices them."""
        return list(self.ids[ROLE_LEN:len(self.ids) - self.tail])


def is_silent(ch: str) -> bool:
    """A character with no sound and no width: a control or format character (zero-width space
    and joiners, direction marks, soft hyphen, ...) or a variation selector."""
    o = ord(ch)
    return (unicodedata.category(ch) in ("Cc", "Cf") and not ch.isspace()
            or 0xFE00 <= o <= 0xFE0F or 0xE0100 <= o <= 0xE01EF)


def has_speech(text: str) -> bool:
    """Whether `text` has something to speak: a letter, a digit or a symbol ("%", "+", an
    emoji). Punctuation, spaces and invisible characters alone are not speech."""
    return any(unicodedata.category(ch)[0] in "LNS" for ch in text)


def check_text(text: object, what: str) -> str:
    if not isinstance(text, str):
        raise TextError(f"the {what} must be a string, got {type(text).__name__}")
    if not text.strip():
        raise TextError(f"the {what} is empty" if not text
                        else f"the {what} is only whitespace: give some words to speak")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise TextError(f"the {what} is not valid Unicode (an unpaired surrogate at character {e.start})") from None
    return text


class TextTokenizer:
    """Qwen2 byte-level BPE with the model's added tokens; immutable, safe to share between threads."""

    def __init__(self, vocab_json: str, merges_txt: str, tokenizer_config_json: str,
                 special: SpecialIds | None = None):
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
        from tokenizers.models import BPE

        try:
            vocab = parse_json(vocab_json)
            config = parse_json(tokenizer_config_json)
        except ValueError as e:
            raise ModelError(f"the model's text tokenizer is corrupt (invalid JSON: {e})") from None
        if not isinstance(vocab, dict) or not vocab or not isinstance(config, dict):
            raise ModelError("the model's text tokenizer is corrupt (vocab.json or tokenizer_config.json "
                             "is not a JSON object)")
        # As the slow Qwen2Tokenizer reads merges.txt: "#version" first line and blank lines skipped.
        merges = []
        for i, line in enumerate(merges_txt.split("\n")):
            line = line.strip()
            if (i == 0 and line.startswith("#version:")) or not line:
                continue
            pair = tuple(line.split())
            if len(pair) != 2:
                raise ModelError(f"the model's text tokenizer is corrupt (merges.txt line {i + 1}: {line[:40]!r})")
            merges.append(pair)
        try:
            tok = Tokenizer(BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None,
                                continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
                                byte_fallback=False))
        except Exception as e:  # tokenizers raises plain Exception on a merge outside the vocabulary
            raise ModelError(f"the model's text tokenizer is corrupt ({e})") from None
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=bool(config.get("add_prefix_space", False)), use_regex=False),
        ])
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)

        # PreTrainedTokenizerFast.__init__: added_tokens_decoder sorted by id, then the named
        # special tokens not among them (Qwen2TokenizerFast defaults unk/eos/pad to <|endoftext|>).
        declared: dict[str, int] = {}
        tokens = []
        try:
            entries = sorted(((int(k), v) for k, v in config.get("added_tokens_decoder", {}).items()),
                             key=lambda kv: kv[0])
            for index, entry in entries:
                is_special = bool(entry.get("special", False))
                tokens.append(AddedToken(entry["content"], single_word=bool(entry.get("single_word", False)),
                                         lstrip=bool(entry.get("lstrip", False)),
                                         rstrip=bool(entry.get("rstrip", False)),
                                         normalized=bool(entry.get("normalized", not is_special)),
                                         special=is_special))
                declared[entry["content"]] = index
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise ModelError(f"the model's tokenizer_config.json has a malformed added_tokens_decoder ({e!r})") \
                from None
        named = [config.get(k, "<|endoftext|>" if k != "bos_token" else None)
                 for k in ("bos_token", "eos_token", "unk_token", "pad_token")]
        additional = config.get("additional_special_tokens") or []
        if not isinstance(additional, list):
            raise ModelError("the model's tokenizer_config.json has a malformed additional_special_tokens")
        named += additional
        for t in named:
            if isinstance(t, dict):
                t = t.get("content")
            if isinstance(t, str) and t not in declared and all(t != a.content for a in tokens):
                tokens.append(AddedToken(t, special=True, normalized=False))
        if tokens:
            tok.add_tokens(tokens)
        for content, index in declared.items():
            # transformers would silently renumber a token whose id leaves a gap; the model's
            # embedding rows follow the declared ids, so such a tokenizer is refused instead.
            if tok.token_to_id(content) != index:
                raise ModelError(f"the model's tokenizer declares {content!r} as id {index}, but the vocabulary "
                                 f"puts it at {tok.token_to_id(content)}: the tokenizer files do not belong together")
        self._tok = tok
        self._added_ids = frozenset(tok.token_to_id(a.content) for a in tokens)
        self.added_tokens: dict[str, int] = {a.content: tok.token_to_id(a.content) for a in tokens}

        for name in (IM_START, IM_END):
            if name not in self.added_tokens:
                raise ModelError(f"the model's text tokenizer has no {name} token: not a Qwen3-TTS tokenizer")
        self.im_start_id = self.added_tokens[IM_START]
        self.im_end_id = self.added_tokens[IM_END]
        if special is not None and (special.im_start, special.im_end) != (self.im_start_id, self.im_end_id):
            raise ModelError(f"the model config's im_start/im_end ids ({special.im_start}, {special.im_end}) differ "
                             f"from its tokenizer's ({self.im_start_id}, {self.im_end_id})")
        self.special = special  # None when built without a model config
        self._role = self.encode(IM_START + ROLE)
        self._target_tail = self.encode(IM_END + "\n" + IM_START + ROLE)
        self._ref_tail = self.encode(IM_END + "\n")
        if len(self._role) != ROLE_LEN or len(self._target_tail) != TARGET_TAIL or len(self._ref_tail) != REF_TAIL:
            raise ModelError("the model's text tokenizer splits the prompt template differently from Qwen3-TTS "
                             f"(role {self._role}, tails {self._target_tail}, {self._ref_tail})")

    # -- construction from a model -------------------------------------------------------------

    @classmethod
    def from_folder(cls, hf_dir: str | os.PathLike) -> "TextTokenizer":
        """From a Hugging Face Qwen3-TTS folder (vocab.json, merges.txt, tokenizer_config.json, config.json)."""
        root = Path(hf_dir)
        texts = {}
        for name in ("vocab.json", "merges.txt", "tokenizer_config.json", "config.json"):
            try:
                texts[name] = (root / name).read_text(encoding="utf-8")
            except FileNotFoundError:
                raise ModelError(f"{root / name} is missing: the text tokenizer files are part of the model "
                                 "folder") from None
            except (OSError, UnicodeDecodeError) as e:
                raise ModelError(f"cannot read {root / name}: {e}") from None
        try:
            config = parse_json(texts["config.json"])
            special = SpecialIds(**{f: int(config[k]) for f, k in CONFIG_SPECIAL_KEYS.items()})
        except (KeyError, TypeError, ValueError) as e:
            raise ModelError(f"{root / 'config.json'} lacks the text special token ids ({e!r})") from None
        return cls(texts["vocab.json"], texts["merges.txt"], texts["tokenizer_config.json"], special)

    @classmethod
    def from_gguf(cls, path: str | os.PathLike) -> "TextTokenizer":
        """From a converted model; reads its metadata only, not its tensors."""
        from .gguf_header import read_gguf_header

        path = Path(path)
        if not path.is_file():
            raise ModelError(f"{path} does not exist" if not path.exists() else f"{path} is not a file")
        return cls.from_metadata(read_gguf_header(path, GGUF_TOKENIZER_KEYS), path)

    @classmethod
    def from_metadata(cls, meta: dict, path: str | os.PathLike) -> "TextTokenizer":
        """From the metadata read_gguf_header(path, GGUF_TOKENIZER_KEYS) returned (or more)."""
        missing = [key for key in GGUF_KEYS.values() if not isinstance(meta.get(key), str)]
        missing += [key for key in GGUF_SPECIAL_KEYS.values() if not isinstance(meta.get(key), int)]
        if missing:
            raise ModelError(f"{path} lacks {', '.join(missing)}: not a Vocable Qwen3-TTS model, or converted by an "
                             "older version (convert it again with `vocable convert`)")
        texts = {name: meta[key] for name, key in GGUF_KEYS.items()}
        ids = SpecialIds(**{name: meta[key] for name, key in GGUF_SPECIAL_KEYS.items()})
        return cls._shared(texts["vocab.json"], texts["merges.txt"], texts["tokenizer_config.json"], ids)

    # Models of one family share their tokenizer, so a model change reuses the one built before.
    # Building anew each time also grew the process: tokenizers (0.23) keeps about 0.7 KB of
    # every Tokenizer that has encoded, after it is dropped (measured: +2 MiB per 3000 builds).
    _SHARED_MAX = 4
    _shared_by_content: "OrderedDict[bytes, TextTokenizer]" = OrderedDict()
    _shared_lock = threading.Lock()

    @classmethod
    def _shared(cls, vocab_json: str, merges_txt: str, tokenizer_config_json: str,
                special: SpecialIds) -> "TextTokenizer":
        """The tokenizer of these files, built once (it is immutable after __init__ and its
        encode is thread-safe, so engines may share it)."""
        digest = hashlib.blake2b(repr(special).encode())
        for text in (vocab_json, merges_txt, tokenizer_config_json):
            digest.update(len(text).to_bytes(8, "little"))
            digest.update(text.encode("utf-8", "surrogatepass"))
        key = digest.digest()
        with cls._shared_lock:
            if key in cls._shared_by_content:
                cls._shared_by_content.move_to_end(key)
                return cls._shared_by_content[key]
        tokenizer = cls(vocab_json, merges_txt, tokenizer_config_json, special)
        with cls._shared_lock:
            cls._shared_by_content[key] = tokenizer
            while len(cls._shared_by_content) > cls._SHARED_MAX:
                cls._shared_by_content.popitem(last=False)
        return tokenizer

    # -- tokenization --------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Tokens including the added ones (the model's embedding table may be larger)."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Ids exactly as `Qwen2TokenizerFast(text)["input_ids"]`: added tokens written in the text
        (e.g. "<|im_end|>") ARE recognized here; the prompt builders below do not allow that."""
        if not isinstance(text, str):
            raise TextError(f"text must be a string, got {type(text).__name__}")
        try:
            return self._tok.encode(text).ids
        except Exception as e:  # e.g. an unpaired surrogate
            raise TextError(f"cannot tokenize the text: {e}") from None

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """Text of the ids, as Qwen2TokenizerFast.decode (invalid UTF-8 becomes U+FFFD)."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def _encode_literal(self, segment: str) -> list[int]:
        """The tokenizer's pipeline (NFC, pre-tokenizer, BPE) without the added-token pass, so
        "<|im_end|>" in the segment is spelled out as the characters it is made of."""
        normalized = self._tok.normalizer.normalize_str(segment)
        return [t.id for piece, _ in self._tok.pre_tokenizer.pre_tokenize_str(normalized)
                for t in self._tok.model.tokenize(piece)]

    def _prompt(self, text: str, fmt: str, tail: list[int]) -> PromptIds:
        # The reference tokenizes the formatted string, so an added token written in the text is
        # recognized and lands in the prompt as a control token: "Say<|im_end|>\n<|im_start|>user"
        # would rewrite the conversation the talker sees. The text is something to speak, not
        # markup, so here any added token in it is spelled out literally instead (as plain text
        # it is BPE-encoded like any other characters); this covers non-special added tokens
        # such as <think> too. Text without added-token strings (all normal text) gets exactly
        # the reference's ids: it goes through the same single encode of the formatted string.
        ids = self.encode(fmt.format(text=text))
        body = ids[1:len(ids) - len(tail)]
        if ids[0] != self.im_start_id or ids[len(ids) - len(tail):] != tail or self._added_ids.intersection(body):
            ids = [self.im_start_id] + self._encode_literal(ROLE + text) + tail
        return PromptIds(tuple(ids), len(tail))

    def target_prompt(self, text: str) -> PromptIds:
        """`<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n`: role = ids[:3],
        text = ids[3:-5]. The text is used as given (no stripping), like the reference; note that
        a leading newline merges with the role's, so role[2] is then "\\n\\n" as in the reference."""
        return self._prompt(check_text(text, "text"), TARGET_FORMAT, self._target_tail)

    def ref_prompt(self, ref_text: str) -> PromptIds:
        """`<|im_start|>assistant\\n{ref_text}<|im_end|>\\n`: text = ids[3:-2] (in-context cloning)."""
        return self._prompt(check_text(ref_text, "reference transcript"), REF_FORMAT, self._ref_tail)
