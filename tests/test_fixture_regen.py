"""With the official PyTorch package available, regenerate both fixtures and check that the
committed reference tensors still match it (the parity tests compare against these)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import REPO, VARIANTS, fixture_dir


def reference_python() -> str | None:
    """A Python with torch and qwen-tts: $VOCABLE_REFERENCE_PYTHON, or this one if it has them."""
    candidate = os.environ.get("VOCABLE_REFERENCE_PYTHON") or sys.executable
    # qwen_tts itself imports only with the generator's stubs for its 25 Hz tokenizer's extras
    probe = subprocess.run([candidate, "-c", "import importlib.util as u, torch, transformers; "
                            "assert u.find_spec('qwen_tts')"], capture_output=True)
    return candidate if probe.returncode == 0 else None


@pytest.mark.reference
@pytest.mark.parametrize("variant", VARIANTS)
def test_fixtures_regenerate_identically(variant):
    python = reference_python()
    if python is None:
        pytest.skip("torch and qwen-tts are not installed (set VOCABLE_REFERENCE_PYTHON)")
    proc = subprocess.run([python, str(REPO / "tools" / "fixtures" / "make_fixtures.py"), "--check",
                           str(fixture_dir(variant))], capture_output=True, text=True, timeout=900)
    print(proc.stdout[-3000:], proc.stderr[-3000:])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
