"""How far the engine's outputs are from the official package's, on the bench's real-shape model:
one comparison per kind of output (a vector, codes, a waveform), each a dict with its `kind`,
and one report of a group's comparisons."""
from __future__ import annotations

import numpy as np


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return round(float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30)), 6)


def embedding_agreement(ours, theirs) -> dict:
    """Two vectors (speaker embeddings): cosine and largest difference."""
    a = np.asarray(ours, dtype=np.float64).ravel()
    b = np.asarray(theirs, dtype=np.float64).ravel()
    if a.shape != b.shape or not a.size:
        return {"kind": "embedding", "shapes": [list(a.shape), list(b.shape)]}
    return {"kind": "embedding", "cosine": _cosine(a, b), "max_abs_diff": float(np.abs(a - b).max())}


def codes_agreement(ours, theirs) -> dict:
    """Share of identical codes between two [frames, 16] code arrays, over the common frames."""
    x, y = np.asarray(ours), np.asarray(theirs)
    out: dict = {"kind": "codes", "frames": [int(x.shape[0]), int(y.shape[0])]}
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1]:
        out["shapes"] = [list(x.shape), list(y.shape)]
        return out
    n = min(x.shape[0], y.shape[0])
    if not n:
        return out
    same = x[:n] == y[:n]
    exact = same.all(axis=1)
    out.update(identical=round(float(same.mean()), 4), identical_codebook0=round(float(same[:, 0].mean()), 4),
               frames_identical=round(float(exact.mean()), 4),
               first_different_frame=None if exact.all() else int(np.argmin(exact)))
    return out


def waveform_agreement(ours, theirs) -> dict:
    """Two decodes of the same codes: cosine and residual (dB below the reference's signal) over
    the common samples."""
    a = np.asarray(ours, dtype=np.float64).ravel()
    b = np.asarray(theirs, dtype=np.float64).ravel()
    out: dict = {"kind": "waveform", "samples": [int(a.size), int(b.size)]}
    n = min(a.size, b.size)
    if not n:
        return out
    a, b = a[:n], b[:n]
    diff, signal = float(np.sum((a - b) ** 2)), float(np.sum(b * b))
    out.update(cosine=_cosine(a, b),
               residual_db=round(10 * np.log10(diff / signal), 1) if diff > 0 and signal > 0 else None,
               max_abs_diff=float(np.abs(a - b).max()))
    return out


def _lengths(counts: list[int], unit: str) -> str:
    return f"{counts[0]} {unit}" if counts[0] == counts[1] else f"{counts[0]} vs {counts[1]} {unit} (compared {min(counts)})"


def _describe_embedding(c: dict) -> str:
    if "cosine" not in c:
        return f"shapes differ: {c['shapes'][0]} vs {c['shapes'][1]}"
    return f"cosine {c['cosine']:.6f}" + (" (identical)" if c["max_abs_diff"] == 0 else
                                          f" (max abs diff {c['max_abs_diff']:.2g})")


def _describe_codes(c: dict) -> str:
    if "shapes" in c:
        return f"code shapes differ: {c['shapes'][0]} vs {c['shapes'][1]}"
    if c.get("identical") is None:
        return f"nothing to compare ({_lengths(c['frames'], 'frames')})"
    first = "" if c["first_different_frame"] is None else f", first difference at frame {c['first_different_frame']}"
    return (f"{100 * c['identical']:.1f}% identical (codebook 0: {100 * c['identical_codebook0']:.1f}%, "
            f"whole frames: {100 * c['frames_identical']:.1f}%{first}), {_lengths(c['frames'], 'frames')}")


def _describe_waveform(c: dict) -> str:
    if c.get("cosine") is None:
        return f"nothing to compare ({_lengths(c['samples'], 'samples')})"
    residual = "exact" if c["residual_db"] is None else f"residual {c['residual_db']:.1f} dB"
    return (f"waveform cosine {c['cosine']:.6f} ({residual}, max abs diff {c['max_abs_diff']:.2g}), "
            f"{_lengths(c['samples'], 'samples')}")


_DESCRIBE = {"embedding": _describe_embedding, "codes": _describe_codes, "waveform": _describe_waveform}
_LABELS = {"speaker_embedding": "speaker embedding", "reference_codes": "reference codes"}   # others: weight types


def describe(title: str, comparisons: dict[str, dict]) -> str:
    """A group's comparisons under its title, one line each ("" when there are none); a
    comparison's name says what was compared ("speaker_embedding", a weight type ...)."""
    lines = [f"{_LABELS.get(name, name)} {_DESCRIBE[c['kind']](c)}" for name, c in comparisons.items()]
    return f"{title}:" + "".join(f"\n    {line}" for line in lines) if lines else ""
