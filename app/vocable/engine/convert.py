"""Convert a Hugging Face Qwen3-TTS 12 Hz Base folder into the engine's GGUF model.

    vocable convert HF_MODEL_DIR OUT.gguf [--type f32|f16|q8_0|q4_k]

The result is self-contained: every hyperparameter is metadata, and so are the tokenizer
files. Tensors stream from the memory-mapped checkpoint one block of rows at a time, so a
1.8 GB model is never held twice. The speaker encoder, the codec encoder, codebooks, norms
and every vector stay float32; matrices of the talker, the code predictor and the codec
decoder take the requested type (rows that do not fit its block size fall back to a wider
type). Tensor names and metadata keys follow native/src/gguf-names.h; the folder is read and
checked by model_folder.py, the names mapped by tensor_names.py.
"""
from __future__ import annotations

import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..errors import ConversionCancelled, ConversionError
from .model_folder import ModelFolder, read_model_folder
from .safetensors_reader import SafetensorsError, TensorRef, open_checkpoint
from .tensor_names import engine_name

ARCH = "qwen3-tts"
FORMAT_VERSION = 2  # native/src/gguf-names.h QT_FORMAT_VERSION
CHECKSUM_TENSOR = "checksums"
CODEBOOK_EPS = 1e-5
ROW_BLOCK_BYTES = 64 * 1024 * 1024  # f32 bytes converted at a time

WEIGHT_TYPES = ("f32", "f16", "q8_0", "q4_k")


