"""The devices the engine finds (native/src/backend-loader.cpp, qt_device_count/qt_get_device/
qt_device_notes): the CPU always, first; the devices of ggml's Vulkan backend where the engine
was built with it and a Vulkan driver is installed (CI: Mesa's software driver, lavapipe, which
ggml lists only when GGML_VK_VISIBLE_DEVICES selects it); and where the Vulkan loader cannot be
loaded, a note that says why and the CPU as before. Each check runs in a process of its own:
the backends load once per process, after the environment is read. The engine's checks against
the CPU also run on the device VOCABLE_TEST_DEVICE names (a real GPU: tools/device-check.sh)."""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import vocable._engine as _engine
from conftest import fixture_dir, manifest

VULKAN_MODULE = Path(_engine.__file__).parent / "lib" / "libggml-vulkan.so"
LAVAPIPE = {"GGML_VK_VISIBLE_DEVICES": "0"}  # ggml lists lavapipe only where this selects it
LIST_DEVICES = ("import json; from vocable import _engine; "
                "print(json.dumps({'devices': _engine.devices(), 'notes': _engine.device_notes()}))")


def found(env: dict[str, str] | None = None) -> dict:
    proc = subprocess.run([sys.executable, "-c", LIST_DEVICES], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def needs_vulkan_module():
    if not VULKAN_MODULE.is_file():
        pytest.skip(f"the engine was built without ggml's Vulkan backend (no {VULKAN_MODULE.name}: "
                    "VOCABLE_VULKAN needs glslc, libvulkan-dev and spirv-headers)")


def needs_lavapipe(computing: bool = False):
    """Skips without Mesa's software Vulkan driver; `computing`: also where it is Mesa < 25, whose
    lavapipe frees buffers its queue thread still uses (a heap corruption in about half the runs
    that free a state's buffers, measured with 22.3.6; tools/system-packages.sh test installs 25
    from bookworm-backports)."""
    if not glob.glob("/usr/share/vulkan/icd.d/lvp_icd*.json"):
        pytest.skip("Mesa's software Vulkan driver is not installed (mesa-vulkan-drivers)")
    if computing and shutil.which("dpkg-query"):
        version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "mesa-vulkan-drivers"],
                                 capture_output=True, text=True).stdout
        major = version.split(":")[-1].split(".")[0]
        if major.isdigit() and int(major) < 25:
            pytest.skip(f"Mesa {version}'s lavapipe frees buffers its queue thread still uses (heap corruption); "
                        "the device tests need Mesa >= 25: tools/system-packages.sh test installs it")


def test_the_cpu_is_always_there_and_first():
    devices = _engine.devices()
    cpu = devices[0]
    assert cpu["id"] == "cpu" and cpu["kind"] == "cpu" and cpu["description"]
    assert cpu["memory_total"] > 0 and 0 < cpu["memory_free"] <= cpu["memory_total"]
    assert [d["id"] for d in devices].count("cpu") == 1
    assert all(d["id"].split(":")[0] in ("vulkan", "cuda", "metal") for d in devices[1:])


def test_lavapipe_is_found_through_the_vulkan_backend():
    needs_vulkan_module()
    needs_lavapipe()
    out = found(LAVAPIPE)
    vulkan = [d for d in out["devices"] if d["id"].startswith("vulkan:")]
    assert out["devices"][0]["id"] == "cpu"
    assert vulkan and vulkan[0]["id"] == "vulkan:0", out
    assert "llvmpipe" in " ".join(d["description"] for d in vulkan) and vulkan[0]["memory_total"] > 0, out


def test_a_machine_without_a_vulkan_loader_gets_the_cpu_and_the_reason(tmp_path):
    """An unloadable libvulkan.so.1 first on the library path stands in for a machine without one."""
    needs_vulkan_module()
    (tmp_path / "libvulkan.so.1").write_bytes(b"")
    library_path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("LD_LIBRARY_PATH")]))
    out = found({"LD_LIBRARY_PATH": library_path, **LAVAPIPE})
    assert [d["id"] for d in out["devices"]] == ["cpu"], out
    assert "libggml-vulkan.so: " in out["notes"] and "libvulkan.so.1" in out["notes"], out


