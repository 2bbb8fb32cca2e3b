"""A missing, truncated or corrupted model gets a clear error, never a crash. Each load runs
in a subprocess so that a crash would fail the test instead of killing the run."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gguf_craft import craft_gguf

from vocable.errors import ModelError

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


# ---- crafted files with valid checksums: what the checksums cannot catch -----------------------

def test_a_crafted_copy_with_nothing_changed_loads(converted, tmp_path):
    """The crafting itself keeps a model valid, so the failures below are the changes'."""
    assert try_load(craft_gguf(converted("0.6b", "q8_0"), tmp_path / "same.gguf")) == {"ok": True}


def test_a_model_with_no_tensors_is_refused(converted, tmp_path):
    result = try_load(craft_gguf(converted("0.6b", "q8_0"), tmp_path / "empty.gguf", keep_tensors=False))
    assert not result["ok"] and "checksum table is malformed" in result["error"], result


def tensor_named(path, name):
    import gguf
    return next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == name)


# A matrix of the talker, a norm, an embedding and a codec decoder convolution, each given a
# type it may not have (integer and f64 matrices crashed in mul_mat; a quantised norm aborted).
@pytest.mark.parametrize("name", ["talker.blk.0.ffn_up.weight", "talker.blk.0.attn_norm.weight",
                                  "talker.codec_embd.weight", "cdec.dec.1.res2.conv1.weight"])
