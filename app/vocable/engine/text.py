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

import bisect
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


def _is_silent(ch: str) -> bool:
    """A character with no sound and no width: a control or format character (zero-width space
    and joiners, direction marks, soft hyphen, ...) or a variation selector."""
    o = ord(ch)
    return (unicodedata.category(ch) in ("Cc", "Cf") and not ch.isspace()
            or 0xFE00 <= o <= 0xFE0F or 0xE0100 <= o <= 0xE01EF)


def has_speech(text: str) -> bool:
    """Whether `text` has something to speak: a letter, a digit or a symbol ("%", "+", an
    emoji). Punctuation, spaces and invisible characters alone are not speech."""
    return any(unicodedata.category(ch)[0] in "LNS" for ch in text)


def _check_text(text: object, what: str) -> str:
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
        return self._prompt(_check_text(text, "text"), TARGET_FORMAT, self._target_tail)

    def ref_prompt(self, ref_text: str) -> PromptIds:
        """`<|im_start|>assistant\\n{ref_text}<|im_end|>\\n`: text = ids[3:-2] (in-context cloning)."""
        return self._prompt(_check_text(ref_text, "reference transcript"), REF_FORMAT, self._ref_tail)



# -- long text: sentences and synthesis segments ---------------------------------------------------
#
# A long text is spoken as several requests, one after the other in the same stream (see
# engine.Synthesis). Each request ("segment") is made of whole sentences, up to a length measured
# in speech units: a rough estimate of speaking time, so that Latin and CJK scripts get segments
# of similar duration. One unit is one Latin character (English is spoken at ~15 characters per
# second); a CJK ideograph counts 3 (Mandarin is ~4-5 characters per second), kana and hangul 2.
#
# MAX_SEGMENT_UNITS = 300 is about 20 s of speech: long enough that most paragraphs are spoken
# in one or two requests with their natural sentence-to-sentence prosody (each join is a fresh
# start of the model), short enough that (a) a request that runs on without EOS stops at its own
# frame cap (3 s + 1 s per text token, ~100 tokens here) instead of one sized for the whole text,
# (b) the talker's KV cache, sized prefill + frame cap, stays small, and (c) sampling drift in
# voice and pace, which grows over long generations, is re-anchored on the voice prompt every
# ~20 s. Pieces under MIN_SEGMENT_UNITS (~1 s: "Okay.", a heading) are merged into a neighbour.

MAX_SEGMENT_UNITS = 300
SPEECH_SECONDS_PER_UNIT = 20.0 / MAX_SEGMENT_UNITS
MIN_SEGMENT_UNITS = 16
WORD_UNITS = 5  # a short word read out ("seven", "percent")

# Sentence ends that need a following space (or end of text) in Latin and other spaced scripts.
_SPACED_TERMINALS = ".!?\u2026\u0964\u0965\u061f\u06d4\u0589\u1362"  # . ! ? … । ॥ ؟ ۔ ։ ።
# Sentence ends of unspaced scripts (CJK): a boundary wherever they stand.
_CJK_TERMINALS = "\u3002\uff01\uff1f\uff61\uff0e"  # 。！？｡．
# closing quotes and brackets: " ' ) ] } » ’ ” 」 』 】 〉 》 ） ］ ›
_CLOSERS = "\"')]}\u00bb\u2019\u201d\u300d\u300f\u3011\u3009\u300b\uff09\uff3d\u203a"
_OPENERS = "\"'([{\u00ab\u2018\u201c\u300c\u300e\u3010\u3008\u300a\uff08\uff3b\u2039"
# Clause punctuation where an over-long sentence may be cut (spaced forms need a space after).
_SPACED_CLAUSE = ",;:\u2014\u2013"  # , ; : — –
_CJK_CLAUSE = "\uff0c\u3001\uff1b\uff1a"  # ， 、 ； ：

# Never a sentence end after these (lower case, without the final period): titles before a
# name, and Latin abbreviations that run on.
_ABBREV_NEVER_END = frozenset("""mr mrs ms mx dr prof rev hon st sr jr gen col lt sgt capt cmdr adm gov sen rep
    pres supt fr mt ft messrs mme mlle e.g i.e cf vs viz approx ca esp incl""".split()) - {"sr", "jr"}