def device_under_test(which: str) -> tuple[str, dict[str, str]]:
    """The device and environment of the engine's checks against the CPU: `lavapipe` (Mesa's
    software driver, in CI), or `named`, the device VOCABLE_TEST_DEVICE names (cuda:0 on a lent
    GPU: tools/device-check.sh). Skips, with the reason, where that one is not there."""
    if which == "lavapipe":
        needs_vulkan_module()
        needs_lavapipe(computing=True)
        return "vulkan:0", LAVAPIPE
    device = os.environ.get("VOCABLE_TEST_DEVICE", "")
    if not device:
        pytest.skip("no device named: VOCABLE_TEST_DEVICE=cuda:0 (or vulkan:0) runs these on a GPU")
    return device, {}


# The whole engine with the talker, the code predictor and the codec decoder on the device, against
# the CPU, over the fixture's 19 reference frames: the codes, the streamed audio against the codes
# decoded at once (x-vector: no reference codes prime the decoder), and the audio of both engines.
SYNTHESIZE_ON = r"""
import json, sys
import numpy as np
from vocable import Engine, Voice
model, device, ref_dir, ref_text, text, frames = sys.argv[1:7]
embedding, codes = np.load(ref_dir + "/speaker_embedding.npy"), np.load(ref_dir + "/ref_codes.npy")
out, runs_by_mode = {}, {}
with Engine(model, threads=2) as cpu, Engine(model, threads=2, device=device) as dev:
    out["device"], out["fallback"] = dev.device, dev.device_fallback
    for mode, voice in (("x-vector", Voice(embedding)), ("in-context", Voice(embedding, codes, ref_text))):
        runs = {}
        for name, engine in (("cpu", cpu), ("device", dev)):
            with engine.synthesize(text, voice, "english", greedy=True, max_frames=int(frames)) as stream:
                streamed = np.concatenate([np.asarray(c) for c in stream])
                result = stream.result()
            runs[name] = (np.asarray(result.codes), streamed, np.asarray(result.audio), result.mode)
        c, d = runs["cpu"], runs["device"]
        runs_by_mode[mode] = (d[0], d[2])
        same = [bool(np.array_equal(x, y)) for x, y in zip(c[0], d[0])]
        whole = dev.decode(d[0])
        cos = lambda a, b: float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b))) if a.size == b.size else 0.0
        residual_db = lambda a, b: (float(20 * np.log10(np.linalg.norm(b) / max(np.linalg.norm(a - b), 1e-30)))
                                    if a.size == b.size else 0.0)
        out[mode] = {"mode": d[3], "frames": [int(c[0].shape[0]), int(d[0].shape[0])], "frames_identical": same,
                     "first_different": same.index(False) if False in same else None,
                     "stream_is_result": bool(np.array_equal(d[1], d[2])),
                     "stream_vs_decode_db": residual_db(d[1], whole), "audio_cosine": cos(c[2], d[2])}
    again = {}
    for mode, voice in (("x-vector", Voice(embedding)), ("in-context", Voice(embedding, codes, ref_text))):
        with dev.synthesize(text, voice, "english", greedy=True, max_frames=int(frames)) as stream:
            result = stream.result()
            again[mode] = (np.asarray(result.codes), np.asarray(result.audio))
    # in-context, the repeat starts from the device decoder's primed state kept from the first run
    out["repeat_identical"] = all(np.array_equal(again[m][i], runs_by_mode[m][i]) for m in again for i in (0, 1))
print(json.dumps(out))
"""


