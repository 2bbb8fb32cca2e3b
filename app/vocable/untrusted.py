"""Parsing text from files Vocable did not write, so that any content fails the one way
callers handle."""
from __future__ import annotations

import json


def parse_json(text: str | bytes) -> object:
    """json.loads, where nesting too deep for the parser ("[[[[...") is a ValueError like any
    other malformed JSON, not a RecursionError (invalid UTF-8 is a ValueError already)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("the JSON is nested too deeply") from None