# Not a sentence end when a number follows ("No. 5", "Fig. 3", "Jan. 12", "p. 4").
_ABBREV_BEFORE_NUMBER = frozenset("""no nos fig figs eq eqs vol vols ch chap sec art p pp para op ed ver v
    jan feb mar apr jun jul aug sep sept oct nov dec""".split())


def _is_cjk(ch: str) -> bool:
    o = ord(ch)
    return (0x3400 <= o <= 0x9FFF or 0xF900 <= o <= 0xFAFF or 0x20000 <= o <= 0x3134F  # ideographs
            or 0x3040 <= o <= 0x30FF or 0x31F0 <= o <= 0x31FF  # kana
            or 0xAC00 <= o <= 0xD7AF or 0x1100 <= o <= 0x11FF or 0x3130 <= o <= 0x318F  # hangul
            or 0x3000 <= o <= 0x303F or 0xFF00 <= o <= 0xFFEF)  # CJK punctuation, full-width forms


def speech_units(text: str) -> int:
    """A rough measure of how long `text` takes to speak (see MAX_SEGMENT_UNITS): 1 per
    character, 3 per CJK ideograph, 2 per kana or hangul syllable; a run of spaces counts 1,
    invisible characters (zero-width, control, format) nothing."""
    units = 0
    prev_space = False
    for ch in text:
        o = ord(ch)
        if _is_silent(ch):
            continue
        if ch.isspace():
            units += 0 if prev_space else 1
            prev_space = True
            continue
        prev_space = False
        if 0x3400 <= o <= 0x9FFF or 0xF900 <= o <= 0xFAFF or 0x20000 <= o <= 0x3134F:
            units += 3
        elif 0x3040 <= o <= 0x30FF or 0xAC00 <= o <= 0xD7AF:
            units += 2
        else:
            units += 1
    return units


def expected_speech_seconds(text: str) -> float:
    """About how long `text` takes to speak: MAX_SEGMENT_UNITS speech units are about 20 s."""
    return speech_units(text) * SPEECH_SECONDS_PER_UNIT


def longest_speech_seconds(text: str) -> float:
    """expected_speech_seconds with every digit and symbol read out as a word of WORD_UNITS
    ("7": "seven", "%": "percent", "1984": four words at most): a bound for texts of numbers,
    where the expected length is far too short."""
    words = sum(1 for ch in text if unicodedata.category(ch)[0] in "NS")
    return (speech_units(text) + (WORD_UNITS - 1) * words) * SPEECH_SECONDS_PER_UNIT


def _word_before(s: str, i: int) -> str:
    """The word ending just before s[i] (a period), without opening quotes or brackets."""
    j = i
    while j > 0 and not s[j - 1].isspace():
        j -= 1
    return s[j:i].lstrip(_OPENERS)


def _is_sentence_end(s: str, i: int, j: int, k: int) -> bool:
    """s[i:j] is terminal punctuation (plus closers) and s[k] the next non-space character."""
    nxt = s[k]
    if nxt.islower():
        return False  # "e.g. the", "etc. and", "Hello... world": the sentence runs on
    if s[i] != "." or (j > i + 1 and s[i + 1] == "."):
        return True  # ! ? … and "..." before a capital or a digit
    word = _word_before(s, i)
    low = word.lower()
    if low in _ABBREV_NEVER_END:
        return False
    if nxt.isdigit() and low in _ABBREV_BEFORE_NUMBER:
        return False
    if len(word) == 1 and word.isalpha():
        return False  # an initial: "J. R. R. Tolkien"
    if "." in word and all(len(part) == 1 and part.isalpha() for part in word.split(".")):
        return False  # dotted acronym: "U.S.", "e.g." spelled with capitals
    return True