def _metadata(m: ModelFolder) -> list[tuple[str, object]]:
    """(key, value) pairs; ints become u32, floats f32, lists of ints i32 arrays."""
    t, p, e, d, s = m.talker, m.predictor, m.encoder, m.decoder, m.speaker
    sc = m.speech_config
    enc_rate = e["sampling_rate"] / float(np.prod(e["upsampling_ratios"]))
    langs = sorted(t["codec_language_id"].items(), key=lambda kv: kv[1])
    g = m.generation_config
    kv: list[tuple[str, object]] = [
        ("model_type", "base"), ("model_size", m.config.get("tts_model_size", "")),
        ("spk.mel_dim", s["mel_dim"]), ("spk.enc_dim", s["enc_dim"]), ("spk.channels", s["enc_channels"]),
        ("spk.kernel_sizes", s["enc_kernel_sizes"]), ("spk.dilations", s["enc_dilations"]),
        ("spk.attention_channels", s["enc_attention_channels"]), ("spk.res2net_scale", s["enc_res2net_scale"]),
        ("spk.se_channels", s["enc_se_channels"]), ("spk.sample_rate", s["sample_rate"]),
        ("cenc.sample_rate", sc.get("input_sample_rate", e["sampling_rate"])),
        ("cenc.frame_samples", sc.get("encode_downsample_rate", 1920)),
        ("cenc.hidden_size", e["hidden_size"]), ("cenc.num_filters", e["num_filters"]),
        ("cenc.num_residual_layers", e["num_residual_layers"]), ("cenc.upsampling_ratios", e["upsampling_ratios"]),
        ("cenc.kernel_size", e["kernel_size"]), ("cenc.last_kernel_size", e["last_kernel_size"]),
        ("cenc.residual_kernel_size", e["residual_kernel_size"]), ("cenc.dilation_growth_rate", e["dilation_growth_rate"]),
        ("cenc.compress", e["compress"]), ("cenc.num_hidden_layers", e["num_hidden_layers"]),
        ("cenc.num_attention_heads", e["num_attention_heads"]), ("cenc.num_key_value_heads", e["num_key_value_heads"]),
        ("cenc.head_dim", e["head_dim"] or e["hidden_size"] // e["num_attention_heads"]),
        ("cenc.intermediate_size", e["intermediate_size"]), ("cenc.norm_eps", float(e["norm_eps"])),
        ("cenc.rope_theta", float(e["rope_theta"])), ("cenc.sliding_window", e["sliding_window"]),
        ("cenc.codebook_size", e["codebook_size"]), ("cenc.codebook_dim", e["codebook_dim"]),
        ("cenc.num_semantic_quantizers", e["num_semantic_quantizers"]),
        ("cenc.valid_num_quantizers", sc.get("encoder_valid_num_quantizers", 16)),
        ("cenc.frame_rate", float(e.get("_frame_rate", e["frame_rate"]))),
        ("cenc.encoder_frame_rate", float(enc_rate)), ("cenc.pad_mode", e["pad_mode"]),
        ("talker.hidden_size", t["hidden_size"]), ("talker.intermediate_size", t["intermediate_size"]),
        ("talker.num_hidden_layers", t["num_hidden_layers"]), ("talker.num_attention_heads", t["num_attention_heads"]),
        ("talker.num_key_value_heads", t["num_key_value_heads"]), ("talker.head_dim", t["head_dim"]),
        ("talker.rms_norm_eps", float(t["rms_norm_eps"])), ("talker.rope_theta", float(t["rope_theta"])),
        ("talker.vocab_size", t["vocab_size"]), ("talker.text_hidden_size", t["text_hidden_size"]),
        ("talker.text_vocab_size", t["text_vocab_size"]), ("talker.num_code_groups", t["num_code_groups"]),
        ("talker.language_names", [name for name, _ in langs]), ("talker.language_ids", [i for _, i in langs]),
        ("codec.pad_id", t["codec_pad_id"]), ("codec.bos_id", t["codec_bos_id"]),
        ("codec.eos_id", t["codec_eos_token_id"]), ("codec.think_id", t["codec_think_id"]),
        ("codec.nothink_id", t["codec_nothink_id"]), ("codec.think_bos_id", t["codec_think_bos_id"]),
        ("codec.think_eos_id", t["codec_think_eos_id"]),
        ("text.im_start_id", m.config["im_start_token_id"]), ("text.im_end_id", m.config["im_end_token_id"]),
        ("text.tts_pad_id", m.config["tts_pad_token_id"]), ("text.tts_bos_id", m.config["tts_bos_token_id"]),
        ("text.tts_eos_id", m.config["tts_eos_token_id"]),
        ("cp.hidden_size", p["hidden_size"]), ("cp.intermediate_size", p["intermediate_size"]),
        ("cp.num_hidden_layers", p["num_hidden_layers"]), ("cp.num_attention_heads", p["num_attention_heads"]),
        ("cp.num_key_value_heads", p["num_key_value_heads"]), ("cp.head_dim", p["head_dim"]),
        ("cp.rms_norm_eps", float(p["rms_norm_eps"])), ("cp.rope_theta", float(p["rope_theta"])),
        ("cp.vocab_size", p["vocab_size"]),
        ("cdec.codebook_size", d["codebook_size"]), ("cdec.codebook_dim", d["codebook_dim"]),
        ("cdec.latent_dim", d["latent_dim"]), ("cdec.decoder_dim", d["decoder_dim"]),
        ("cdec.hidden_size", d["hidden_size"]), ("cdec.intermediate_size", d["intermediate_size"]),
        ("cdec.num_attention_heads", d["num_attention_heads"]), ("cdec.num_key_value_heads", d["num_key_value_heads"]),
        ("cdec.head_dim", d["head_dim"]), ("cdec.num_hidden_layers", d["num_hidden_layers"]),
        ("cdec.num_quantizers", d["num_quantizers"]), ("cdec.num_semantic_quantizers", d["num_semantic_quantizers"]),
        ("cdec.sliding_window", d["sliding_window"]), ("cdec.upsample_rates", d["upsample_rates"]),
        ("cdec.upsampling_ratios", d["upsampling_ratios"]), ("cdec.rope_theta", float(d["rope_theta"])),
        ("cdec.rms_norm_eps", float(d["rms_norm_eps"])), ("cdec.sample_rate", sc.get("output_sample_rate", 24000)),
        ("cdec.frame_samples", sc.get("decode_upsample_rate", 1920)),
        ("gen.temperature", float(g.get("temperature", 0.9))), ("gen.top_k", int(g.get("top_k", 50))),
        ("gen.top_p", float(g.get("top_p", 1.0))), ("gen.repetition_penalty", float(g.get("repetition_penalty", 1.05))),
        ("gen.cp_temperature", float(g.get("subtalker_temperature", 0.9))),
        ("gen.cp_top_k", int(g.get("subtalker_top_k", 50))), ("gen.cp_top_p", float(g.get("subtalker_top_p", 1.0))),
    ]
    return [(f"{ARCH}.{k}", v) for k, v in kv]


# ---- conversion plan ------------------------------------------------------------------------

@dataclass
class PlannedTensor:
    name: str
    source: TensorRef
    usage: TensorRef | None   # cluster_usage of a codebook
    kind: str
    shape: tuple[int, ...]    # numpy order of the stored tensor
    ggml_type: int

    @property
    def rows(self) -> int:
        return int(np.prod(self.shape[:-1], dtype=np.int64)) if len(self.shape) > 1 else 1


# Convolution weights are stored [C_out, K, C_in] (ggml ne = (C_in, K, C_out)): reshaped to
# (K * C_in, C_out) they multiply sliding windows of the input, and tap k is a strided matrix.
_CONV_AXES = {"conv": (0, 2, 1),    # torch Conv1d [C_out, C_in, K]
              "tconv": (1, 2, 0)}   # torch ConvTranspose1d [C_in, C_out, K]


def _stored_shape(kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    if kind in _CONV_AXES and len(shape) == 3:
        return tuple(shape[a] for a in _CONV_AXES[kind])
    return shape


def _choose_type(name: str, kind: str, shape: tuple[int, ...], weight_type: str) -> int:
    from gguf import GGMLQuantizationType as T
    if (weight_type == "f32" or len(shape) < 2 or kind in ("codebook", "vector")
            or name.startswith(("spk.", "cenc."))):
        return T.F32
    row = shape[-1]
    candidates = {"f16": ["f16"], "q8_0": ["q8_0", "f16"], "q4_k": ["q4_k", "q8_0", "f16"]}[weight_type]
    if name.startswith("cdec."):
        # The codec decoder is compute-bound convolutions, so narrower weights would not make it
        # faster, and its output is sensitive to them: on random real-size weights a q8_0
        # decoder's waveform had cosine 0.92 against f32, an f16 one 0.9988. It stays f16.
        candidates = ["f16"]
    for candidate in candidates:
        qtype = {"f16": T.F16, "q8_0": T.Q8_0, "q4_k": T.Q4_K}[candidate]
        if row % _block_size(qtype) == 0:
            return qtype
    return T.F32


def _block_size(qtype: int) -> int:
    from gguf import GGML_QUANT_SIZES
    return GGML_QUANT_SIZES[qtype][0]


def _keep_codebook(name: str, m: ModelFolder) -> bool:
    """Only the codebooks whose codes are kept (16 of Mimi's 32) are needed to encode."""
    if not name.startswith("cenc.rvq_ac.codebook."):
        return True
    kept_acoustic = m.speech_config.get("encoder_valid_num_quantizers", 16) - m.encoder["num_semantic_quantizers"]
    return int(name.rsplit(".", 1)[1]) < kept_acoustic


def plan(m: ModelFolder, weight_type: str) -> list[PlannedTensor]:
    try:
        main = open_checkpoint(m.root)
        speech = open_checkpoint(m.root / "speech_tokenizer")
    except SafetensorsError as e:
        raise ConversionError(str(e)) from e
    out: list[PlannedTensor] = []
    sources: dict[str, str] = {}
    for tensors in (main, speech):
        for hf_name, ref in tensors.items():
            mapped = engine_name(hf_name)
            if mapped is None:
                continue
            name, kind = mapped
            if name in sources:
                raise ConversionError(f"the checkpoint has both {sources[name]} and {hf_name}, which are the same "
                                      f"tensor ({name}): a damaged or different model")
            sources[name] = hf_name
            if not ref.shape or 0 in ref.shape:
                raise ConversionError(f"{hf_name} has the empty shape {list(ref.shape)}: a damaged checkpoint")
            if not _keep_codebook(name, m):
                continue
            usage = None
            if kind == "codebook":
                usage_name = hf_name.rsplit(".", 1)[0] + ".cluster_usage"
                usage = tensors.get(usage_name)
                if usage is None:
                    raise ConversionError(f"checkpoint lacks {usage_name}")
                if len(ref.shape) != 2 or usage.shape != ref.shape[:1]:
                    raise ConversionError(f"{usage_name} has shape {list(usage.shape)}; its codebook "
                                          f"{hf_name} has shape {list(ref.shape)}")
            shape = _stored_shape(kind, ref.shape)
            out.append(PlannedTensor(name, ref, usage, kind, shape, _choose_type(name, kind, shape, weight_type)))
    _check_shapes(out, m)
    return out


def _check_shapes(tensors: list[PlannedTensor], m: ModelFolder) -> None:
    """Shapes that follow directly from the config; the engine checks every other one at load.
    Each is checked as it is named, so a config claiming a billion layers stops at the first
    layer the checkpoint lacks."""
    t, p = m.talker, m.predictor
    present = {pt.name: pt for pt in tensors}

    def check(name: str, shape: tuple) -> None:
        if name not in present:
            raise ConversionError(f"the checkpoint lacks the tensor for {name} (an incomplete or different model?)")
        if tuple(present[name].shape) != tuple(shape):
            raise ConversionError(f"shape mismatch for {present[name].source.name}: {list(present[name].source.shape)} "
                                  f"in the checkpoint, but its config.json implies {list(shape)}")

    check("talker.codec_embd.weight", (t["vocab_size"], t["hidden_size"]))
    check("talker.text_embd.weight", (t["text_vocab_size"], t["text_hidden_size"]))
    check("talker.codec_head.weight", (t["vocab_size"], t["hidden_size"]))
    check("talker.output_norm.weight", (t["hidden_size"],))
    check("cp.output_norm.weight", (p["hidden_size"],))
    check("spk.fc.weight", (m.speaker["enc_dim"], 1, 2 * m.speaker["enc_channels"][-1]))
    for prefix, c in (("talker", t), ("cp", p)):
        h, nh, nkv, hd, ffn = (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"],
                               c["head_dim"], c["intermediate_size"])
        for i in range(c["num_hidden_layers"]):
            b = f"{prefix}.blk.{i}."
            for name, shape in ((b + "attn_q.weight", (nh * hd, h)), (b + "attn_k.weight", (nkv * hd, h)),
                                (b + "attn_v.weight", (nkv * hd, h)), (b + "attn_o.weight", (h, nh * hd)),
                                (b + "attn_q_norm.weight", (hd,)), (b + "attn_k_norm.weight", (hd,)),
                                (b + "ffn_gate.weight", (ffn, h)), (b + "ffn_up.weight", (ffn, h)),
                                (b + "ffn_down.weight", (h, ffn))):
                check(name, shape)
    for q in range(t["num_code_groups"] - 1):
        check(f"cp.head.{q}.weight", (p["vocab_size"], p["hidden_size"]))
        check(f"cp.codec_embd.{q}.weight", (p["vocab_size"], t["hidden_size"]))  # embeds in talker space


# ---- writing --------------------------------------------------------------------------------

def _checksum_update(state: list[int], data: bytes | memoryview, carry: bytearray) -> None:
    """Feeds bytes to the checksum of native/src/model-loader.h tensor_checksum()."""
    buf = bytes(carry) + bytes(data)
    n_words = len(buf) // 8
    if n_words:
        words = np.frombuffer(buf, dtype="<u8", count=n_words)
        index = np.arange(state[1], state[1] + n_words, dtype=np.uint64)
        with np.errstate(over="ignore"):
            state[0] = (state[0] + int((words * (index * np.uint64(2) + np.uint64(1))).sum(dtype=np.uint64))) % (1 << 64)
        state[1] += n_words
    carry[:] = buf[8 * n_words:]


def _checksum_final(state: list[int], carry: bytearray) -> int:
    if carry:
        word = int.from_bytes(bytes(carry) + bytes(8 - len(carry)), "little")
        state[0] = (state[0] + word * (2 * state[1] + 1)) % (1 << 64)
    return state[0]


def _blocks(pt: PlannedTensor) -> Iterator[np.ndarray]:
    """The stored tensor as float32 blocks of whole rows, in storage order."""
    src = pt.source
    if pt.kind == "codebook":
        usage = np.maximum(pt.usage.f32(), CODEBOOK_EPS)
        yield (src.f32() / usage[:, None]).astype(np.float32)
    elif pt.kind in _CONV_AXES and len(src.shape) == 3:
        yield np.ascontiguousarray(src.f32().transpose(_CONV_AXES[pt.kind]))
    else:
        rows = src.shape[0] if src.shape else 1
        row_bytes = 4 * max(1, src.numel // max(rows, 1))
        step = max(1, ROW_BLOCK_BYTES // row_bytes)
        for start in range(0, rows, step):
            yield src.rows_f32(start, min(rows, start + step)) if src.shape else src.f32().reshape(1, 1)


def _encode(block: np.ndarray, ggml_type: int) -> np.ndarray:
    from gguf import GGMLQuantizationType as T
    if ggml_type == T.F32:
        return np.ascontiguousarray(block, dtype=np.float32)
    if ggml_type == T.F16:
        return block.astype(np.float16)
    from .. import _engine
    return _engine.quantize(block.reshape(-1, block.shape[-1]), int(ggml_type))


def _nbytes(pt: PlannedTensor) -> int:
    from gguf import GGML_QUANT_SIZES
    block, type_size = GGML_QUANT_SIZES[pt.ggml_type]
    return pt.rows * (pt.shape[-1] // block) * type_size


ProgressFn = Callable[[int, int, str], bool]


def convert(src: Path, out: Path, weight_type: str = "f16", progress: ProgressFn | None = None) -> Path:
    """Converts the model folder `src` to the GGUF file `out` (written atomically).

    `progress(done_bytes, total_bytes, tensor_name)` is called after each block of rows written
    (at least once per tensor); returning False cancels (ConversionCancelled, nothing left behind)."""
    import gguf
    from gguf import GGMLQuantizationType as T

    if weight_type not in WEIGHT_TYPES:
        raise ConversionError(f"unknown weight type {weight_type!r}; choose one of {', '.join(WEIGHT_TYPES)}")
    folder = read_model_folder(Path(src))
    try:
        metadata = _metadata(folder)
        tensors = plan(folder, weight_type)
    except (LookupError, TypeError, ValueError, AttributeError, ArithmeticError) as e:  # a config of the wrong shape
        raise ConversionError(f"{folder.root} is not a usable Qwen3-TTS model folder: its configuration is malformed "
                              f"({type(e).__name__}: {e})") from None
    out = Path(out)
    if os.path.lexists(out) and not out.is_file():  # renaming over a device or a FIFO would replace it
        raise ConversionError(f"cannot write the converted model {out}: it exists and is not a regular file")
    file_type = {"f32": 0, "f16": 1, "q8_0": 7, "q4_k": 14}[weight_type]
    # A name of its own (created exclusively), so that two conversions to one output never write
    # into each other's file; the last to finish is the output, whole.
    try:
        handle, name = tempfile.mkstemp(dir=out.parent, prefix=out.name + ".", suffix=".partial")
        os.close(handle)
    except OSError as e:
        raise ConversionError(f"cannot write the converted model {out}: {e.strerror or e}") from e
    partial = Path(name)
    writer = None
    try:
        writer = gguf.GGUFWriter(str(partial), ARCH, use_temp_file=False)
        writer.add_name(f"Qwen3-TTS 12Hz {folder.config.get('tts_model_size', '')} Base ({weight_type})")
        writer.add_file_type(file_type)
        if folder.license:
            writer.add_license(folder.license)
        writer.add_uint32(f"{ARCH}.format_version", FORMAT_VERSION)
        for key, value in metadata:
            _add_kv(writer, key, value)
        for name, text in folder.tokenizer_files.items():
            writer.add_string(f"tokenizer.{name.replace('.', '_')}", text)
        for pt in tensors:
            nbytes = _nbytes(pt)
            byte_shape = (*pt.shape[:-1], nbytes // pt.rows) if pt.ggml_type not in (T.F32, T.F16) else pt.shape
            dtype = np.uint8 if pt.ggml_type not in (T.F32, T.F16) else (np.float32 if pt.ggml_type == T.F32 else np.float16)
            writer.add_tensor_info(pt.name, byte_shape, np.dtype(dtype), nbytes,
                                   raw_dtype=T(pt.ggml_type) if dtype is np.uint8 else None)
        writer.add_tensor_info(CHECKSUM_TENSOR, (2 * len(tensors),), np.dtype(np.int32), 8 * len(tensors))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        fout = writer.fout[0]
        total = sum(_nbytes(pt) for pt in tensors)
        done = 0
        checksums = []
        for pt in tensors:
            writer.write_padding(fout, fout.tell())
            state, carry = [0, 0], bytearray()
            written = 0
            for block in _blocks(pt):
                if not np.isfinite(block).all():
                    raise ConversionError(f"{pt.source.name} holds values that are not finite numbers (NaN or "
                                          "infinity): a damaged checkpoint")
                data = _encode(block, pt.ggml_type)
                mv = memoryview(np.ascontiguousarray(data)).cast("B")
                fout.write(mv)
                _checksum_update(state, mv, carry)
                written += len(mv)
                # after each block (a large tensor is many): a cancel acts within one block
                if progress and progress(done + written, total, pt.name) is False:
                    raise ConversionCancelled("conversion cancelled")
            if written != _nbytes(pt):
                raise ConversionError(f"internal error: {pt.name} wrote {written} bytes, planned {_nbytes(pt)}")
            writer.write_padding(fout, written)
            checksums.append(_checksum_final(state, carry))
            done += written
        writer.write_padding(fout, fout.tell())
        fout.write(np.array(checksums, dtype="<u8").view("<i4").tobytes())
        writer.write_padding(fout, 8 * len(tensors))
        fout.flush()
        os.fsync(fout.fileno())
        writer.close()
        os.replace(partial, out)
    except BaseException as e:
        try:
            if writer is not None:
                writer.close()   # before the unlink, which Windows refuses for an open file
            partial.unlink()
        except OSError:
            pass
        if isinstance(e, OSError):
            raise ConversionError(f"cannot write the converted model {out}: {e.strerror or e}") from e
        raise
    return out


def _add_kv(writer, key: str, value: object) -> None:
    """Adds a value of the config; ConversionError for one the GGUF type cannot hold (a
    negative count, a number too large, a NaN) rather than a struct error or a silent wrap."""
    import gguf
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int) and 0 <= value < 1 << 32:
        writer.add_uint32(key, value)
    elif isinstance(value, float) and math.isfinite(value) and abs(value) <= np.finfo(np.float32).max:
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        writer.add_array(key, value)
    elif isinstance(value, list) and all(isinstance(v, int) and -(1 << 31) <= v < 1 << 31 for v in value):
        writer.add_key_value(key, value, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)
    else:
        raise ConversionError(f"the model's configuration has an invalid value for {key}: {str(value)[:80]}")


def print_progress(stream=sys.stderr) -> ProgressFn:
    """A progress callback: one line redrawn at most 5 times a second on a terminal, a line
    per 10 % otherwise."""
    start = time.monotonic()
    state = {"shown": -1.0, "decile": -1}
    interactive = stream.isatty()

    def report(done: int, total: int, name: str) -> bool:
        now = time.monotonic()
        pct = 100.0 * done / max(total, 1)
        finished = done >= total
        line = f"  {pct:5.1f}%  {done / 2**20:8.1f} / {total / 2**20:.1f} MiB  {now - start:6.1f} s"
        if interactive and (finished or now - state["shown"] >= 0.2):
            stream.write(f"\r{line}  {name[:40]:<40}" + ("\n" if finished else ""))
            state["shown"] = now
        elif not interactive and (finished or int(pct // 10) > state["decile"]):
            stream.write(line + "\n")
            state["decile"] = int(pct // 10)
        stream.flush()
        return True
    return report
