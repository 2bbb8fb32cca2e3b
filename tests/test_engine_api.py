"""The Python engine API: model info, log forwarding, the GIL, errors of the native layer."""
from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest

from conftest import reference
from vocable import Engine, ModelError, _engine


def test_versions_and_abi():
    assert _engine.abi_min_version() <= _engine.abi_version()
    assert _engine.ABI_VERSION == _engine.abi_version()
    assert _engine.version() == _engine.__version__
    assert _engine.ggml_version().startswith("0.")


@pytest.mark.parametrize("variant,variant_name", [("0.6b", "0.6B"), ("1.7b", "1.7B")])
def test_model_info(converted, variant, variant_name):
    with Engine(converted(variant, "f32"), threads=1) as engine:
        info = engine.info
    assert info["variant"] == variant_name
    assert info["sample_rate"] == 24000 and info["samples_per_frame"] == 1920
    assert info["n_codebooks"] == 16 and info["codebook_size"] == 2048
    assert info["n_speaker_embd"] == info["talker_hidden"]
    assert info["weight_type"] == "f32"


def test_perf_lines_reach_python_logging(converted, caplog):
    with caplog.at_level(logging.INFO, logger="vocable.engine"):
        with Engine(converted("0.6b", "f32"), threads=2) as engine:
            engine.embed_voice(reference("0.6b", "ref_wav_24k"), 24000)
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "vocable.engine")
    assert "[Perf] model load" in text
    assert "[Perf] speaker embedding" in text and "reference codes" in text


def test_generation_perf_lines(converted, caplog):
    from vocable import Voice
    voice = Voice(reference("0.6b", "speaker_embedding"))
    with caplog.at_level(logging.INFO, logger="vocable.engine"):
        with Engine(converted("0.6b", "f32"), threads=2) as engine:
            engine.synthesize("Hello world.", voice, greedy=True, max_frames=5)
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "vocable.engine")
    for part in ("[Perf] prompt build", "prefill", "time to first frame", "talker", "ms/frame", "code predictor"):
        assert part in text


def test_gil_is_released_while_computing(converted):
    """Another Python thread keeps running while the engine embeds a long clip."""
    clip = np.tile(reference("0.6b", "ref_wav_24k"), 20)  # 60 s
    ticks = []
    done = threading.Event()

    def ticker():
        while not done.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    with Engine(converted("0.6b", "f32"), threads=1) as engine:
        t = threading.Thread(target=ticker)
        t.start()
        start = time.perf_counter()
        engine.embed_voice(clip, 24000)
        elapsed = time.perf_counter() - start
        done.set()
        t.join()
    during = [x for x in ticks if start <= x <= start + elapsed]
    assert elapsed > 0.02
    assert len(during) >= 5, f"only {len(during)} ticks in {elapsed:.3f} s"


def test_closed_engine_refuses_work(converted):
    engine = Engine(converted("0.6b", "f32"), threads=1)
    engine.close()
    with pytest.raises(ValueError, match="closed"):
        engine.embed_voice(reference("0.6b", "ref_wav_24k"), 24000)


def test_folder_instead_of_model(tmp_path):
    with pytest.raises(ModelError, match="convert it first"):
        Engine(tmp_path)


def test_bad_thread_count(converted):
    with pytest.raises(ValueError, match="threads"):
        Engine(converted("0.6b", "f32"), threads=0)


def test_concurrent_calls_are_serialised(converted):
    """Two Python threads sharing one Engine get the same, correct results."""
    clip = reference("0.6b", "ref_wav_24k")
    with Engine(converted("0.6b", "f32"), threads=1) as engine:
        expected = engine.embed_voice(clip, 24000)
        results = []

        def work():
            for _ in range(3):
                results.append(engine.embed_voice(clip, 24000))

        threads = [threading.Thread(target=work) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(results) == 9
    for v in results:
        np.testing.assert_array_equal(v.codes, expected.codes)
        np.testing.assert_allclose(v.speaker_embedding, expected.speaker_embedding, rtol=0, atol=1e-6)
