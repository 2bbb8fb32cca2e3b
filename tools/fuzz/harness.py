"""Shared by the Python fuzz targets (atheris): each feeds every input to one reader of untrusted
files and lets only the project's own error types through; any other exception, a hang or a
crash is a finding. Run them through tools/fuzz.sh."""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Callable

import atheris


def run(target: Callable[[bytes], None], allowed: tuple[type[BaseException], ...]) -> None:
    """atheris.Fuzz over `target`, with the exceptions in `allowed` counted as clean answers.
    Everything loaded by then is instrumented for coverage (atheris.instrument_imports misses
    the modules of an editable install, which come through a custom loader)."""
    def one_input(data: bytes) -> None:
        try:
            target(data)
        except allowed:
            pass
    atheris.instrument_all()
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


class ScratchFile:
    """One file rewritten for every input (readers of untrusted files take paths)."""

    def __init__(self, suffix: str):
        fd, name = tempfile.mkstemp(prefix="vocable-fuzz-", suffix=suffix)
        os.close(fd)
        self.path = Path(name)

    def write(self, data: bytes) -> Path:
        self.path.write_bytes(data)
        return self.path
