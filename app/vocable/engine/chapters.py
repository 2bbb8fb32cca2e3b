"""A long text's chapters: Markdown headings ("# Title" to "###### Title" at the start of a
line, outside fenced code blocks) start them. The heading is spoken as the chapter's first
sentence, without its marks, and names the chapter in an audiobook's chapter list or its file
name; text before the first heading is a chapter of its own. A text without headings is one
chapter with no title, exactly as given.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .sentences import MIN_SEGMENT_UNITS, speech_units
from .text import has_speech

# ATX headings as CommonMark has them: up to three spaces, 1 to 6 '#', then a space or the end
# of the line; a closing run of '#' is not part of the title.
_HEADING = re.compile(r"^ {0,3}#{1,6}(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_SENTENCE_END = ".!?…。！？:;"
MAX_TITLE_CHARS = 200


@dataclass(frozen=True)
class Chapter:
    title: str   # "" for text before the first heading, or a text without headings
    text: str    # what is spoken: the title as a sentence, then the chapter's body


def _headings(lines: list[str]) -> list[tuple[int, str]]:
    """(line index, title) of every heading line outside fenced code blocks."""
    found, fence = [], None
    for i, line in enumerate(lines):
        opened = _FENCE.match(line)
        if fence is not None:
            if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence):
                fence = None
            continue
        if opened:
            fence = opened.group(1)
            continue
        heading = _HEADING.match(line)
        if heading:
            found.append((i, " ".join((heading.group(1) or "").split())[:MAX_TITLE_CHARS]))
    return found


def _spoken(title: str, body: str) -> str:
    spoken_title = title if not title or title[-1] in _SENTENCE_END else title + "."
    return "\n\n".join(part for part in (spoken_title, body) if part)


def _joined_title(first: str, second: str) -> str:
    return " – ".join(t for t in (first, second) if t)[:MAX_TITLE_CHARS]


def split_chapters(text: str) -> list[Chapter]:
    """The chapters of `text`, in order. Chapters with nothing to speak (an empty heading, a body
    of only punctuation) are left out, and one too short to be spoken alone (a heading without a
    body, under sentences.MIN_SEGMENT_UNITS) joins the next, the two titles joined, as the
    segments of a text do."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    headings = _headings(lines)
    if not headings:
        return [Chapter("", text)]
    parts = []  # (title, body)
    lead = "\n".join(lines[:headings[0][0]]).strip()
    if has_speech(lead):
        parts.append(("", lead))
    for n, (line, title) in enumerate(headings):
        end = headings[n + 1][0] if n + 1 < len(headings) else len(lines)
        body = "\n".join(lines[line + 1:end]).strip()
        if has_speech(_spoken(title, body)):
            parts.append((title, body))
    chapters: list[Chapter] = []
    pending: Chapter | None = None   # a chapter too short to speak alone, waiting for the next
    for title, body in parts:
        spoken = _spoken(title, body)
        if pending is not None:
            title, spoken = _joined_title(pending.title, title), pending.text + "\n\n" + spoken
            pending = None
        if speech_units(spoken) < MIN_SEGMENT_UNITS:
            pending = Chapter(title, spoken)
        else:
            chapters.append(Chapter(title, spoken))
    if pending is not None:   # a short last chapter joins the one before
        last = chapters.pop() if chapters else Chapter("", "")
        chapters.append(Chapter(_joined_title(last.title, pending.title),
                                "\n\n".join(t for t in (last.text, pending.text) if t)))
    return chapters or [Chapter("", text)]
