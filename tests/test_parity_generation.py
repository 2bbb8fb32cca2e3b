"""Generation (talker + code predictor + codec decoder) at parity with the reference on the tiny
fixtures: greedy codes identical for every frame and the waveform at cosine >= 0.999 in both
clone modes and both variants, stage dumps close, and the quantized types' agreement reported."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from conftest import VARIANTS, cosine, manifest, reference
from vocable import IN_CONTEXT, X_VECTOR, Engine, SynthesisCancelled, VocableError, Voice

MODES = ("xvec", "icl")


def fixture_voice(variant: str, mode: str) -> Voice:
    ref_text = manifest(variant)["ref_text"] if mode == "icl" else None
    return Voice(reference(variant, "speaker_embedding"), reference(variant, "ref_codes"), ref_text)


def run(engine: Engine, variant: str, mode: str, **kw):
    m = manifest(variant)
    frames = reference(variant, f"{mode}_codes").shape[0]
    return engine.synthesize(m["text"], fixture_voice(variant, mode), language=m["language"], greedy=True,
                             max_frames=frames, **kw).result()


@pytest.fixture(scope="module", params=[(v, mode) for v in VARIANTS for mode in MODES],
                ids=[f"{v}-{mode}" for v in VARIANTS for mode in MODES])
def generated(request, converted, tmp_path_factory):
    variant, mode = request.param
    dump = tmp_path_factory.mktemp(f"gen-{variant}-{mode}")
    with Engine(converted(variant, "f32"), threads=2, dump_dir=dump) as engine:
        result = run(engine, variant, mode)
    return variant, mode, dump, result


def test_greedy_codes_identical(generated):
    variant, mode, _, result = generated
    want = reference(variant, f"{mode}_codes")
    assert result.mode == (IN_CONTEXT if mode == "icl" else X_VECTOR), result.mode_reason
    assert result.codes.shape == want.shape
    same = np.mean(result.codes == want)
    print(f"{variant} {mode}: {100 * same:.1f}% of {want.size} codes identical")
    np.testing.assert_array_equal(result.codes, want)
    assert not result.reached_eos  # random weights never emit EOS


@pytest.mark.parametrize("stage,threshold", [("prefill_embeds", 0.9999), ("talker_step0_logits", 0.999),
                                             ("cp_step0_logits", 0.999), ("talker_hidden_layer0", 0.999)])
def test_stage_dumps(generated, stage, threshold):
    variant, mode, dump, _ = generated
    ours = np.load(dump / f"{stage}.npy")
    ref = reference(variant, f"{mode}_{stage}")
    assert ours.shape == ref.shape
    c = cosine(ours, ref)
    print(f"{variant} {mode} {stage}: cosine {c:.7f}")
    assert c >= threshold


def test_audio_matches_reference(generated):
    """The synthesized waveform (in-context: without the reference's own audio) against the
    reference's generate_voice_clone() output; the decoder's stage dumps are in the ctest."""
    variant, mode, dump, result = generated
    want = reference(variant, f"{mode}_wav")
    assert result.audio.shape == want.shape and result.sample_rate == 24000
    c = cosine(result.audio, want)
    print(f"{variant} {mode}: waveform cosine {c:.7f}")
    assert c >= 0.999
    for stage in ("dec_pre_transformer", "dec_block3"):
        assert (dump / f"{stage}.npy").is_file()


def test_codes_dump(generated):
    _, _, dump, result = generated
    np.testing.assert_array_equal(np.load(dump / "codes.npy"), result.codes)


@pytest.mark.parametrize("weight_type", ["f16", "q8_0", "q4_k"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_quantized_agreement(converted, tmp_path, variant, weight_type):
    """The share of identical codes is reported, not asserted (the issue sets no threshold: on
    random tiny models one flipped near-tie changes every later frame). The talker's step-0
    logits depend on the prompt alone and must keep cosine >= 0.99 for f16 and q8_0; so must
    the code predictor's first row (code 1 from h and code0) when frame 0's code0 agrees. The
    teacher-forced code predictor figures are in the test-code-predictor ctest."""
    for mode in MODES:
        dump = tmp_path / mode
        with Engine(converted(variant, weight_type), threads=2, dump_dir=dump) as engine:
            result = run(engine, variant, mode)
        want = reference(variant, f"{mode}_codes")
        same = float(np.mean(result.codes == want))
        c = cosine(np.load(dump / "talker_step0_logits.npy"), reference(variant, f"{mode}_talker_step0_logits"))
        line = f"{variant} {weight_type} {mode}: codes identical {100 * same:.1f}%, talker step-0 logits cosine {c:.5f}"
        if result.codes[0, 0] == want[0, 0]:
            c_cp = cosine(np.load(dump / "cp_step0_logits.npy")[0], reference(variant, f"{mode}_cp_step0_logits")[0])
            line += f", code predictor row-0 logits cosine {c_cp:.5f}"
            if weight_type in ("f16", "q8_0"):
                assert c_cp >= 0.99
        print(line)
        if weight_type in ("f16", "q8_0"):
            assert c >= 0.99


def test_seed_reproduces_a_sampled_run(engine):
    voice = fixture_voice("0.6b", "xvec")
    a = engine.synthesize("Hello world, this is a test.", voice, seed=1234, max_frames=12).result()
    b = engine.synthesize("Hello world, this is a test.", voice, seed=1234, max_frames=12).result()
    c = engine.synthesize("Hello world, this is a test.", voice, seed=99, max_frames=12).result()
    np.testing.assert_array_equal(a.codes, b.codes)
    assert not np.array_equal(a.codes, c.codes)
    assert a.seed == 1234
    d = engine.synthesize("Hello world, this is a test.", voice, max_frames=4).result()
    assert isinstance(d.seed, int)


def test_default_frame_cap_follows_text_length(engine):
    from vocable import _engine
    from vocable.engine import stream_frame_cap
    voice = fixture_voice("0.6b", "xvec")
    for text in ("Hello.", "Call 0151 496 0018 at 9:45."):
        # the caps themselves: the watchdog (test_runaway.py) stops the tiny model's runs sooner
        result = engine.synthesize(text, voice, greedy=True, watchdog=False).result()
        n_ids = len(engine.tokenizer.target_prompt(text).ids)
        assert result.codes.shape[0] == min(_engine.default_max_frames(n_ids), stream_frame_cap(text))
        assert not result.reached_eos


def test_cancel_from_another_thread(engine):
    voice = fixture_voice("0.6b", "xvec")
    timer = threading.Timer(0.05, engine.cancel)
    timer.start()
    with pytest.raises(SynthesisCancelled):
        engine.synthesize("Hello world, this is a test.", voice, max_frames=8192).result()
    timer.join()
    # the context stays usable
    assert engine.synthesize("Hello.", voice, greedy=True, max_frames=3).result().codes.shape == (3, 16)


def test_frames_arrive_as_generated(engine):
    voice = fixture_voice("0.6b", "xvec")
    with engine.synthesize("Hello world.", voice, greedy=True, max_frames=6) as stream:
        chunks = list(stream.chunks())
        result = stream.result()
    assert [c.first_frame for c in chunks] == [0, 1, 3]  # 1, 2, then the 3 left
    np.testing.assert_array_equal(np.concatenate([c.codes for c in chunks]), result.codes)


def test_consumer_can_stop(engine):
    voice = fixture_voice("0.6b", "xvec")
    with pytest.raises(SynthesisCancelled):
        with engine.synthesize("Hello world.", voice, max_frames=50) as stream:
            for chunk in stream.chunks():
                if chunk.first_frame >= 3:
                    stream.cancel()
    assert engine.synthesize("Hello.", voice, greedy=True, max_frames=2).result().codes.shape == (2, 16)


def test_errors(engine):
    voice = fixture_voice("0.6b", "xvec")
    from vocable.engine.text import TextError
    with pytest.raises(TextError):
        engine.synthesize("   ", voice)
    with pytest.raises(VocableError, match="unknown language 'klingon'"):
        engine.synthesize("Hello.", voice, language="klingon")
    other = Voice(np.zeros(voice.speaker_embedding.size + 4, dtype=np.float32))
    with pytest.raises(VocableError, match="another model size"):
        engine.synthesize("Hello.", other)