@pytest.mark.parametrize("dtype", ["I8", "I16", "I32", "F64", "Q8_0"])
def test_a_tensor_of_the_wrong_type_is_refused(converted, tmp_path, name, dtype):
    import gguf
    import numpy as np

    src = converted("0.6b", "q8_0")
    try:
        t = tensor_named(src, name)
    except StopIteration:
        pytest.skip(f"the tiny model has no {name}")
    n = int(np.prod([int(d) for d in t.shape]))
    qtype = gguf.GGMLQuantizationType[dtype]
    if qtype == gguf.GGMLQuantizationType.Q8_0:
        if int(t.shape[0]) % 32:
            pytest.skip("rows not a multiple of the q8_0 block")
        data = np.zeros(n // 32 * 34, dtype=np.uint8)
    else:
        data = np.ones(n, dtype={"I8": np.int8, "I16": np.int16, "I32": np.int32, "F64": np.float64}[dtype])
    if qtype == gguf.GGMLQuantizationType(t.tensor_type):
        pytest.skip("already that type")
    result = try_load(craft_gguf(src, tmp_path / "typed.gguf", tensors={name: (data, qtype)}))
    assert not result["ok"], result
    assert f"tensor '{name}' has type" in result["error"] and "cannot have" in result["error"], result


@pytest.mark.parametrize("key, value", [("qwen3-tts.talker.rms_norm_eps", float("nan")),
                                        ("qwen3-tts.talker.rope_theta", float("inf")),
                                        ("qwen3-tts.talker.num_hidden_layers", 0),
                                        ("qwen3-tts.talker.num_attention_heads", 4_000_000_000),
                                        ("qwen3-tts.codec.pad_id", 999_999)])
def test_bad_metadata_values_are_refused(converted, tmp_path, key, value):
    import gguf

    src = converted("0.6b", "q8_0")
    fields = gguf.GGUFReader(str(src)).fields
    vtype = gguf.GGUFValueType(fields[key].types[0])
    result = try_load(craft_gguf(src, tmp_path / "meta.gguf", kv={key: (value, vtype)}))
    assert not result["ok"], result
    assert "corrupt" in result["error"] and key in result["error"] or "vocabulary" in result["error"], result


# Sizes that each pass on their own but do not fit together: the products and shifts that
# relate them must not overflow (the sanitized run turns any overflow into a crash).
@pytest.mark.parametrize("kv", [
    {"qwen3-tts.cenc.upsampling_ratios": [1 << 24] * 4},
    {"qwen3-tts.cenc.upsampling_ratios": [1] * 40, "qwen3-tts.cenc.num_filters": 1 << 24},
    {"qwen3-tts.cenc.frame_rate": 1e-30},
    {"qwen3-tts.cenc.frame_rate": -12.5},
    {"qwen3-tts.cdec.upsample_rates": [1 << 24] * 5},
    {"qwen3-tts.cdec.upsampling_ratios": [1 << 24] * 3},
], ids=["encoder-hop-overflow", "encoder-filter-shift", "encoder-rate-ratio-huge", "encoder-rate-negative",
        "decoder-hop-overflow", "decoder-ratio-overflow"])
def test_sizes_that_do_not_fit_together_are_refused(converted, tmp_path, kv):
    import gguf

    src = converted("0.6b", "q8_0")
    fields = gguf.GGUFReader(str(src)).fields
    crafted = {key: (value, gguf.GGUFValueType(fields[key].types[0])) for key, value in kv.items()}
    result = try_load(craft_gguf(src, tmp_path / "geometry.gguf", kv=crafted))
    assert not result["ok"], result
    assert "unsupported codec" in result["error"] and "geometry" in result["error"], result


# Values that each load, but where what the talker writes is not what the decoder reads: the
# first made synthesis read past its codes (8 codebooks written, 16 read: a heap overflow under
# the sanitizer), or a window of millions of frames kept a device's reserve busy for minutes.
@pytest.mark.parametrize("key, value, expected", [
    ("qwen3-tts.talker.num_code_groups", 8, "the talker makes 8 codebooks of 2048 codes"),
    ("qwen3-tts.codec.eos_id", 5, "end of speech 5 of 3072 ids"),
    ("qwen3-tts.codec.eos_id", 100_000, "end of speech 100000 of 3072 ids"),
    ("qwen3-tts.cdec.sliding_window", 16_000_000, "a window of 16000000 frames (at most 4096)"),
])
def test_a_talker_and_codec_that_disagree_are_refused(converted, tmp_path, key, value, expected):
    import gguf

    src = converted("0.6b", "q8_0")
    vtype = gguf.GGUFValueType(gguf.GGUFReader(str(src)).fields[key].types[0])
    result = try_load(craft_gguf(src, tmp_path / "disagree.gguf", kv={key: (value, vtype)}))
    assert not result["ok"] and expected in result["error"], result


@pytest.mark.parametrize("key", ["qwen3-tts.cenc.num_hidden_layers", "qwen3-tts.cdec.num_hidden_layers"])
def test_a_codec_without_transformer_layers_loads(converted, tmp_path, key):
    """Zero layers is a well-defined codec (its geometry check allows it): the loader must not call
    the count corrupt. The tensors of the layers it no longer reads are left unused."""
    import gguf

    src = converted("0.6b", "q8_0")
    vtype = gguf.GGUFValueType(gguf.GGUFReader(str(src)).fields[key].types[0])
    assert try_load(craft_gguf(src, tmp_path / "no-layers.gguf", kv={key: (0, vtype)})) == {"ok": True}


# ---- text in the metadata that is not UTF-8 ----------------------------------------------------

def with_bad_byte_in(src, dst, key: str):
    """A copy of the model whose string value of `key` starts with the byte 0xFF (never UTF-8)."""
    data = bytearray(src.read_bytes())
    at = data.index(key.encode()) + len(key) + 4 + 8  # past the key, the value type and the length
    data[at] = 0xFF
    dst.write_bytes(bytes(data))
    return dst


# general.name is read by no one at load, model_size is the engine's model name, and the
# architecture goes into the engine's log lines: each gave a raw UnicodeDecodeError.
@pytest.mark.parametrize("key", ["general.name", "qwen3-tts.model_size", "general.architecture",
                                 "tokenizer.merges_txt"])
def test_metadata_that_is_not_utf8_is_refused(converted, tmp_path, key):
    from vocable.engine.models import ModelStore

    bad = with_bad_byte_in(converted("0.6b", "q8_0"), tmp_path / "latin1.gguf", key)
    result = try_load(bad)
    assert not result["ok"] and "not UTF-8" in result["error"] and str(bad) in result["error"], result
    with pytest.raises(ModelError, match="not UTF-8"):
        ModelStore(tmp_path / "store").describe(bad)


def test_non_utf8_metadata_in_an_engine_message_is_text(converted, tmp_path):
    """The engine quotes a file's own bytes in its messages and log lines; the bindings decode
    them with replacement characters (the Python header check refuses such a file first, so
    this calls the engine directly, as the check's own fallback would)."""
    import gguf

    bad = craft_gguf(converted("0.6b", "q8_0"), tmp_path / "latin1.gguf",
                     kv={"qwen3-tts.model_type": (b"b\xe4se", gguf.GGUFValueType.STRING)})
    script = ("import sys\nfrom vocable import _engine\nlines = []\n"
              "try:\n    _engine.Context(sys.argv[1], 1, None, lambda level, text: lines.append(text))\n"
              "except _engine.EngineError as e:\n    print(ascii(e.args[0]))\n")
    proc = subprocess.run([sys.executable, "-c", script, str(bad)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "is a 'b\\ufffdse' model" in proc.stdout, proc.stdout
    assert "UnicodeDecodeError" not in proc.stderr
