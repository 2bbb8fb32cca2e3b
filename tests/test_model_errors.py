"""A missing, truncated or corrupted model gets a clear error, never a crash. Each load runs
in a subprocess so that a crash would fail the test instead of killing the run."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

LOAD = """
import json, sys
from vocable import Engine, ModelError
try:
    Engine(sys.argv[1], threads=1)
    print(json.dumps({"ok": True}))
except ModelError as e:
    print(json.dumps({"ok": False, "error": str(e)}))
"""


def try_load(path) -> dict:
    proc = subprocess.run([sys.executable, "-c", LOAD, str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"loading {path} crashed (exit {proc.returncode}):\n{proc.stderr[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_good_model_loads(converted):
    assert try_load(converted("0.6b", "q8_0")) == {"ok": True}


def test_missing_model(tmp_path):
    result = try_load(tmp_path / "missing.gguf")
    assert not result["ok"] and "not found" in result["error"]


def test_not_a_gguf(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_text("hello")
    result = try_load(path)
    assert not result["ok"] and "not a GGUF model" in result["error"]


@pytest.mark.parametrize("fraction", [0.0001, 0.001, 0.01, 0.2, 0.5, 0.9, 0.9999])
def test_truncated_model(converted, tmp_path, fraction):
    data = converted("0.6b", "q8_0").read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: max(4, int(len(data) * fraction))])
    result = try_load(path)
    assert not result["ok"]
    assert "truncated" in result["error"] or "corrupt" in result["error"], result["error"]
    assert str(path) in result["error"]


def tensor_spans(path):
    from gguf import GGUFReader
    r = GGUFReader(str(path))
    return r, [(t.name, int(t.data_offset), int(t.data_offset) + int(t.n_bytes)) for t in r.tensors]


@pytest.mark.parametrize("which", [0, 1, 7, 40, 99, -2])
def test_flipped_tensor_byte_is_caught(converted, tmp_path, which):
    path = converted("0.6b", "q8_0")
    _, spans = tensor_spans(path)
    spans = [s for s in spans if s[0] != "checksums"]
    name, begin, end = spans[which % len(spans)]
    data = bytearray(path.read_bytes())
    data[(begin + end) // 2] ^= 0x10
    bad = tmp_path / "flipped.gguf"
    bad.write_bytes(bytes(data))
    result = try_load(bad)
    assert not result["ok"]
    assert "corrupt" in result["error"] and name in result["error"], result["error"]


@pytest.mark.parametrize("fraction", [0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 0.99])
def test_flipped_header_byte_never_crashes(converted, tmp_path, fraction):
    path = converted("0.6b", "q8_0")
    _, spans = tensor_spans(path)
    header_end = min(begin for _, begin, _ in spans)
    data = bytearray(path.read_bytes())
    at = 4 + int((header_end - 5) * fraction)  # past the magic
    data[at] ^= 0xFF
    bad = tmp_path / "flipped.gguf"
    bad.write_bytes(bytes(data))
    result = try_load(bad)  # asserts the process did not crash
    if not result["ok"]:
        assert str(bad) in result["error"] or "GGUF" in result["error"], result["error"]
