"""`vocable convert`: metadata, weight types, streaming, and rejection of bad model folders."""
from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader

from conftest import VARIANTS, fixture_dir
from vocable.convert import ConversionCancelled, ConversionError, convert


def read(path):
    r = GGUFReader(str(path))
    tensors = {t.name: t for t in r.tensors}
    return r, tensors


def field(r, key):
    f = r.fields[key]
    return f.contents()


@pytest.mark.parametrize("variant", VARIANTS)
def test_metadata_and_f32_layout(converted, variant):
    r, tensors = read(converted(variant, "f32"))
    cfg = json.loads((fixture_dir(variant) / "model" / "config.json").read_text())
    talker = cfg["talker_config"]
    assert field(r, "general.architecture") == "qwen3-tts"
    assert field(r, "qwen3-tts.model_type") == "base"
    assert field(r, "qwen3-tts.talker.hidden_size") == talker["hidden_size"]
    assert field(r, "qwen3-tts.talker.num_hidden_layers") == talker["num_hidden_layers"]
    assert field(r, "qwen3-tts.cp.hidden_size") == talker["code_predictor_config"]["hidden_size"]
    assert field(r, "qwen3-tts.codec.eos_id") == 2150
    assert field(r, "qwen3-tts.talker.language_names")[0] == "english"
    # self-contained: the tokenizer travels inside the model
    vocab = json.loads(field(r, "tokenizer.vocab_json"))
    assert vocab == json.loads((fixture_dir(variant) / "model" / "vocab.json").read_text())
    assert field(r, "tokenizer.merges_txt").startswith("#version") or len(field(r, "tokenizer.merges_txt")) > 0
    assert all(t.tensor_type == T.F32 for name, t in tensors.items() if name != "checksums")
    # codebooks are precomputed as embedding_sum / clamp(cluster_usage, 1e-5)
    from safetensors.numpy import load_file
    st = load_file(str(fixture_dir(variant) / "model" / "speech_tokenizer" / "model.safetensors"))
    prefix = "decoder.quantizer.rvq_first.vq.layers.0._codebook."
    want = st[prefix + "embedding_sum"] / np.maximum(st[prefix + "cluster_usage"], 1e-5)[:, None]
    got = np.asarray(tensors["cdec.rvq_first.codebook.0"].data).reshape(want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # conv weights are stored [C_out, K, C_in] (torch Conv1d is [C_out, C_in, K])
    w = load_file(str(fixture_dir(variant) / "model" / "model.safetensors"))["speaker_encoder.blocks.0.conv.weight"]
    got = np.asarray(tensors["spk.blk.0.conv.weight"].data).reshape(w.shape[0], w.shape[2], w.shape[1])
    np.testing.assert_array_equal(got, w.transpose(0, 2, 1))
    # and transposed convs too (torch ConvTranspose1d is [C_in, C_out, K])
    t = st["decoder.upsample.0.0.conv.weight"]
    got = np.asarray(tensors["cdec.up.0.tconv.weight"].data).reshape(t.shape[1], t.shape[2], t.shape[0])
    np.testing.assert_array_equal(got, t.transpose(1, 2, 0))


@pytest.mark.parametrize("weight_type,matrix_types", [
    ("f16", {T.F16}), ("q8_0", {T.Q8_0, T.F16}), ("q4_k", {T.Q4_K, T.Q8_0, T.F16})])
def test_quantized_types(converted, weight_type, matrix_types):
    from vocable import Engine

    path = converted("0.6b", weight_type)
    _, tensors = read(path)
    for name, t in tensors.items():
        if name == "checksums":
            continue
        keep_f32 = (name.startswith(("spk.", "cenc.")) or ".codebook." in name or len(t.shape) < 2
                    or name.endswith((".bias", "norm.weight", "scale", ".alpha", ".beta", ".gamma")))
        if keep_f32:
            assert t.tensor_type == T.F32, f"{name} should stay f32, is {t.tensor_type.name}"
    main_types = {tensors[n].tensor_type for n in tensors if n.startswith("talker.blk.") and n.endswith("attn_q.weight")}
    assert main_types <= matrix_types
    assert path.stat().st_size < converted("0.6b", "f32").stat().st_size
    with Engine(path, threads=1) as engine:
        assert engine.info["variant"] == "0.6B"


def test_progress_and_cancel(tmp_path):
    calls = []

    def progress(done, total, name):
        calls.append((done, total, name))
        return True

    out = convert(fixture_dir("0.6b") / "model", tmp_path / "m.gguf", "f32", progress=progress)
    assert out.exists()
    assert calls[-1][0] == calls[-1][1] and all(a[0] <= b[0] for a, b in zip(calls, calls[1:]))

    def cancel_midway(done, total, name):
        return done < total / 2

    with pytest.raises(ConversionCancelled):
        convert(fixture_dir("0.6b") / "model", tmp_path / "c.gguf", "f32", progress=cancel_midway)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


def copy_model(tmp_path):
    dst = tmp_path / "hf"
    shutil.copytree(fixture_dir("0.6b") / "model", dst)
    return dst


def test_rejects_non_folder(tmp_path):
    with pytest.raises(ConversionError, match="not a folder"):
        convert(tmp_path / "nope", tmp_path / "o.gguf", "f32")


def test_rejects_missing_config(tmp_path):
    src = copy_model(tmp_path)
    (src / "config.json").unlink()
    with pytest.raises(ConversionError, match="config.json is missing"):
        convert(src, tmp_path / "o.gguf", "f32")


def test_rejects_other_model_kind(tmp_path):
    src = copy_model(tmp_path)
    cfg = json.loads((src / "config.json").read_text())
    cfg["tts_model_type"] = "custom_voice"
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match="Base"):
        convert(src, tmp_path / "o.gguf", "f32")


