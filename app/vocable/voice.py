"""A cloned voice: the speaker embedding and reference codes of a clip, and its file format.

Voice files are safetensors (tensors + string metadata, no code execution on load)."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import VoiceError

VOICE_FORMAT = "vocable-voice"
VOICE_FORMAT_VERSION = 1


@dataclass
class Voice:
    speaker_embedding: np.ndarray           # float32 [D]
    codes: np.ndarray | None = None         # int32 [frames, codebooks]: the reference codes
    ref_text: str | None = None             # transcript of the reference (in-context cloning)
    name: str = ""
    model_variant: str = ""                 # the model the voice was made with ("0.6B", ...)
    reference_seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)

    def __post_init__(self):
        self.speaker_embedding = np.ascontiguousarray(self.speaker_embedding, dtype=np.float32)
        if self.speaker_embedding.ndim != 1 or self.speaker_embedding.size == 0:
            raise VoiceError(f"speaker embedding must be a non-empty vector, got shape {list(self.speaker_embedding.shape)}")
        if self.codes is not None:
            self.codes = np.ascontiguousarray(self.codes, dtype=np.int32)
            if self.codes.ndim != 2:
                raise VoiceError(f"reference codes must be [frames, codebooks], got shape {list(self.codes.shape)}")

    def save(self, path: str | Path) -> Path:
        """Writes the voice atomically (a temporary file renamed into place)."""
        from safetensors.numpy import save_file

        path = Path(path)
        tensors = {"speaker_embedding": self.speaker_embedding}
        if self.codes is not None:
            tensors["codes"] = self.codes
        meta = {"format": VOICE_FORMAT, "version": str(VOICE_FORMAT_VERSION), "name": self.name,
                "ref_text": self.ref_text or "", "has_ref_text": json.dumps(self.ref_text is not None),
                "model_variant": self.model_variant, "reference_seconds": repr(float(self.reference_seconds))}
        tmp = path.with_name(path.name + ".tmp")
        try:
            save_file(tensors, str(tmp), metadata=meta)
            os.replace(tmp, path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise VoiceError(f"cannot write the voice file {path}: {e.strerror or e}") from e
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Voice":
        from safetensors import SafetensorError, safe_open

        path = Path(path)
        if not path.is_file():
            raise VoiceError(f"voice file not found: {path}")
        try:
            with safe_open(str(path), framework="numpy") as f:
                meta = f.metadata() or {}
                if meta.get("format") != VOICE_FORMAT:
                    raise VoiceError(f"{path.name} is not a Vocable voice file")
                if int(meta.get("version", "0")) > VOICE_FORMAT_VERSION:
                    raise VoiceError(f"{path.name} was written by a newer Vocable (voice format {meta['version']})")
                keys = set(f.keys())
                embedding = f.get_tensor("speaker_embedding")
                codes = f.get_tensor("codes") if "codes" in keys else None
        except (SafetensorError, OSError, ValueError) as e:
            raise VoiceError(f"{path.name} is not a readable voice file ({e})") from e
        has_text = meta.get("has_ref_text") == "true"
        return cls(embedding, codes, meta.get("ref_text") if has_text else None, meta.get("name", ""),
                   meta.get("model_variant", ""), float(meta.get("reference_seconds", "0") or 0))
