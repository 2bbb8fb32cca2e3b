"""ggml's CPU backend variants (cmake/ggml.cmake, native/src/backend-loader.cpp): the engine loads
the best one this processor runs, VOCABLE_CPU_VARIANT forces another, and every variant this
processor can run synthesizes what the generic x86-64 one does. Each run is a fresh process: the
backend is loaded once per process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import cosine, fixture_dir
from vocable import _engine

SYNTHESIZE = textwrap.dedent("""
    import json, sys
    import numpy as np
    import soundfile as sf
    from vocable import Engine, _engine
    samples, rate = sf.read(sys.argv[2], dtype="float32")
    with Engine(sys.argv[1], threads=2) as engine:
        voice = engine.embed_voice(samples, rate)
        result = engine.synthesize("Hello there, how are you?", voice, "english", greedy=True, max_frames=12).result()
    np.save(sys.argv[3], result.audio)
    np.save(sys.argv[4], np.asarray(voice.speaker_embedding))
    print(json.dumps({"info": _engine.system_info(), "codes": result.codes.tolist()}))
""")


def variants() -> tuple[list[str], list[str]]:
    """(variants this processor runs, variants it does not), from the engine's own report."""
    listed = _engine.system_info().split("; variants: ", 1)[1].split(", ")
    return ([v for v in listed if not v.endswith("(not on this CPU)")],
            [v.split(" ")[0] for v in listed if v.endswith("(not on this CPU)")])


def run(variant: str | None, model, tmp_path):
    env = dict(os.environ)
    env.pop("VOCABLE_CPU_VARIANT", None)
    if variant:
        env["VOCABLE_CPU_VARIANT"] = variant
    audio, speaker = tmp_path / f"{variant}-audio.npy", tmp_path / f"{variant}-speaker.npy"
    proc = subprocess.run([sys.executable, "-c", SYNTHESIZE, str(model),
                           str(fixture_dir("0.6b") / "reference" / "ref_24k.wav"), str(audio), str(speaker)],
                          env=env, capture_output=True, text=True, timeout=300)
    return proc, audio, speaker


def test_the_best_variant_is_loaded_and_named():
    runnable, _ = variants()
    assert "x64" in runnable and len(runnable) >= 1
    info = _engine.system_info()
    assert info.split(" ", 1)[0] == runnable[0], info   # best first, and the one loaded
    if "avx2" in open("/proc/cpuinfo").read():
        assert "haswell" in runnable and " AVX2 " in f" {info} "


def test_every_runnable_variant_synthesizes_what_the_generic_one_does(converted, tmp_path):
    model = converted("0.6b", "f32")
    proc, audio, speaker = run("x64", model, tmp_path)
    assert proc.returncode == 0, proc.stderr
    generic = json.loads(proc.stdout)
    assert generic["info"].startswith("x64 ("), generic["info"]
    generic_audio, generic_speaker = np.load(audio), np.load(speaker)
    runnable, _ = variants()
    for variant in runnable:
        if variant == "x64":
            continue
        proc, audio, speaker = run(variant, model, tmp_path)
        assert proc.returncode == 0, (variant, proc.stderr)
        got = json.loads(proc.stdout)
        assert got["info"].startswith(f"{variant} ("), got["info"]
        assert cosine(np.load(speaker), generic_speaker) > 0.99999, variant
        codes = np.array(got["codes"])
        same = float(np.mean(codes == np.array(generic["codes"])))
        assert same >= 0.99, (variant, same)
        if same == 1.0:
            assert cosine(np.load(audio), generic_audio) > 0.9999, variant


def test_forcing_an_unknown_or_unsupported_variant_is_a_clear_error(converted, tmp_path):
    proc, _, _ = run("pentium3", converted("0.6b", "f32"), tmp_path)
    assert proc.returncode != 0
    assert "VOCABLE_CPU_VARIANT=pentium3: no such CPU variant (there are: " in proc.stderr
    assert "Traceback" in proc.stderr and "ModelError" in proc.stderr
    _, unsupported = variants()
    if not unsupported:
        pytest.skip("this processor runs every variant")
    proc, _, _ = run(unsupported[0], converted("0.6b", "f32"), tmp_path)
    assert f"VOCABLE_CPU_VARIANT={unsupported[0]}: this processor cannot run that variant" in proc.stderr
