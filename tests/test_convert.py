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
from vocable.engine.convert import ConversionCancelled, ConversionError, convert


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

    from vocable.engine.convert import _choose_type
    shape = (1536, 7, 1024)
    assert _choose_type("talker.blk.0.attn_q.weight", "linear", (1024, 2048), "q4_k") == T.Q4_K
    for weight_type in ("f16", "q8_0", "q4_k"):
        assert _choose_type("cdec.dec.0.conv.weight", "conv", shape, weight_type) == T.F16
    assert _choose_type("cdec.dec.0.conv.weight", "conv", shape, "f32") == T.F32


# ---- hostile folders: every malformed input is a ConversionError naming the file -------------------

def split_safetensors(path):
    """A safetensors file as (its JSON header, a dict; the bytes of its data)."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), bytearray(data[8 + n:])


def write_safetensors(path, header, data):
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(data))


def rewrite_header(path, change):
    """Rewrites a safetensors file's JSON header as `change(header)` returns it (a dict, or raw
    bytes), keeping its data."""
    header, data = split_safetensors(path)
    write_safetensors(path, change(header), data)


def first_tensor(header):
    return next(k for k in header if k != "__metadata__")


def _entry(header, **over):
    header[first_tensor(header)].update(over)
    return header


@pytest.mark.parametrize("change, message", [
    (lambda h: b"[1, 2, 3]", "not a JSON object"),
    (lambda h: b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
    (lambda h: json.dumps(h).encode().replace(b"{", b"{\"x\": \"\xff\", ", 1), "not valid JSON"),
    (lambda h: _entry(h, shape=[-4, 8]), "bad shape or offsets"),
    (lambda h: _entry(h, shape=[1 << 32, 1 << 32]), "bytes for shape"),  # an int64 product wrapped to 0
    (lambda h: _entry(h, shape=[1.5]), "bad shape or offsets"),
    (lambda h: _entry(h, shape=[2] * 100), "bad shape or offsets"),
    (lambda h: _entry(h, data_offsets=[64, 0]), "bad shape or offsets"),
    (lambda h: _entry(h, dtype=["F32"]), "unsupported dtype"),
    (lambda h: _entry(h, dtype="F64"), "unsupported dtype"),
    (lambda h: {**h, first_tensor(h): "F32"}, "bad header entry"),
])
def test_rejects_malformed_safetensors_headers(tmp_path, change, message):
    src = copy_model(tmp_path)
    rewrite_header(src / "model.safetensors", change)
    with pytest.raises(ConversionError, match=message):
        convert(src, tmp_path / "o.gguf", "f32")
    assert not (tmp_path / "o.gguf").exists()


@pytest.mark.parametrize("index, message", [
    ('{"weight_map": [1, 2]}', "corrupt"), ('{"weight_map": {"a": ["x"]}}', "corrupt"), ("[]", "corrupt"),
    ('{"weight_map": {"a": "../../../etc/passwd"}}', "file names"), ("[" * 100_000, "corrupt"),
    ('{"weight_map": {"a": "missing.safetensors"}}', "is missing"),
])
def test_rejects_malformed_shard_index(tmp_path, index, message):
    src = copy_model(tmp_path)
    (src / "model.safetensors").unlink()
    (src / "model.safetensors.index.json").write_text(index)
    with pytest.raises(ConversionError, match=message):
        convert(src, tmp_path / "o.gguf", "f32")


@pytest.mark.parametrize("name", ["vocab.json", "merges.txt", "tokenizer_config.json"])
def test_rejects_tokenizer_files_that_are_not_utf8(tmp_path, name):
    src = copy_model(tmp_path)
    (src / name).write_bytes((src / name).read_bytes() + b"\xff\xfe")
    with pytest.raises(ConversionError, match=f"{name} is not UTF-8"):
        convert(src, tmp_path / "o.gguf", "f32")


@pytest.mark.parametrize("change, message", [
    (lambda c: [], "not a JSON object"),
    (lambda c: b"[" * 100_000, "nested too deeply"),
    (lambda c: b'{"tts_model_type": "base", "name": "\xff"}', "not valid JSON"),
    (lambda c: {**c, "talker_config": "oops"}, "not a Qwen3-TTS 12 Hz Base config"),
    (lambda c: {**c, "talker_config": {**c["talker_config"], "code_predictor_config": [1]}}, "malformed"),
    (lambda c: {**c, "talker_config": {**c["talker_config"], "hidden_size": "wide"}}, "shape mismatch"),
    (lambda c: {**c, "talker_config": {**c["talker_config"], "codec_language_id": [1, 2]}}, "malformed"),
    (lambda c: {**c, "talker_config": {**c["talker_config"], "codec_pad_id": -1}}, "invalid value"),
    (lambda c: {**c, "talker_config": {**c["talker_config"], "rope_theta": float("nan")}}, "invalid value"),
    (lambda c: {**c, "talker_config": {**c["talker_config"], "codec_bos_id": 1 << 40}}, "invalid value"),
    (lambda c: {**c, "im_start_token_id": {"a": 1}}, "invalid value"),
])
def test_rejects_malformed_config(tmp_path, change, message):
    src = copy_model(tmp_path)
    config = change(json.loads((src / "config.json").read_text()))
    (src / "config.json").write_bytes(config if isinstance(config, bytes) else json.dumps(config).encode())
    with pytest.raises(ConversionError, match=message):
        convert(src, tmp_path / "o.gguf", "f32")
    assert list(tmp_path.glob("o.gguf*")) == []


def test_a_config_claiming_a_billion_layers_stops_at_the_first_missing_one(tmp_path):
    import time
    src = copy_model(tmp_path)
    cfg = json.loads((src / "config.json").read_text())
    cfg["talker_config"]["num_hidden_layers"] = 10 ** 9
    (src / "config.json").write_text(json.dumps(cfg))
    start = time.perf_counter()
    with pytest.raises(ConversionError, match="lacks the tensor for talker.blk"):
        convert(src, tmp_path / "o.gguf", "f32")
    assert time.perf_counter() - start < 30


def test_rejects_a_codebook_usage_of_the_wrong_shape(tmp_path):
    src = copy_model(tmp_path)
    usage = "decoder.quantizer.rvq_first.vq.layers.0._codebook.cluster_usage"

    def shorter(h):
        begin, _ = h[usage]["data_offsets"]
        h[usage].update(shape=[1024], data_offsets=[begin, begin + 4096])
        return h

    rewrite_header(src / "speech_tokenizer" / "model.safetensors", shorter)
    with pytest.raises(ConversionError, match="cluster_usage has shape"):
        convert(src, tmp_path / "o.gguf", "f32")


def test_a_device_or_fifo_as_output_is_refused(tmp_path):
    import os
    fifo = tmp_path / "out.gguf"
    os.mkfifo(fifo)
    with pytest.raises(ConversionError, match="not a regular file"):
        convert(fixture_dir("0.6b") / "model", fifo, "f32")
    assert fifo.is_fifo()


def test_a_full_disk_names_the_file_and_the_cause(tmp_path, monkeypatch):
    import errno
    import os

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    out = tmp_path / "o.gguf"
    with pytest.raises(ConversionError, match=f"cannot write the converted model {out}: No space left on device"):
        convert(fixture_dir("0.6b") / "model", out, "f32")
    assert list(tmp_path.iterdir()) == []


def _scalar_bias(header):
    name = next(k for k, v in header.items() if k != "__metadata__" and k.endswith(".bias") and len(v["shape"]) == 1)
    begin, _ = header[name]["data_offsets"]
    header[name].update(shape=[], data_offsets=[begin, begin + 4])
    return header


def _a_second_name_for_the_same_tensor(header):
    alpha = next(k for k in header if k.startswith("decoder.decoder.1.") and k.endswith(".alpha"))
    twin = alpha.replace("decoder.decoder.1.block.0.", "decoder.decoder.1.") if ".block.0." in alpha else None
    header[twin or "decoder.decoder.1.alpha"] = dict(header[alpha])
    return header


@pytest.mark.parametrize("file, change, message", [
    ("model.safetensors", _scalar_bias, "has the empty shape"),
    ("model.safetensors", lambda h: _entry(h, shape=[0, 64], data_offsets=[0, 0]), "has the empty shape"),
    ("speech_tokenizer/model.safetensors", _a_second_name_for_the_same_tensor, "which are the same tensor"),
], ids=["scalar", "zero-rows", "two-names"])
def test_odd_checkpoints_are_conversion_errors_not_tracebacks(tmp_path, file, change, message):
    src = copy_model(tmp_path)
    rewrite_header(src / file, change)
    with pytest.raises(ConversionError, match=message):
        convert(src, tmp_path / "o.gguf", "q8_0")
    assert not (tmp_path / "o.gguf").exists()


def test_weights_that_are_not_numbers_are_refused(tmp_path):
    src = copy_model(tmp_path)
    path = src / "model.safetensors"
    header, data = split_safetensors(path)
    name = next(k for k, v in header.items() if k != "__metadata__" and v["dtype"] == "F32" and "attn" in k)
    begin, _ = header[name]["data_offsets"]
    data[begin:begin + 4] = struct.pack("<f", float("nan"))
    write_safetensors(path, header, data)
    with pytest.raises(ConversionError, match=f"{name} holds values that are not finite"):
        convert(src, tmp_path / "o.gguf", "f32")
    assert list(tmp_path.glob("o.gguf*")) == []


def test_a_model_card_that_is_a_fifo_is_not_read(tmp_path):
    """`README.md` as a FIFO (or /dev/zero) blocked the conversion for good, or filled memory."""
    import os

    src = copy_model(tmp_path)
    (src / "README.md").unlink(missing_ok=True)
    os.mkfifo(src / "README.md")
    assert convert(src, tmp_path / "o.gguf", "f32").is_file()


def test_two_conversions_to_one_output_do_not_mix(tmp_path):
    """Each writes a partial file of its own: the output is one of them, whole, never a q8_0
    header over f32 data."""
    from concurrent.futures import ThreadPoolExecutor

    out = tmp_path / "race.gguf"
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda t: convert(fixture_dir("0.6b") / "model", out, t), ["f32", "q8_0"]))
    assert done == [out, out] and sorted(p.name for p in tmp_path.iterdir()) == ["race.gguf"]
    r, _ = read(out)
    expected = {0: "f32", 7: "q8_0"}[int(field(r, "general.file_type"))]
    size = convert(fixture_dir("0.6b") / "model", tmp_path / f"alone-{expected}.gguf", expected).stat().st_size
    assert out.stat().st_size == size
