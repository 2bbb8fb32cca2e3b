"""Long text: sentences and synthesis segments, and how long a text takes to speak.

A long text is spoken as several requests, one after the other in the same stream (see
synthesis.Synthesis). Each request ("segment") is made of whole sentences, up to a length measured
in speech units: a rough estimate of speaking time, so that Latin and CJK scripts get segments
of similar duration. One unit is one Latin character (English is spoken at ~15 characters per
second); a CJK ideograph counts 3 (Mandarin is ~4-5 characters per second), kana and hangul 2.

MAX_SEGMENT_UNITS = 300 is about 20 s of speech: long enough that most paragraphs are spoken
in one or two requests with their natural sentence-to-sentence prosody (each join is a fresh
start of the model), short enough that (a) a request that runs on without EOS stops at its own
frame cap (3 s + 1 s per text token, ~100 tokens here) instead of one sized for the whole text,
(b) the talker's KV cache, sized prefill + frame cap, stays small, and (c) sampling drift in
voice and pace, which grows over long generations, is re-anchored on the voice prompt every
~20 s. Pieces under MIN_SEGMENT_UNITS (~1 s: "Okay.", a heading) are merged into a neighbour.
"""
from __future__ import annotations

import bisect
import unicodedata

from .text import TextError, check_text, has_speech, is_silent

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
        if is_silent(ch):
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
    check_text(text, "text")
    if not has_speech(text):
        if all(ch.isspace() or is_silent(ch) for ch in text):
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
