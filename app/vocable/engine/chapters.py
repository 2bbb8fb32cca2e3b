"""A long text's chapters: Markdown headings ("# Title" to "###### Title" at the start of a
line) start them. The heading is spoken as the chapter's first sentence, without its marks, and
names the chapter in an audiobook's chapter list or its file name; text before the first heading
is a chapter of its own. A text without headings is one chapter with no title.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .text import has_speech

# ATX headings as CommonMark has them: up to three spaces, 1 to 6 '#', then a space or the end
# of the line; a closing run of '#' is not part of the title.
_HEADING = re.compile(r"^ {0,3}#{1,6}(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$", re.MULTILINE)
_SENTENCE_END = ".!?…。！？:;"


@dataclass(frozen=True)
class Chapter:
    title: str   # "" for text before the first heading, or a text without headings
    text: str    # what is spoken: the title as a sentence, then the chapter's body


def split_chapters(text: str) -> list[Chapter]:
    """The chapters of `text`, in order. Chapters with nothing to speak (an empty heading, a body
    of only punctuation) are left out; a text without headings comes back whole as one chapter."""
    headings = list(_HEADING.finditer(text))
    if not headings:
        return [Chapter("", text)]
    chapters = []
    lead = text[:headings[0].start()]
    if has_speech(lead):
        chapters.append(Chapter("", lead.strip()))
    for i, heading in enumerate(headings):
        title = " ".join((heading.group(1) or "").split())
        body = text[heading.end():headings[i + 1].start() if i + 1 < len(headings) else len(text)].strip()
        spoken_title = title if not title or title[-1] in _SENTENCE_END else title + "."
        spoken = "\n\n".join(part for part in (spoken_title, body) if part)
        if has_speech(spoken):
            chapters.append(Chapter(title, spoken))
    return chapters or [Chapter("", text)]