def test_rejects_missing_weights(tmp_path):
    src = copy_model(tmp_path)
    (src / "speech_tokenizer" / "model.safetensors").unlink()
    with pytest.raises(ConversionError, match="no model.safetensors"):
        convert(src, tmp_path / "o.gguf", "f32")


@pytest.mark.parametrize("keep", [4, 100, 0.5, 0.999])
def test_rejects_truncated_weights(tmp_path, keep):
    src = copy_model(tmp_path)
    path = src / "model.safetensors"
    data = path.read_bytes()
    n = int(keep * len(data)) if isinstance(keep, float) else keep
    path.write_bytes(data[:n])
    with pytest.raises(ConversionError, match="truncated"):
        convert(src, tmp_path / "o.gguf", "f32")
    assert not (tmp_path / "o.gguf").exists()


def test_rejects_corrupt_header(tmp_path):
    src = copy_model(tmp_path)
    path = src / "model.safetensors"
    data = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", data[:8])
    data[8:8 + n] = b"\x00" * n
    path.write_bytes(bytes(data))
    with pytest.raises(ConversionError, match="corrupt"):
        convert(src, tmp_path / "o.gguf", "f32")


def test_rejects_shape_mismatch(tmp_path):
    src = copy_model(tmp_path)
    cfg = json.loads((src / "config.json").read_text())
    cfg["talker_config"]["intermediate_size"] += 8
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match="shape mismatch"):
        convert(src, tmp_path / "o.gguf", "f32")


def test_rejects_unknown_type(tmp_path):
    with pytest.raises(ConversionError, match="unknown weight type"):
        convert(fixture_dir("0.6b") / "model", tmp_path / "o.gguf", "q2_k")


def test_codec_decoder_weights_stay_f16():
    """The decoder's convolutions are compute-bound and sensitive to weight precision: quantized
    models keep them at f16 (converted to f32 while the engine's GEMM packs them)."""
    from gguf import GGMLQuantizationType as T

    from vocable.convert import _choose_type
    shape = (1536, 7, 1024)
    assert _choose_type("talker.blk.0.attn_q.weight", "linear", (1024, 2048), "q4_k") == T.Q4_K
    for weight_type in ("f16", "q8_0", "q4_k"):
        assert _choose_type("cdec.dec.0.conv.weight", "conv", shape, weight_type) == T.F16
    assert _choose_type("cdec.dec.0.conv.weight", "conv", shape, "f32") == T.F32
