"""The engine checks a voice before it uses it, whatever the Python side let through: a damaged
voice (codes outside the codebook, a non-finite embedding) is a clear error, never a crash. Each
synthesis runs in a subprocess, so a crash fails the test instead of killing the run. The
voices are built in Python and then damaged in place, past the Python checks, as a bug or a
foreign caller of the engine would hand them over."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

SYNTHESIZE = """
import json, sys
import numpy as np
from vocable import Engine, Voice, VocableError
from conftest import reference
voice = Voice(reference("0.6b", "speaker_embedding"), reference("0.6b", "ref_codes").astype(np.int32), "Okay.")
damage = sys.argv[2]
if damage.startswith("code="):
    voice.codes[1, 0] = int(damage[5:])
elif damage.startswith("rest_code="):
    voice.codes[1, 3] = int(damage[10:])
elif damage == "nan_embedding":
    voice.speaker_embedding[5] = np.nan
with Engine(sys.argv[1], threads=1) as engine:
    try:
        engine.synthesize("Hello there.", voice, greedy=True, max_frames=4).result()
        print(json.dumps({"ok": True}))
    except VocableError as e:
        print(json.dumps({"ok": False, "error": str(e)}))
"""


def synthesize_with(model, damage: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", SYNTHESIZE, str(model), damage], capture_output=True, text=True,
                          timeout=300, cwd=str(__import__("pathlib").Path(__file__).parent))
    assert proc.returncode == 0, f"synthesis with {damage} crashed (exit {proc.returncode}):\n{proc.stderr[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_an_undamaged_voice_speaks(converted):
    assert synthesize_with(converted("0.6b", "f32"), "none") == {"ok": True}


# Codebook 0 has 2048 codes like the others; 2048-3071 are the talker's control ids, which
# the codec decoder cannot look up (they aborted synthesis).
@pytest.mark.parametrize("damage", ["code=2048", "code=3071", "code=-1", "rest_code=2048", "code=70000"])
def test_a_voice_code_outside_the_codebook_is_refused(converted, damage):
    result = synthesize_with(converted("0.6b", "f32"), damage)
    assert not result["ok"] and "out of range" in result["error"], result


def test_a_non_finite_embedding_is_refused(converted):
    result = synthesize_with(converted("0.6b", "f32"), "nan_embedding")
    assert not result["ok"] and "not a finite number" in result["error"], result
