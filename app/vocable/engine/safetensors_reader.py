"""Streaming reader for .safetensors files (header + raw little-endian data).

Reads tensors lazily through a memory map, so converting a 1.8 GB checkpoint never holds it
twice. Understands F32, F16 and BF16 (numpy has no bfloat16: BF16 is widened to float32 by
shifting the 16 stored bits into the high half of a float32).
"""
from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..untrusted import parse_json

_DTYPES = {"F32": (np.dtype("<f4"), 4), "F16": (np.dtype("<f2"), 2), "BF16": (np.dtype("<u2"), 2),
           "I64": (np.dtype("<i8"), 8), "I32": (np.dtype("<i4"), 4), "BOOL": (np.dtype("u1"), 1),
           "U8": (np.dtype("u1"), 1)}


class SafetensorsError(ValueError):
    """A .safetensors file is missing, truncated or malformed."""


@dataclass(frozen=True)
class TensorRef:
    file: "SafetensorsFile"
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def rows_f32(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of the tensor viewed as [shape[0], -1], as float32."""
        row = self.numel // self.shape[0] if self.shape else 1
        return self.file.read_f32(self, start * row, stop * row).reshape(stop - start, row)

    def f32(self) -> np.ndarray:
        return self.file.read_f32(self, 0, self.numel).reshape(self.shape)


class SafetensorsFile:
    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            size = os.path.getsize(self.path)
            with open(self.path, "rb") as f:
                head = f.read(8)
                if len(head) != 8:
                    raise SafetensorsError(f"{self.path} is truncated: no header")
                (header_len,) = struct.unpack("<Q", head)
                if header_len > min(size - 8, 100 * 1024 * 1024):
                    raise SafetensorsError(f"{self.path} is truncated or not a safetensors file "
                                           f"(header of {header_len} bytes in a {size}-byte file)")
                header = parse_json(f.read(header_len))
        except OSError as e:
            raise SafetensorsError(f"cannot read {self.path}: {e.strerror or e}") from e
        except ValueError as e:
            raise SafetensorsError(f"{self.path} is corrupt: its header is not valid JSON ({e})") from e
        if not isinstance(header, dict):
            raise SafetensorsError(f"{self.path} is corrupt: its header is not a JSON object")
        self._data_start = 8 + header_len
        self._map: np.memmap | None = None
        self.tensors: dict[str, TensorRef] = {}
        data_size = size - self._data_start
        for name, info in header.items():
            if name == "__metadata__":
                continue
            try:
                dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
            except (KeyError, TypeError, ValueError) as e:
                raise SafetensorsError(f"{self.path} is corrupt: bad header entry for {name[:80]!r}") from e
            numbers = [*shape, begin, end] if isinstance(shape, list) and len(shape) <= 8 else None
            if numbers is None or not all(type(n) is int and n >= 0 for n in numbers) or begin > end:
                raise SafetensorsError(f"{self.path} is corrupt: bad shape or offsets for {name[:80]!r}")
            if not isinstance(dtype, str) or dtype not in _DTYPES:
                raise SafetensorsError(f"{self.path}: tensor {name[:80]!r} has unsupported dtype {str(dtype)[:20]}")
            ref = TensorRef(self, name, dtype, tuple(shape), begin, end)
            if ref.end - ref.begin != ref.numel * _DTYPES[dtype][1]:
                raise SafetensorsError(f"{self.path} is corrupt: tensor {name[:80]!r} has {ref.end - ref.begin} bytes "
                                       f"for shape {list(shape)} {dtype}")
            if ref.end > data_size:
                raise SafetensorsError(f"{self.path} is truncated: tensor {name[:80]!r} ends at byte "
                                       f"{self._data_start + ref.end}, the file has {size}")
            self.tensors[name] = ref

    def _mapped(self) -> np.memmap:
        if self._map is None:
            try:
                self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
            except (OSError, ValueError) as e:
                raise SafetensorsError(f"cannot read {self.path}: {getattr(e, 'strerror', None) or e}") from e
        return self._map

    def read_f32(self, ref: TensorRef, first: int, last: int) -> np.ndarray:
        """Elements [first, last) of `ref` as a new float32 array."""
        dtype, width = _DTYPES[ref.dtype]
        raw = self._mapped()[self._data_start + ref.begin + first * width: self._data_start + ref.begin + last * width]
        values = raw.view(dtype)
        if ref.dtype == "BF16":
            return (values.astype(np.uint32) << 16).view(np.float32)
        return values.astype(np.float32)


def open_checkpoint(folder: Path) -> dict[str, TensorRef]:
    """All tensors of a Hugging Face checkpoint folder: model.safetensors, or the shards
    listed by model.safetensors.index.json."""
    folder = Path(folder)
    single = folder / "model.safetensors"
    index = folder / "model.safetensors.index.json"
    if single.is_file():
        return dict(SafetensorsFile(single).tensors)
    if index.is_file():
        try:
            weight_map = parse_json(index.read_bytes())["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise SafetensorsError(f"{index} is corrupt: {e}") from e
        if not all(isinstance(s, str) and s == Path(s).name and s not in (".", "..") for s in shards):
            raise SafetensorsError(f"{index} is corrupt: its shards must be file names in {folder}")
        tensors: dict[str, TensorRef] = {}
        for shard in shards:
            if not (folder / shard).is_file():
                raise SafetensorsError(f"{folder / shard} is missing (listed in {index.name})")
            tensors.update(SafetensorsFile(folder / shard).tensors)
        return tensors
    raise SafetensorsError(f"{folder} has no model.safetensors")
