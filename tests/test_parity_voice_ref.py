"""Parity of the reference-voice stages (mel, ECAPA, 12 Hz codec encoder) with the official
PyTorch package, on the committed tiny models of both variants (f32)."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import VARIANTS, cosine, reference

# stage -> whether our dump (numpy [T, C], from ggml ne = (C, T)) is the transpose of the
# reference's PyTorch layout ([C, T] for conv activations)
STAGES = {
    "mel_magnitude": True, "mel_filtered": True, "mel": False,
    "spk_block0": True, "spk_block1": True, "spk_block2": True, "spk_block3": True,
    "spk_mfa": True, "spk_asp": False, "speaker_embedding": False,
    "enc_seanet": True, "enc_transformer": False, "enc_latent": True,
}


@pytest.fixture(scope="module", params=VARIANTS)
def dumped(request, converted, tmp_path_factory):
    from vocable import Engine

    variant = request.param
    dump = tmp_path_factory.mktemp(f"dump-{variant}")
    with Engine(converted(variant, "f32"), threads=2, dump_dir=dump) as engine:
        voice = engine.embed_voice(reference(variant, "ref_wav_24k"), 24000)
    return variant, dump, voice


@pytest.mark.parametrize("stage", list(STAGES))
def test_stage_matches_reference(dumped, stage):
    variant, dump, _ = dumped
    ours = np.load(dump / f"{stage}.npy")
    ref = reference(variant, stage)
    if STAGES[stage]:
        ours = ours.T
    assert ours.shape == ref.shape, f"{stage}: shape {ours.shape} vs reference {ref.shape}"
    c = cosine(ours, ref)
    print(f"{variant} {stage}: cosine {c:.7f}, max abs diff {np.abs(ours - ref).max():.3g}")
    assert c >= 0.999


def test_speaker_embedding_returned(dumped):
    variant, _, voice = dumped
    ref = reference(variant, "speaker_embedding")
    assert voice.speaker_embedding.shape == ref.shape
    assert cosine(voice.speaker_embedding, ref) >= 0.999


def test_reference_codes(dumped):
    variant, dump, voice = dumped
    ref = reference(variant, "ref_codes")
    assert voice.codes.shape == ref.shape
    assert np.array_equal(np.load(dump / "ref_codes.npy"), voice.codes)
    same = float(np.mean(voice.codes == ref))
    print(f"{variant} reference codes identical: {100 * same:.2f}% of {ref.size}")
    assert same >= 0.99
