"""Crafted model files for the tests: a converted model rewritten with chosen metadata and
tensors and a checksum table that matches them (what the checksums alone cannot catch)."""
from __future__ import annotations


def craft_gguf(src, dst, *, kv: dict | None = None, tensors: dict | None = None, keep_tensors: bool = True):
    """Rewrites the converted model `src` as `dst` with metadata values replaced (`kv`: key ->
    (value, GGUFValueType)) and tensors replaced (`tensors`: name -> (numpy data, ggml type)),
    and a checksum table that matches, as a careful attacker would write it. With
    `keep_tensors=False` the file has no tensors at all, not even the checksum table."""
    import gguf
    import numpy as np

    from vocable.engine.convert import CHECKSUM_TENSOR, _checksum_final, _checksum_update

    kv, tensors = kv or {}, tensors or {}
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(dst), arch, use_temp_file=False)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name in kv:
            value, vtype = kv.pop(name)
        else:
            value, vtype = field.contents(), gguf.GGUFValueType(field.types[0])
        sub = gguf.GGUFValueType(field.types[-1]) if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, vtype, sub_type=sub)
    for name, (value, vtype) in kv.items():   # new keys
        writer.add_key_value(name, value, vtype)
    checksums = []
    if keep_tensors:
        for t in reader.tensors:
            if t.name == CHECKSUM_TENSOR:
                continue
            data, qtype = tensors.get(t.name, (np.asarray(t.data), gguf.GGMLQuantizationType(t.tensor_type)))
            data = np.ascontiguousarray(data)
            shape = [int(d) for d in reversed(t.shape)]     # numpy order
            if data.dtype == np.uint8:   # quantised: bytes per row, which the writer maps back
                writer.add_tensor(t.name, data.reshape(*shape[:-1], -1), raw_dtype=qtype)
            else:
                writer.add_tensor(t.name, data.reshape(shape), raw_dtype=qtype)
            state, carry = [0, 0], bytearray()
            _checksum_update(state, memoryview(data).cast("B"), carry)
            checksums.append(_checksum_final(state, carry))
        writer.add_tensor(CHECKSUM_TENSOR, np.array(checksums, dtype="<u8").view("<i4"))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst
