"""The talker's and the code predictor's quantized matrices interleaved by 16 rows at load
(native/src/interleaved-rows.cpp), through the engine. The tiny fixture's stacks are 12 wide, too
narrow for that (its q8_0 and q4_k conversions keep most matrices f16), so this builds the same
random model with 256-wide stacks (the bench's builder: no torch) and checks at q8_0 and q4_k that
the engine interleaves them, that the talker's step-0 logits and the code predictor's first logits
match the ones ggml's own products give on the rows as stored, and that a batch gives each segment
the codes and audio it gets alone. test-ops checks the kernels themselves bit for bit."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import cosine, fixture_dir
from vocable import Engine, Voice

HIDDEN, FFN = 256, 512  # the fixture's 12 and 24, widened: rows and depths the kernels take


def widened(spec):
    """The fixture's random-model spec with the talker's, the code predictor's and the speaker
    embedding's width 12 -> HIDDEN and their feed-forward width 24 -> FFN."""
    width = {12: HIDDEN, 24: FFN}
    config = json.loads(json.dumps(spec.config))
    for stack in (config["talker_config"], config["talker_config"]["code_predictor_config"]):
        stack["hidden_size"], stack["intermediate_size"] = HIDDEN, FFN
    config["speaker_encoder_config"]["enc_dim"] = HIDDEN
    params = [(name, tuple(width.get(d, d) for d in shape)) for name, shape in spec.main_params]
    return dataclasses.replace(spec, name="tiny-0.6b-wide", config=config, main_params=params)


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """{weight type: GGUF path} of the widened model."""
    from vocable.bench.model import build_hf_folder, spec_from_folder
    from vocable.engine.convert import convert
    tmp = tmp_path_factory.mktemp("wide")
    build_hf_folder(widened(spec_from_folder(fixture_dir("0.6b") / "model")), tmp / "hf")
    return {wt: convert(tmp / "hf", tmp / f"{wt}.gguf", wt) for wt in ("f32", "q8_0", "q4_k")}


@pytest.fixture(scope="module")
def voice():
    return Voice(np.random.default_rng(3).standard_normal(HIDDEN).astype(np.float32))


def cpu_takes_interleaved() -> bool:
    """Whether the engine's x86 kernels run here (AVX2 or AVX512): those interleave."""
    from vocable import _engine
    return re.search(r"kernels: avx(2|512)\b", _engine.system_info()) is not None


TEXT = "Hello world, this is a test."

# The same synthesis in a process on ggml's most basic CPU variant, where nothing is interleaved
# and the matrices run ggml's own products.
PLAIN_RUN = """
import logging, sys
import numpy as np
from vocable import Engine, Voice
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
voice = Voice(np.random.default_rng(3).standard_normal({hidden}).astype(np.float32))
with Engine(sys.argv[1], threads=2, dump_dir=sys.argv[2]) as engine:
    engine.synthesize({text!r}, voice, greedy=True, max_frames=2).result()
"""


def step0_logits(dump):
    return np.load(dump / "talker_step0_logits.npy"), np.load(dump / "cp_step0_logits.npy")[0]


