"""A random Qwen3-TTS 12 Hz 0.6B Base model with the real shapes, for `vocable bench`.

The real weights cannot be shipped or downloaded here, and speed does not depend on their
values, so the benchmark builds a Hugging Face model folder with every tensor name and shape
of Qwen/Qwen3-TTS-12Hz-0.6B-Base (listed in data/real_params_*.txt) filled with seeded random
values, then converts it with `vocable.convert`. No torch: the safetensors files are written
directly (8-byte header length, JSON header, raw little-endian data), tensor by tensor in
bounded chunks, so building the 2.5 GB folder never holds more than a few MB of weights.

Layout, as in the HF repo: config.json, generation_config.json, model.safetensors (bf16),
vocab.json, merges.txt, tokenizer_config.json, speech_tokenizer/{config.json,
preprocessor_config.json, model.safetensors (fp32)}. Both sides of the benchmark (this engine
and the official PyTorch package) load that same folder. The text tokenizer is the real Qwen one
(data/qwen-tokenizer), so texts split into the real number of tokens.

Values follow the reference tools' `randomize_` (normal / sqrt(fan_in) for matrices, norms
about 1, codebook usage 0.5 + U(0, 1), codebook sums N(0, 1), SnakeBeta alpha/beta 0.1 N(0, 1),
LayerScale/ConvNeXt gamma about 0.1, biases 0.02 N(0, 1)) but come from numpy, so they are not
bit-identical to a torch-built model. The codec_head row of codec EOS is zeroed: random logits
are about N(0, 1), so greedy generation never stops early and timed runs have the length asked
for.
"""
from __future__ import annotations

import copy
import gc
import gzip
import hashlib
import json
import os
import shutil
import struct
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

LAYOUT_VERSION = 3          # bump when the builder's output changes (invalidates caches)
DEFAULT_SEED = 0
CHUNK_ELEMENTS = 1 << 22    # values generated and written at a time (16 MiB as float32)
CODEC_EOS_ID = 2150

ProgressFn = Callable[[str], None]


def data_path(name: str) -> Path:
    """A file shipped in the package's data folder (also in a frozen build, whose bundler
    must include vocable/data)."""
    return Path(__file__).resolve().parent.parent / "data" / name


# ---- what to build --------------------------------------------------------------------------

# transformers' MimiConfig defaults (kyutai/mimi geometry) at 12.5 Hz: the encoder of the real
# speech tokenizer. Written out in full so the folder documents itself; vocable.convert falls
# back to the same values for keys a config leaves out.
MIMI_ENCODER_CONFIG = {
    "sampling_rate": 24000, "frame_rate": 12.5, "audio_channels": 1, "hidden_size": 512, "num_filters": 64,
    "num_residual_layers": 1, "upsampling_ratios": [8, 6, 5, 4], "kernel_size": 7, "last_kernel_size": 3,
    "residual_kernel_size": 3, "dilation_growth_rate": 2, "use_causal_conv": True, "pad_mode": "constant",
    "compress": 2, "trim_right_ratio": 1.0, "codebook_size": 2048, "codebook_dim": 256, "num_quantizers": 32,
    "use_conv_shortcut": False, "vector_quantization_hidden_dimension": 256, "num_semantic_quantizers": 1,
    "upsample_groups": 512, "num_hidden_layers": 8, "intermediate_size": 2048, "num_attention_heads": 8,
    "num_key_value_heads": 8, "head_dim": 64, "hidden_act": "gelu", "max_position_embeddings": 8000,
    "initializer_range": 0.02, "norm_eps": 1e-05, "use_cache": False, "use_streaming": False,
    "rope_theta": 10000.0, "sliding_window": 250, "attention_dropout": 0.0, "layer_scale_initial_scale": 0.01,
    "attention_bias": False, "model_type": "mimi",
}

