"""A GGUF file's metadata without its tensors: every length is checked against the file size, and
every string (kept or not) must be UTF-8, as GGUF requires, so any file, however damaged or
hostile, gives a ModelError and never a crash or a huge allocation. Much quicker than
gguf.GGUFReader, which maps the file and builds a view of every tensor.

    meta = read_gguf_header(path, {"general.name", "general.file_type"})
"""
from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Collection

from ..errors import ModelError

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
MAX_KV = 1 << 20
MAX_TENSORS = 1 << 20
MAX_KEY_BYTES = 1 << 16
MAX_KEPT_ITEMS = 1 << 20   # items of an array that is returned (a language list has tens)
# Items of all the arrays that are returned or that are walked one by one (of strings, or of
# arrays): the Qwen tokenizer's vocabulary and merges are 303,030; a hostile header of millions
# of tiny strings would take seconds each million, and its kept items a Python object each.
MAX_ITEMS = 1 << 21


class _Reader:
    """Bounded little-endian reads from a file: every length is checked against the file size."""

    def __init__(self, f, size: int, what: str):
        self.f, self.size, self.what = f, size, what
        self.items = 0   # array items read one by one (MAX_ITEMS)

    def read(self, n: int) -> bytes:
        if n < 0 or self.f.tell() + n > self.size:
            raise ModelError(f"{self.what} is truncated or not a GGUF model file")
        data = self.f.read(n)
        if len(data) != n:
            raise ModelError(f"{self.what} is truncated")
        return data

    def skip(self, n: int) -> None:
        if n < 0 or self.f.tell() + n > self.size:
            raise ModelError(f"{self.what} is truncated or not a GGUF model file")
        self.f.seek(n, os.SEEK_CUR)

    def unpack(self, fmt: str):
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self, limit: int | None = None, keep: bool = True) -> str | None:
        n = self.unpack("<Q")
        if limit is not None and n > limit:
            raise ModelError(f"{self.what} has an oversized key: not a GGUF model file")
        try:
            text = self.read(n).decode("utf-8")  # decoded even when skipped: the engine reads it too
        except UnicodeDecodeError as e:
            raise ModelError(f"{self.what} has text that is not UTF-8 (at byte {self.f.tell() - n + e.start}): "
                             "not a GGUF model file") from None
        return text if keep else None

    def value(self, vtype: int, keep: bool, depth: int = 0):
        if vtype in _SCALARS:
            fmt = _SCALARS[vtype]
            if not keep:
                self.skip(struct.calcsize(fmt))
                return None
            return self.unpack(fmt)
        if vtype == _STRING:
            return self.string(keep=keep)
        if vtype == _ARRAY and depth < 4:
            item_type, count = self.unpack("<I"), self.unpack("<Q")
            if count > self.size:
                raise ModelError(f"{self.what} is truncated or not a GGUF model file")
            if keep or item_type not in _SCALARS:
                self.items += count
                if self.items > MAX_ITEMS:
                    raise ModelError(f"{self.what} has more than {MAX_ITEMS} metadata array items: not a Vocable "
                                     "model file")
            if keep:
                if count > MAX_KEPT_ITEMS or item_type == _ARRAY:   # no value Vocable reads is an array of arrays
                    raise ModelError(f"{self.what} has a metadata array of {count} items"
                                     f"{' of arrays' if item_type == _ARRAY else ''}: not a Vocable model file")
                return [self.value(item_type, True, depth + 1) for _ in range(count)]
            if item_type in _SCALARS:
                self.skip(count * struct.calcsize(_SCALARS[item_type]))
            else:
                for _ in range(count):
                    self.value(item_type, False, depth + 1)
            return None
        raise ModelError(f"{self.what} has a metadata value of unknown type {vtype}: not a GGUF model file")


def read_gguf_header(path: Path, keys: Collection[str]) -> dict:
    """The values of `keys` in a GGUF file's metadata (numbers, strings, arrays as lists; absent
    keys are left out), and `data_start`, `data_end` (where the tensors must end) and
    `file_size`. ModelError when it is not a well-formed GGUF file."""
    from gguf import GGML_QUANT_SIZES

    path = Path(path)
    what = str(path)
    wanted = set(keys) | {"general.alignment"}
    try:
        size = path.stat().st_size
        f = open(path, "rb")
    except OSError as e:
        raise ModelError(f"cannot read {path}: {e.strerror or e}") from e
    with f:
        r = _Reader(f, size, what)
        if size < 24 or f.read(4) != b"GGUF":
            raise ModelError(f"{what} is not a GGUF model file")
        version = r.unpack("<I")
        if version not in (2, 3):
            raise ModelError(f"{what} is GGUF version {version}; Vocable reads versions 2 and 3")
        n_tensors, n_kv = r.unpack("<Q"), r.unpack("<Q")
        if n_tensors > MAX_TENSORS or n_kv > MAX_KV:
            raise ModelError(f"{what} is not a GGUF model file (implausible counts)")
        meta: dict = {}
        for _ in range(n_kv):
            key = r.string(MAX_KEY_BYTES)
            vtype = r.unpack("<I")
            value = r.value(vtype, key in wanted)
            if key in wanted:
                meta[key] = value
        data_end = 0
        for _ in range(n_tensors):
            name = r.string(MAX_KEY_BYTES)
            n_dims = r.unpack("<I")
            if not 1 <= n_dims <= 4:
                raise ModelError(f"{what}: tensor {name[:60]!r} has {n_dims} dimensions")
            dims = [r.unpack("<Q") for _ in range(n_dims)]
            ttype, offset = r.unpack("<I"), r.unpack("<Q")
            if ttype not in GGML_QUANT_SIZES:
                raise ModelError(f"{what}: tensor {name[:60]!r} has unknown type {ttype}")
            block, type_size = GGML_QUANT_SIZES[ttype]
            elements = 1
            for d in dims:
                elements *= d
            if dims[0] % block or elements > size * block:
                raise ModelError(f"{what}: tensor {name[:60]!r} has an impossible shape {dims}")
            data_end = max(data_end, offset + elements // block * type_size)
        alignment = meta.get("general.alignment", 32)
        if (not isinstance(alignment, int) or isinstance(alignment, bool) or not 1 <= alignment <= 1 << 16
                or alignment & (alignment - 1)):
            raise ModelError(f"{what} has an invalid alignment {str(alignment)[:20]} (a power of two is needed)")
        data_start = -(-f.tell() // alignment) * alignment
    if "general.alignment" not in keys:
        meta.pop("general.alignment", None)
    meta["data_start"] = data_start
    meta["data_end"] = data_start + data_end
    meta["file_size"] = size
    return meta