def run_on_variant(variant, model, dump):
    """PLAIN_RUN in a process of its own on ggml's CPU variant `variant`; its log."""
    env = dict(os.environ, VOCABLE_CPU_VARIANT=variant)
    proc = subprocess.run([sys.executable, "-c", PLAIN_RUN.format(hidden=HIDDEN, text=TEXT), str(model), str(dump)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


@pytest.mark.parametrize("weight_type", ["q8_0", "q4_k"])
def test_the_interleaved_products_match_ggml_s(wide, voice, tmp_path, caplog, weight_type):
    """In this process the engine interleaves the stacks' matrices (where the CPU has AVX2); on the
    x64 variant, in a process of its own, it runs ggml's products on the rows as stored. The two
    give the same logits but for the order of float sums; both sit as far from the f32 model's as
    the quantization puts them."""
    with caplog.at_level("INFO", logger="vocable.engine"):
        with Engine(wide[weight_type], threads=2, dump_dir=tmp_path / "interleaved") as engine:
            engine.synthesize(TEXT, voice, greedy=True, max_frames=2).result()
    counts = [tuple(map(int, m.groups())) for r in caplog.records
              if (m := re.search(r"interleaved by 16 rows: (\d+) q4_K and (\d+) q8_0 matrices", r.getMessage()))]
    assert "interleaved by 16 rows" not in run_on_variant("x64", wide[weight_type], tmp_path / "plain")
    with Engine(wide["f32"], threads=2, dump_dir=tmp_path / "f32") as engine:
        engine.synthesize(TEXT, voice, greedy=True, max_frames=2).result()
    (talker_i, cp_i), (talker_p, cp_p), (talker_f, cp_f) = (
        step0_logits(tmp_path / d) for d in ("interleaved", "plain", "f32"))
    print(f"{weight_type}: {counts}; against ggml's products: talker step-0 logits cosine "
          f"{cosine(talker_i, talker_p):.8f}, code predictor row 0 {cosine(cp_i, cp_p):.8f}; against f32: "
          f"{cosine(talker_i, talker_f):.5f} and {cosine(cp_i, cp_f):.5f} (ggml's: {cosine(talker_p, talker_f):.5f})")
    if cpu_takes_interleaved():
        # the talker's and the code predictor's: every layer matrix and the heads that fit 16 rows
        assert len(counts) == 2 and all(sum(c) > 0 for c in counts), counts
        if weight_type == "q4_k":
            assert all(c[0] > 0 for c in counts), counts
    assert cosine(talker_i, talker_p) >= 0.99999 and cosine(cp_i, cp_p) >= 0.99999
    assert abs(cosine(talker_i, talker_f) - cosine(talker_p, talker_f)) < 1e-4


@pytest.mark.parametrize("variant", ["haswell", "alderlake"])
@pytest.mark.parametrize("weight_type", ["q8_0", "q4_k"])
def test_the_256_bit_kernels_match_ggml_s(wide, tmp_path, weight_type, variant):
    """The kernels' 256-bit forms through the engine: ggml's haswell variant runs the AVX2 one and
    its alderlake variant the AVX-VNNI one (where the processor runs that variant), each against
    ggml's products on the x64 variant, as above."""
    from test_cpu_variants import variants
    if variant not in variants()[0]:
        pytest.skip(f"this processor does not run ggml's {variant} variant")
    log = run_on_variant(variant, wide[weight_type], tmp_path / "interleaved")
    assert "interleaved by 16 rows" in log
    run_on_variant("x64", wide[weight_type], tmp_path / "plain")
    (talker_i, cp_i), (talker_p, cp_p) = (step0_logits(tmp_path / d) for d in ("interleaved", "plain"))
    print(f"{weight_type} on {variant}: talker step-0 logits cosine {cosine(talker_i, talker_p):.8f}, "
          f"code predictor row 0 {cosine(cp_i, cp_p):.8f}")
    assert cosine(talker_i, talker_p) >= 0.99999 and cosine(cp_i, cp_p) >= 0.99999


@pytest.mark.parametrize("weight_type", ["q8_0", "q4_k"])
def test_a_batch_gives_each_segment_what_it_gets_alone(wide, voice, weight_type):
    """Sampled segments side by side, on interleaved matrices: the codes and audio of one by one.
    A gross error in the batched products shows here; a low bit rarely flips a sampled code, so
    the bits themselves are test-ops' to check (alone against batched, for every kernel)."""
    text = "The first sentence is here. A second one follows it. And a third ends the text."
    kwargs = dict(seed=7, max_frames=9, max_segment_units=32)
    with Engine(wide[weight_type], threads=2) as engine:
        alone = engine.synthesize(text, voice, **kwargs).result()
        batched = engine.synthesize(text, voice, batch=3, **kwargs).result()
    assert len(alone.segments) == 3
    np.testing.assert_array_equal(batched.codes, alone.codes)
    np.testing.assert_array_equal(batched.audio, alone.audio)


# A synthesis on a device: the CPU's copy of the matrices stays untouched, nothing interleaved.
ON_DEVICE = """
import json, logging, sys
import numpy as np
from vocable import Engine, Voice
messages = []
handler = logging.Handler()
handler.emit = lambda record: messages.append(record.getMessage())
logging.getLogger("vocable.engine").addHandler(handler)
logging.getLogger("vocable.engine").setLevel(logging.INFO)
voice = Voice(np.random.default_rng(3).standard_normal({hidden}).astype(np.float32))
with Engine(sys.argv[1], threads=2, device="vulkan:0") as engine:
    result = engine.synthesize({text!r}, voice, greedy=True, max_frames=2).result()
    print(json.dumps({{"device": engine.device, "frames": int(result.codes.shape[0]),
                      "interleaved": [m for m in messages if "interleaved by 16 rows" in m]}}))
"""


def test_a_device_leaves_the_cpu_copy_alone(wide):
    """The engine keeps a CPU copy of the weights for a device that fails; on a GPU it should
    cost no memory, so its matrices are interleaved only when the CPU first needs them."""
    from test_devices import needs_lavapipe, needs_vulkan_module
    needs_vulkan_module()
    needs_lavapipe(computing=True)
    proc = subprocess.run([sys.executable, "-c", ON_DEVICE.format(hidden=HIDDEN, text=TEXT), str(wide["q8_0"])],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "GGML_VK_VISIBLE_DEVICES": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"device": "vulkan:0", "frames": 2, "interleaved": []}, out