# generation_config.json of the Base repos.
GENERATION_CONFIG = {
    "do_sample": True, "repetition_penalty": 1.05, "temperature": 0.9, "top_p": 1.0, "top_k": 50,
    "subtalker_dosample": True, "subtalker_temperature": 0.9, "subtalker_top_p": 1.0,
    "subtalker_top_k": 50, "max_new_tokens": 8192,
}

# transformers' EncodecFeatureExtractor(feature_size=1, sampling_rate=24000, padding_value=0.0,
# return_attention_mask=True).save_pretrained(), written by hand.
PREPROCESSOR_CONFIG = {
    "chunk_length_s": None, "feature_extractor_type": "EncodecFeatureExtractor", "feature_size": 1,
    "overlap": None, "padding_side": "right", "padding_value": 0.0, "return_attention_mask": True,
    "sampling_rate": 24000,
}

@dataclass(frozen=True)
class ModelSpec:
    """Everything that determines the random HF folder."""
    name: str                                 # cache folder name
    config: dict                              # config.json
    speech_config: dict                       # speech_tokenizer/config.json
    main_params: list[tuple[str, tuple[int, ...]]]
    speech_params: list[tuple[str, tuple[int, ...]]]
    seed: int = DEFAULT_SEED
    zero_rows: dict = field(default_factory=dict)   # tensor name -> row indices set to 0
    tokenizer_dir: Path = field(default_factory=lambda: data_path(QWEN_TOKENIZER))  # TOKENIZER_FILES

    def key(self) -> str:
        """Cache key: changes whenever anything that ends up in the folder changes."""
        blob = json.dumps([LAYOUT_VERSION, self.config, self.speech_config, self.main_params, self.speech_params,
                           self.seed, sorted((k, sorted(v)) for k, v in self.zero_rows.items()),
                           _tokenizer_digest(self.tokenizer_dir)], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def n_params(self) -> int:
        return sum(int(np.prod(s, dtype=np.int64)) for _, s in self.main_params + self.speech_params)


TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")
# The real Qwen2/Qwen3 text tokenizer with the Qwen3-TTS added tokens (its SOURCE.md): a random
# model built with it tokenizes, prefills and holds memory as a real one does (a q8_0 synthesis
# peaked 13 MB higher with it than with a stand-in without its 151,387 merges, measured).
QWEN_TOKENIZER = "qwen-tokenizer"


def read_tokenizer_files(folder: Path) -> dict[str, bytes]:
    """TOKENIZER_FILES from `folder`, each stored plain or gzipped (name + ".gz")."""
    files = {}
    for name in TOKENIZER_FILES:
        path = Path(folder) / name
        files[name] = path.read_bytes() if path.is_file() else gzip.decompress(path.with_name(name + ".gz").read_bytes())
    return files


def _tokenizer_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for data in read_tokenizer_files(folder).values():
        h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def read_param_list(path: Path) -> list[tuple[str, tuple[int, ...]]]:
    """`name<TAB>[d0, d1, ...]` lines; `#` starts a comment line."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, shape = line.split("\t")
        out.append((name, tuple(int(d) for d in json.loads(shape))))
    return out


def real_0_6b_spec(seed: int = DEFAULT_SEED) -> ModelSpec:
    """The full-size Qwen3-TTS-12Hz-0.6B-Base layout (914.6 M + 170.6 M parameters)."""
    config = json.loads(data_path("real_config_0.6B.json").read_text(encoding="utf-8"))
    tok = json.loads(data_path("real_config_tokenizer.json").read_text(encoding="utf-8"))
    tok["encoder_config"] = dict(MIMI_ENCODER_CONFIG)   # the data file only names it
    eos = config["talker_config"]["codec_eos_token_id"]
    return ModelSpec(name=f"qwen3-tts-12hz-0.6b-base-random-s{seed}", config=config, speech_config=tok,
                     main_params=read_param_list(data_path("real_params_0.6B.txt")),
                     speech_params=read_param_list(data_path("real_params_tokenizer.txt")),
                     seed=seed, zero_rows={"talker.codec_head.weight": [eos]})


def spec_from_folder(folder: Path, seed: int = DEFAULT_SEED, name: str | None = None) -> ModelSpec:
    """The layout of an existing HF model folder (configs and tensor shapes, not values):
    lets tests run the benchmark on a small model through the same builder."""
    from ..engine.safetensors_reader import open_checkpoint

    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    speech = json.loads((folder / "speech_tokenizer" / "config.json").read_text(encoding="utf-8"))

    def params(sub: Path):
        return sorted((n, tuple(t.shape)) for n, t in open_checkpoint(sub).items())
    eos = config["talker_config"].get("codec_eos_token_id", CODEC_EOS_ID)
    return ModelSpec(name=name or f"{folder.name}-random-s{seed}", config=config, speech_config=speech,
                     main_params=params(folder), speech_params=params(folder / "speech_tokenizer"),
                     seed=seed, zero_rows={"talker.codec_head.weight": [eos]}, tokenizer_dir=folder)


# ---- random values --------------------------------------------------------------------------

def _rule(name: str, shape: tuple[int, ...]) -> tuple[str, float, float]:
    """(distribution, offset, scale) of a tensor: values = offset + scale * N(0,1) (or U(0,1))."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "initialized":                      # Mimi codebook flag, 1.0 once trained
        return "const", 1.0, 0.0
    if leaf == "cluster_usage":
        return "uniform", 0.5, 1.0
    if leaf in ("embed_sum", "embedding_sum"):
        return "normal", 0.0, 1.0
    if len(shape) == 1:
        if "norm" in name and leaf == "weight":
            return "normal", 1.0, 0.1
        if leaf in ("alpha", "beta"):              # SnakeBeta, log scale
            return "normal", 0.0, 0.1
        if leaf in ("scale", "gamma"):             # LayerScale, ConvNeXt gamma
            return "normal", 0.1, 0.02
        return "normal", 0.0, 0.02                 # biases (and LayerNorm biases)
    fan_in = max(1, int(np.prod(shape[1:], dtype=np.int64)))
    return "normal", 0.0, 1.0 / float(np.sqrt(fan_in))


def random_chunks(name: str, shape: tuple[int, ...], seed: int, zero_rows: Iterable[int] = ()) -> Iterator[np.ndarray]:
    """The tensor's float32 values in storage order, at most CHUNK_ELEMENTS at a time (whole
    rows unless a row alone is larger). Deterministic per (seed, name), whatever the order
    tensors are built in."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    kind, offset, scale = _rule(name, shape)
    total = int(np.prod(shape, dtype=np.int64)) if shape else 1
    row = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
    step = max(row, CHUNK_ELEMENTS // row * row) if row <= CHUNK_ELEMENTS else CHUNK_ELEMENTS
    zero = sorted(set(int(r) for r in zero_rows))
    for start in range(0, total, step):
        n = min(step, total - start)
        if kind == "const":
            v = np.full(n, offset, dtype=np.float32)
        elif kind == "uniform":
            v = rng.random(n, dtype=np.float32)
            v *= np.float32(scale)
            v += np.float32(offset)
        else:
            v = rng.standard_normal(n, dtype=np.float32)
            if scale != 1.0:
                v *= np.float32(scale)
            if offset:
                v += np.float32(offset)
        for r in zero:
            lo, hi = max(r * row, start), min((r + 1) * row, start + n)
            if lo < hi:
                v[lo - start: hi - start] = 0.0
        yield v


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) of float32 values, rounded to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
    return (rounded >> np.uint32(16)).astype(np.uint16)


# ---- safetensors writing --------------------------------------------------------------------

_WIDTH = {"F32": 4, "BF16": 2}


def write_safetensors(path: Path, params: list[tuple[str, tuple[int, ...]]], dtype: str, seed: int,
                      zero_rows: dict | None = None, progress: ProgressFn | None = None) -> int:
    """Writes random tensors as a .safetensors file; returns its size in bytes."""
    if dtype not in _WIDTH:
        raise ValueError(f"unsupported dtype {dtype}")
    zero_rows = zero_rows or {}
    width = _WIDTH[dtype]
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    ordered = sorted(params)
    for name, shape in ordered:
        n = int(np.prod(shape, dtype=np.int64)) if shape else 1
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n * width]}
        offset += n * width
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-(8 + len(blob)) % 8)   # data starts 8-byte aligned, as safetensors writes it
    path = Path(path)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for i, (name, shape) in enumerate(ordered):
            for chunk in random_chunks(name, shape, seed, zero_rows.get(name, ())):
                data = f32_to_bf16_bits(chunk) if dtype == "BF16" else chunk
                f.write(memoryview(data).cast("B"))
            if progress and (i % 50 == 0 or i == len(ordered) - 1):
                progress(f"{path.name}: {i + 1}/{len(ordered)} tensors")
    size = path.stat().st_size
    if size != 8 + len(blob) + offset:
        raise OSError(f"{path} has {size} bytes, expected {8 + len(blob) + offset}")
    return size


def _write_json(path: Path, obj) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


# ---- the folder -----------------------------------------------------------------------------

STAMP = "BUILD_OK.json"


def build_hf_folder(spec: ModelSpec, out: Path, progress: ProgressFn | None = None) -> dict:
    """Writes the HF folder for `spec` at `out` (atomically: built aside, then renamed).
    Returns the build record also stored in out/BUILD_OK.json."""
    out = Path(out)
    t0 = time.perf_counter()
    tmp = out.with_name(f"{out.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "speech_tokenizer").mkdir(parents=True)
    try:
        config = copy.deepcopy(spec.config)
        for name, data in read_tokenizer_files(spec.tokenizer_dir).items():
            (tmp / name).write_bytes(data)
        _write_json(tmp / "config.json", config)
        _write_json(tmp / "generation_config.json", GENERATION_CONFIG)
        _write_json(tmp / "speech_tokenizer" / "config.json", spec.speech_config)
        _write_json(tmp / "speech_tokenizer" / "preprocessor_config.json", PREPROCESSOR_CONFIG)
        write_safetensors(tmp / "model.safetensors", spec.main_params, "BF16", spec.seed, spec.zero_rows, progress)
        write_safetensors(tmp / "speech_tokenizer" / "model.safetensors", spec.speech_params, "F32", spec.seed + 1,
                          spec.zero_rows, progress)
        record = {"key": spec.key(), "name": spec.name, "seed": spec.seed, "params": spec.n_params,
                  "bytes": folder_bytes(tmp), "build_s": round(time.perf_counter() - t0, 2)}
        _write_json(tmp / STAMP, record)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return record


def folder_bytes(path: Path) -> int:
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _read_stamp(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def default_cache_dir() -> Path:
    import platformdirs
    return Path(platformdirs.user_cache_dir("vocable")) / "bench"


def _converter_key() -> str:
    """Changes when the converter does: a cached GGUF from an older converter is redone."""
    from .. import __version__
    from ..engine import convert
    try:
        src = Path(convert.__file__).read_bytes()
    except OSError:   # frozen build without sources
        src = b""
    return hashlib.sha256(src + __version__.encode() + str(convert.FORMAT_VERSION).encode()).hexdigest()[:16]


@dataclass
class BenchModel:
    hf_dir: Path | None               # None: a .gguf given by the user (no reference side)
    gguf: Path
    weight_type: str
    params: int | None
    hf_bytes: int
    gguf_bytes: int
    random: bool = True               # random weights built here (else: a folder given by the user)
    build_s: float | None = None      # set when built by this call
    convert_s: float | None = None    # set when converted by this call

    def describe(self) -> dict:
        return {"hf_dir": str(self.hf_dir) if self.hf_dir else None, "gguf": str(self.gguf), "weight_type": self.weight_type,
                "random_weights": self.random, "params": self.params, "hf_bytes": self.hf_bytes,
                "gguf_bytes": self.gguf_bytes, "build_s": self.build_s, "convert_s": self.convert_s}


def ensure_gguf(hf_dir: Path, gguf: Path, source_key: str, weight_type: str,
                progress: ProgressFn | None = None) -> float | None:
    """Converts `hf_dir` to `gguf` unless a conversion of the same source by the same converter
    is there already. Returns the conversion time, None when the cached file was kept."""
    from ..engine.convert import convert

    stamp_path = gguf.with_name(gguf.name + ".json")
    want = {"source": source_key, "converter": _converter_key(), "weight_type": weight_type}
    have = _read_stamp(stamp_path)
    if gguf.is_file() and have and {k: have.get(k) for k in want} == want:
        return None
    if progress:
        progress(f"converting {hf_dir.name} to {gguf.name} ({weight_type})")
    stamp_path.unlink(missing_ok=True)
    t0 = time.perf_counter()
    convert(hf_dir, gguf, weight_type)
    convert_s = round(time.perf_counter() - t0, 2)
    gc.collect()   # the checkpoint's memory maps sit in reference cycles: unmap them before the engine loads
    _write_json(stamp_path, {**want, "convert_s": convert_s})
    return convert_s


def ensure_bench_model(spec: ModelSpec | None = None, cache_dir: Path | None = None, weight_type: str = "f32",
                       progress: ProgressFn | None = None) -> BenchModel:
    """The benchmark model for `spec` (default: the real 0.6B layout) as an HF folder and a
    converted GGUF, built and converted once and cached under `cache_dir`."""
    spec = spec or real_0_6b_spec()
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    hf_dir = root / spec.name
    build_s = None
    stamp = _read_stamp(hf_dir / STAMP)
    complete = all((hf_dir / f).is_file() for f in ("model.safetensors", "speech_tokenizer/model.safetensors"))
    if not stamp or stamp.get("key") != spec.key() or not complete:
        if progress:
            progress(f"building the random {spec.name} model ({spec.n_params / 1e6:.1f} M parameters) in {hf_dir}")
        stamp = build_hf_folder(spec, hf_dir, progress)
        build_s = stamp["build_s"]
    gguf = root / f"{spec.name}-{weight_type}.gguf"
    convert_s = ensure_gguf(hf_dir, gguf, spec.key(), weight_type, progress)
    return BenchModel(hf_dir=hf_dir, gguf=gguf, weight_type=weight_type, params=int(stamp["params"]),
                      hf_bytes=int(stamp["bytes"]), gguf_bytes=gguf.stat().st_size, build_s=build_s,
                      convert_s=convert_s)


def user_model(path: Path, cache_dir: Path | None = None, weight_type: str = "f32",
               progress: ProgressFn | None = None) -> BenchModel:
    """A model given on the command line: an HF folder (converted once, cached by path, sizes
    and modification times) or a converted .gguf (engine side only)."""
    path = Path(path).resolve()
    if path.is_file():
        return BenchModel(hf_dir=None, gguf=path, weight_type="as converted", params=None, hf_bytes=0,
                          gguf_bytes=path.stat().st_size, random=False)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is neither a converted .gguf model nor a Hugging Face model folder")
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    files = sorted(p for p in path.rglob("*") if p.is_file())
    source_key = hashlib.sha256(json.dumps([str(path)] + [[str(p.relative_to(path)), p.stat().st_size,
                                                              p.stat().st_mtime_ns] for p in files]).encode()).hexdigest()[:16]
    gguf = root / f"{path.name}-{hashlib.sha256(str(path).encode()).hexdigest()[:8]}-{weight_type}.gguf"
    convert_s = ensure_gguf(path, gguf, source_key, weight_type, progress)
    return BenchModel(hf_dir=path, gguf=gguf, weight_type=weight_type, params=None,
                      hf_bytes=sum(p.stat().st_size for p in files), gguf_bytes=gguf.stat().st_size, random=False,
                      convert_s=convert_s)