def _sentence_spans(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """Sentence spans of text[start:end] (one paragraph), at terminal punctuation and at line
    breaks, except where a line break looks like hard wrapping (the line has no final
    punctuation and the next one starts in lower case)."""
    spans: list[tuple[int, int]] = []
    s = text
    begin = start
    i = start
    while i < end:
        ch = s[i]
        if ch in _CJK_TERMINALS or ch in _SPACED_TERMINALS:
            j = i + 1
            while j < end and (s[j] in _SPACED_TERMINALS or s[j] in _CJK_TERMINALS):
                j += 1
            while j < end and s[j] in _CLOSERS:
                j += 1
            if j >= end:
                break
            if ch in _CJK_TERMINALS or _is_cjk(s[j]) and not s[j].isspace():
                spans.append((begin, j))
                begin = i = j
                continue
            if s[j].isspace():
                k = j
                while k < end and s[k].isspace():
                    k += 1
                if k >= end:
                    break
                if "\n" in s[j:k] or _is_sentence_end(s, i, j, k):
                    spans.append((begin, j))
                    begin = i = k
                    continue
            i = j
            continue
        if ch == "\n":
            k = i
            while k < end and s[k].isspace():
                k += 1
            if k >= end:
                break
            p = i
            while p > begin and s[p - 1].isspace():
                p -= 1
            last = s[p - 1] if p > begin else ""
            wrapped = s[k].islower() and last not in _SPACED_CLAUSE + _CJK_CLAUSE
            if not wrapped and p > begin:
                spans.append((begin, p))
                begin = i = k
                continue
        i += 1
    spans.append((begin, end))
    out = []
    for a, b in spans:  # trim spaces
        while a < b and s[a].isspace():
            a += 1
        while b > a and s[b - 1].isspace():
            b -= 1
        if a < b:
            out.append((a, b))
    return out


def _paragraph_spans(text: str) -> list[tuple[int, int]]:
    """Spans of the paragraphs of `text`: separated by blank lines."""
    import re

    spans = []
    pos = 0
    for m in re.finditer(r"\n[ \t\r\f\v]*\n\s*", text):
        spans.append((pos, m.start()))
        pos = m.end()
    spans.append((pos, len(text)))
    return [(a, b) for a, b in spans if text[a:b].strip()]


def split_sentences(text: str) -> list[str]:
    """The sentences of `text`, in order, trimmed: at . ! ? … (not after abbreviations such as
    "Dr." or "e.g.", initials, or before a lower-case word), at CJK 。！？, at line breaks
    (unless hard-wrapped) and at paragraphs. Joined with spaces they hold all the words."""
    return [text[a:b] for p0, p1 in _paragraph_spans(text) for a, b in _sentence_spans(text, p0, p1)]


def _cut_points(s: str, a: int, b: int) -> tuple[list[int], list[int]]:
    """Where s[a:b] may be cut: after clause punctuation, and at spaces (positions of the cut)."""
    clause, spaces = [], []
    for i in range(a + 1, b - 1):
        ch = s[i]
        if ch in _CJK_CLAUSE:
            clause.append(i + 1)
        elif ch in _SPACED_CLAUSE and s[i + 1].isspace():
            clause.append(i + 1)
        elif ch.isspace() and not s[i - 1].isspace() and s[i - 1] not in _SPACED_CLAUSE:
            spaces.append(i)
    return clause, spaces


def _prefix_units(s: str, a: int, b: int) -> list[int]:
    """speech_units(s[a:a + k]) for k in 0 .. b - a."""
    out = [0]
    for k in range(a, b):
        out.append(out[-1] + (0 if s[k].isspace() and k > a and s[k - 1].isspace() else speech_units(s[k])))
    return out


def _fewest_balanced_cuts(points: list[int], spaces: set[int], pre: list[int], a: int, b: int,
                          max_units: int) -> list[int] | None:
    """Cut positions among `points` that give the fewest pieces of at most max_units, then the
    fewest cuts at spaces (clause punctuation is the better place), then the most even pieces
    (least sum of squared sizes). None if some stretch has no point to cut at."""
    pos = [a] + points + [b]
    best: list[tuple | None] = [None] * len(pos)
    best[0] = (0, 0, 0, -1)
    for j in range(1, len(pos)):
        for i in range(j - 1, -1, -1):
            piece = pre[pos[j] - a] - pre[pos[i] - a]
            if piece > max_units:
                break
            if best[i] is None:
                continue
            n, n_space, sq, _ = best[i]
            cand = (n + 1, n_space + (pos[j] in spaces), sq + piece * piece, i)
            if best[j] is None or cand[:3] < best[j][:3]:
                best[j] = cand
    if best[-1] is None:
        return None
    cuts, j = [], len(pos) - 1
    while j > 0:
        j = best[j][3]
        cuts.append(pos[j])
    return sorted(cuts)[1:]


def _split_long(s: str, a: int, b: int, max_units: int) -> list[tuple[int, int]]:
    """Cuts the over-long sentence s[a:b] into the fewest, most even pieces of at most max_units:
    at clause punctuation where possible, else also at spaces, else (unspaced text without
    punctuation) at even lengths."""
    if speech_units(s[a:b]) <= max_units:
        return [(a, b)]
    pre = _prefix_units(s, a, b)
    clause, spaces = _cut_points(s, a, b)
    cuts = _fewest_balanced_cuts(clause, set(), pre, a, b, max_units)
    if cuts is None:
        cuts = _fewest_balanced_cuts(sorted(clause + spaces), set(spaces), pre, a, b, max_units)
    if cuts is None:
        n = -(-pre[-1] // max_units)
        cuts = [a + bisect.bisect_left(pre, pre[-1] * m / n) for m in range(1, n)]
    pieces = []
    for c0, c1 in zip([a] + cuts, cuts + [b]):
        while c0 < c1 and s[c0].isspace():
            c0 += 1
        while c1 > c0 and s[c1 - 1].isspace():
            c1 -= 1
        if c0 < c1:
            pieces.append((c0, c1))
    return pieces


def split_for_synthesis(text: str, max_units: int = MAX_SEGMENT_UNITS,
                        min_units: int = MIN_SEGMENT_UNITS) -> list[str]:
    """The segments a long text is spoken in, one request each (see MAX_SEGMENT_UNITS).

    A text of at most `max_units` is one segment, returned exactly as given. A longer one is cut
    into sentences (split_sentences); a sentence over `max_units` is cut at clause punctuation,
    else at spaces; then consecutive sentences of a paragraph are packed into segments of at
    most `max_units`, and a piece under `min_units` joins a neighbour (even across a paragraph,
    or slightly over `max_units`). Each segment is a trimmed slice of the original text, so line
    breaks and spacing inside it are kept. A segment with nothing to speak (a rule of "-----",
    a run of invisible characters) is left out: the model would only babble or run on there."""
    if max_units < 2 * min_units:
        raise ValueError("max_units must be at least twice min_units")
    _check_text(text, "text")
    if not has_speech(text):
        if all(ch.isspace() or _is_silent(ch) for ch in text):
            raise TextError("the text is only invisible characters (zero-width or control characters): "
                            "give some words to speak")
        raise TextError("the text has nothing to speak (no letters, digits or symbols): give some words to speak")
    if speech_units(text) <= max_units:
        return [text]
    # (start, end, starts_paragraph) per piece
    pieces: list[tuple[int, int, bool]] = []
    for p0, p1 in _paragraph_spans(text):
        first = True
        for a, b in _sentence_spans(text, p0, p1):
            for c, d in _split_long(text, a, b, max_units):
                pieces.append((c, d, first))
                first = False
    segments: list[list[int]] = []  # [start, end]
    for a, b, new_paragraph in pieces:
        if segments:
            cur = segments[-1]
            joined = speech_units(text[cur[0]:b])
            tiny = speech_units(text[cur[0]:cur[1]]) < min_units or speech_units(text[a:b]) < min_units
            if (joined <= max_units and not new_paragraph) or (tiny and joined <= max_units + min_units):
                cur[1] = b
                continue
        segments.append([a, b])
    # a tiny last segment joins the one before it
    if len(segments) > 1 and speech_units(text[segments[-1][0]:segments[-1][1]]) < min_units:
        last = segments.pop()  # popped first: in one statement the target would be read after the pop
        segments[-1][1] = last[1]
    return [text[a:b] for a, b in segments if has_speech(text[a:b])]