@pytest.mark.parametrize("which", ["lavapipe", "named"])
def test_the_engine_on_a_device_gives_the_cpus_codes(converted, which):
    """Both clone modes: every frame's greedy codes identical to the CPU's and the audio (decoded
    on the device too) at cosine >= 0.999 of it, the streamed chunks equal to the result, and
    the codes decoded at once (in other chunks) within 80 dB of the stream, the CPU's bar. Each
    mode runs twice on the device, with the same codes and audio: a request's states are made and
    freed per request, and in-context the second starts from the primed decoder state kept."""
    device, env = device_under_test(which)
    m = manifest("0.6b")
    frames = m["generation"]["xvec"]["frames"]
    proc = subprocess.run([sys.executable, "-c", SYNTHESIZE_ON, str(converted("0.6b", "f32")), device,
                           str(fixture_dir("0.6b") / "reference"), m["ref_text"], m["text"], str(frames)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    print(json.dumps(out))
    assert out["device"] == device and out["fallback"] == "", out
    icl, xvec = out["in-context"], out["x-vector"]
    assert icl["mode"] == "in-context" and icl["frames"] == [frames, frames], icl
    assert all(icl["frames_identical"]) and icl["audio_cosine"] >= 0.999 and icl["stream_is_result"], icl
    assert xvec["mode"] == "x-vector" and xvec["frames"] == [frames, frames], xvec
    assert all(xvec["frames_identical"]) and xvec["audio_cosine"] >= 0.999 and xvec["stream_is_result"], xvec
    assert xvec["stream_vs_decode_db"] >= 80.0, xvec   # the CPU's bar for streaming
    assert out["repeat_identical"], out


# A voice made from the fixture's reference clip on an engine with the device and on one without:
# the speaker embedding (computed on the device, the log says where) and the reference codes (the
# codec encoder stays on the CPU).
EMBED_ON = r"""
import json, logging, sys
import numpy as np
import soundfile as sf
from vocable import Engine
model, device, clip = sys.argv[1:4]
lines = []
handler = logging.Handler()
handler.emit = lambda record: lines.append(record.getMessage())
logging.getLogger().addHandler(handler)
logging.getLogger().setLevel(logging.INFO)
samples, rate = sf.read(clip, dtype="float32")
with Engine(model, threads=2) as cpu, Engine(model, threads=2, device=device) as dev:
    vc, vd = cpu.embed_voice(samples, rate), dev.embed_voice(samples, rate)
a, b = vc.speaker_embedding, vd.speaker_embedding
print(json.dumps({"cosine": float(a @ b / ((a @ a) ** 0.5 * (b @ b) ** 0.5)),
                  "codes_identical": bool(np.array_equal(vc.codes, vd.codes)),
                  "where": [line for line in lines if "speaker embedding:" in line]}))
"""


@pytest.mark.parametrize("which", ["lavapipe", "named"])
def test_a_voice_is_embedded_on_a_device_as_on_the_cpu(converted, which):
    device, env = device_under_test(which)
    proc = subprocess.run([sys.executable, "-c", EMBED_ON, str(converted("0.6b", "f32")), device,
                           str(fixture_dir("0.6b") / "reference" / "ref_24k.wav")],
                          capture_output=True, text=True, timeout=600, env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    print(json.dumps(out))
    assert out["cosine"] >= 0.999 and out["codes_identical"], out
    assert len(out["where"]) == 2 and out["where"][0].endswith("speaker embedding on cpu)"), out
    assert out["where"][1].endswith(f"speaker embedding on {device})"), out


# A device's memory made small: ggml-vulkan refuses any buffer over GGML_VK_FORCE_MAX_BUFFER_SIZE,
# and GGML_VK_SUBALLOCATION_BLOCK_SIZE keeps the weights in buffers under it, so the weights load
# but a request's KV cache (128 bytes a position per tensor here) does not fit past 1562 positions.
OUT_OF_MEMORY = r"""
import json, sys
import numpy as np
from vocable import Engine, Voice
model, ref_dir, text, frames = sys.argv[1:5]
voice = Voice(np.load(ref_dir + "/speaker_embedding.npy"))
out = {}
with Engine(model, threads=2) as cpu, Engine(model, threads=2, device="vulkan:0") as dev:
    out["loaded_on"] = dev.device
    runs = {}
    for name, engine in (("cpu", cpu), ("device", dev)):
        with engine.synthesize(text, voice, "english", greedy=True, max_frames=int(frames)) as stream:
            streamed = np.concatenate([np.asarray(c) for c in stream])
            result = stream.result()
        runs[name] = (np.asarray(result.codes), np.asarray(result.audio), streamed)
    out["device"], out["fallback"] = dev.device, dev.device_fallback
    out["frames"] = int(runs["device"][0].shape[0])
    out["codes_identical"] = bool(np.array_equal(runs["cpu"][0], runs["device"][0]))
    out["audio_identical"] = bool(np.array_equal(runs["cpu"][1], runs["device"][1]))
    out["stream_is_result"] = bool(np.array_equal(runs["device"][2], runs["device"][1]))
print(json.dumps(out))
"""


def test_a_device_out_of_memory_hands_the_request_to_the_cpu(converted):
    """The request that did not fit runs again on the CPU, with the CPU's output, and the engine
    stays there and says why."""
    needs_vulkan_module()
    needs_lavapipe(computing=True)
    m = manifest("0.6b")
    proc = subprocess.run([sys.executable, "-c", OUT_OF_MEMORY, str(converted("0.6b", "f32")),
                           str(fixture_dir("0.6b") / "reference"), m["text"], "1700"],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, **LAVAPIPE, "GGML_VK_FORCE_MAX_BUFFER_SIZE": "200000",
                               "GGML_VK_SUBALLOCATION_BLOCK_SIZE": "200000"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["loaded_on"] == "vulkan:0", out
    assert out["device"] == "cpu", out
    assert out["fallback"].startswith("vulkan:0: out of memory (cannot allocate a KV cache of"), out
    assert out["frames"] == 1700 and out["codes_identical"] and out["audio_identical"], out
    assert out["stream_is_result"], out
    assert "running on the CPU from now on" in proc.stderr, proc.stderr[-3000:]
    # the decoder's buffers did not fit at load either: it stayed on the CPU from the start
    assert "vulkan:0: the codec decoder stays on the CPU (not enough memory" in proc.stderr, proc.stderr[-3000:]


def test_a_clip_too_long_for_the_device_is_embedded_on_the_cpu(converted):
    """The speaker encoder's graph for the 10 s reference does not fit the small device: that
    embedding runs on the CPU, with the CPU's result, and the engine keeps its device."""
    needs_vulkan_module()
    needs_lavapipe(computing=True)
    script = ("import json, sys\nimport soundfile as sf\nfrom vocable import Engine\n"
              "samples, rate = sf.read(sys.argv[2], dtype='float32')\n"
              "with Engine(sys.argv[1], threads=2) as cpu, Engine(sys.argv[1], threads=2, device='vulkan:0') as dev:\n"
              "    a, b = cpu.embed_voice(samples, rate), dev.embed_voice(samples, rate)\n"
              "    print(json.dumps([dev.device, a.speaker_embedding.tolist() == b.speaker_embedding.tolist(),"
              " a.codes.tolist() == b.codes.tolist()]))")
    proc = subprocess.run([sys.executable, "-c", script, str(converted("0.6b", "f32")),
                           str(fixture_dir("0.6b") / "reference" / "ref_24k.wav")],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **LAVAPIPE, "GGML_VK_FORCE_MAX_BUFFER_SIZE": "200000",
                               "GGML_VK_SUBALLOCATION_BLOCK_SIZE": "200000"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == ["vulkan:0", True, True], proc.stdout
    assert "vulkan:0: the speaker embedding runs on the CPU (not enough memory" in proc.stderr, proc.stderr[-3000:]
    assert "from now on" not in proc.stderr, proc.stderr[-3000:]


def test_a_device_without_room_for_the_weights_leaves_the_engine_on_the_cpu(converted):
    needs_vulkan_module()
    needs_lavapipe(computing=True)
    script = ("import json, sys; from vocable import Engine\n"
              "with Engine(sys.argv[1], threads=1, device='vulkan:0') as e: print(json.dumps([e.device, e.device_fallback]))")
    proc = subprocess.run([sys.executable, "-c", script, str(converted("0.6b", "f32"))],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **LAVAPIPE, "GGML_VK_FORCE_MAX_BUFFER_SIZE": "2000000"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    device, fallback = json.loads(proc.stdout.strip().splitlines()[-1])
    assert device == "cpu", fallback
    assert fallback.startswith("vulkan:0 (") and "failed to start: not enough memory for the weights" in fallback, fallback


def test_a_device_that_is_not_there_leaves_the_engine_on_the_cpu(converted, caplog):
    from vocable import Engine
    from vocable.errors import ModelError
    with caplog.at_level("WARNING", logger="vocable.engine"):
        with Engine(converted("0.6b", "f32"), threads=1, device="vulkan:7") as engine:
            assert engine.device == "cpu" and "no device vulkan:7 (devices: cpu" in engine.device_fallback
    assert any("no device vulkan:7" in r.getMessage() and "running on the CPU" in r.getMessage()
               for r in caplog.records)
    with Engine(converted("0.6b", "f32"), threads=1, device="auto") as engine:
        assert engine.device in {d["id"] for d in _engine.devices()}
    with pytest.raises(ModelError, match="device 'gpu please': not cpu, auto or a device id"):
        Engine(converted("0.6b", "f32"), threads=1, device="gpu please")


def test_about_lists_the_devices():
    proc = subprocess.run([sys.executable, "-m", "vocable", "about"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("Devices found: "))
    assert line.startswith("Devices found: cpu (")


def test_the_bench_runs_on_a_device_and_says_what_its_figures_mean(converted, tmp_path):
    needs_vulkan_module()
    needs_lavapipe(computing=True)
    proc = subprocess.run([sys.executable, "-m", "vocable", "bench", "--model", str(converted("0.6b", "f32")),
                           "--device", "vulkan:0", "--no-reference", "--no-long-text", "--repeats", "1",
                           "--frames", "6", "--cache-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, **LAVAPIPE})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["device"]["in_use"] == "vulkan:0" and "llvmpipe" in report["device"]["description"], report["device"]
    assert "a software driver, so these figures show correctness, not a GPU's speed" in proc.stdout
    synthesis = report["vocable_extra"]["synthesis"]["as converted"]
    assert synthesis["frames"] == 6 and synthesis["samples"] == 6 * 1920, synthesis


def test_the_cli_runs_where_it_is_told_and_says_when_it_cannot(converted, tmp_path):
    clip = tmp_path / "ref.wav"
    import soundfile
    soundfile.write(clip, (0.1 * np.sin(np.arange(24000 * 2) * 0.05)).astype(np.float32), 24000)
    model = str(converted("0.6b", "f32"))
    say = [sys.executable, "-m", "vocable", "say", "--model", model, "--ref", str(clip), "--text", "Hello.",
           "--greedy", "--max-frames", "3"]
    quiet = subprocess.run(say + ["--out", str(tmp_path / "a.wav")], capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0 and "running on the CPU" not in quiet.stderr, quiet.stderr   # auto, no GPU: no news
    missing = subprocess.run(say + ["--out", str(tmp_path / "b.wav"), "--device", "vulkan:7"],
                             capture_output=True, text=True, timeout=300)
    assert missing.returncode == 0, missing.stderr
    assert "warning: running on the CPU: no device vulkan:7 (devices: cpu" in missing.stderr, missing.stderr
    bad = subprocess.run(say + ["--out", str(tmp_path / "c.wav"), "--device", "gpu please"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "device 'gpu please': not cpu, auto or a device id" in bad.stderr, bad.stderr
    assert not (tmp_path / "c.wav").exists()
