"""tools/bench/peers.py: its arguments, the reasons it gives for peers that cannot run, the
table and ratios from measured rows, its child processes (peak RSS, timeouts, failures),
qwentts.cpp's quantization policy, and a whole run on a small random model with no peer
installed (Vocable measured, every peer listed with its reason). The peers themselves are not
needed; the one test that uses them skips where they are not installed, and in CI."""
from __future__ import annotations

import importlib.util
import json
import os
import sys

import numpy as np
import pytest

from conftest import REPO, fixture_dir

SCRIPT = REPO / "tools" / "bench" / "peers.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_peers", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # dataclasses look their module up while the class is made
    spec.loader.exec_module(mod)
    return mod


peers = _load()
FRAME = peers.SAMPLES_PER_FRAME


@pytest.fixture
def no_peer_env(monkeypatch):
    for name in (peers.PEERS_PYTHON_ENV, peers.QWENTTS_CONVERT_ENV):
        monkeypatch.delenv(name, raising=False)


# ---- arguments ------------------------------------------------------------------------------

def test_defaults(no_peer_env):
    a = peers.parse_args([])
    assert (a.types, a.frames, a.threads, a.repeats) == (["f32", "q8_0", "q4_k"], 100, 2, 3)
    assert a.peers == ["qwentts.cpp", "vox", "pytorch"] and a.qwentts_convert is None and a.child is None


def test_types_in_table_order_and_convert_from_the_environment(no_peer_env, monkeypatch, tmp_path):
    monkeypatch.setenv(peers.QWENTTS_CONVERT_ENV, str(tmp_path / "clone" / "convert.py"))
    a = peers.parse_args(["--types", "Q4_K, q8_0", "--peers", "vox"])
    assert a.types == ["q8_0", "q4_k"] and a.peers == ["vox"]
    assert a.qwentts_convert == (tmp_path / "clone" / "convert.py").resolve()
    given = peers.parse_args(["--qwentts-convert", str(tmp_path / "other.py")])   # the option wins
    assert given.qwentts_convert == (tmp_path / "other.py").resolve()


@pytest.mark.parametrize("argv", [["--types", "f16"], ["--types", ","], ["--peers", "espeak"], ["--frames", "0"],
                                  ["--threads", "0"], ["--repeats", "0"]])
def test_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as e:
        peers.parse_args(argv)
    assert e.value.code == 2 and argv[0] in capsys.readouterr().err


# ---- peers that cannot run ------------------------------------------------------------------

def test_no_peers_python(no_peer_env, monkeypatch, tmp_path):
    missing = tmp_path / "venv" / "bin" / "python"
    python, why = peers.find_peers_python(str(missing))
    assert python is None and why.startswith("not installed:") and str(missing) in why
    assert "--peers-python" in why and peers.SETUP_HINT in why
    monkeypatch.setenv(peers.PEERS_PYTHON_ENV, str(missing))
    assert peers.PEERS_PYTHON_ENV in peers.find_peers_python(None)[1]
    monkeypatch.setenv(peers.PEERS_PYTHON_ENV, sys.executable)
    assert peers.find_peers_python(None) == (sys.executable, "")

    blocked = peers.peer_blockers(None, why, {}, None, None, "no Python with torch and qwen-tts")
    assert blocked["qwentts.cpp"] == blocked["vox"] == ("not installed", why.removeprefix("not installed: "))
    assert blocked["pytorch"] == ("not installed", "no Python with torch and qwen-tts")


def test_a_python_without_the_peers():
    """The probe, run for real in this venv: gguf is here, the peers are not."""
    versions = peers.probe_peers(sys.executable)
    if isinstance(versions.get("vox"), str) or isinstance(versions.get("qwentts_cpp_cpu"), str):
        pytest.skip("the peers are installed in this venv")
    assert isinstance(versions["gguf"], str)
    assert "No module named 'vox'" in versions["vox"]["error"]
    blocked = peers.peer_blockers(sys.executable, "", versions, None, sys.executable, "")
    assert blocked["vox"][0] == "not installed" and "vox-tts" in blocked["vox"][1]
    assert "No module named 'qwentts_cpp_cpu'" in blocked["qwentts.cpp"][1] and "pytorch" not in blocked


def test_qwentts_needs_its_converter_torch_and_gguf(tmp_path):
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    versions = {"qwentts_cpp_cpu": "0.4.2", "vox": "0.19.5", "gguf": "0.19.0"}
    convert = tmp_path / "qwentts.cpp" / "convert.py"

    def blocked(conv, ref="/ref/python", why_ref=""):
        return peers.peer_blockers(str(python), "", versions, conv, ref, why_ref).get("qwentts.cpp")

    status, why = blocked(None)
    assert status == "not run" and "git clone" in why and peers.QWENTTS_CONVERT_ENV in why
    status, why = blocked(convert)
    assert status == "not run" and f"{convert} does not exist" in why
    convert.parent.mkdir()
    convert.write_text("")
    status, why = blocked(convert, None, "no Python with torch and qwen-tts")
    assert status == "not run" and "torch" in why and why.endswith("no Python with torch and qwen-tts")
    status, why = blocked(convert)
    assert status == "not installed" and "convert-libs" in why
    (python.parent.parent / "convert-libs" / "gguf").mkdir(parents=True)
    assert blocked(convert) is None
    versions["gguf"] = {"error": "ModuleNotFoundError: No module named 'gguf'"}
    assert "No module named 'gguf'" in blocked(convert)[1]


# ---- rows, ratios and the table -------------------------------------------------------------

def measured(engine, wt, wall, first=250.0, rss=1000.0, frames=100):
    return peers.Row(engine, wt, peers.RECIPES[(engine, wt)], wall_ms=[wall * 0.9, wall, wall * 1.5],
                     first_audio_ms=[first] * 3, samples=[frames * FRAME] * 3, peak_rss_mib=rss)


def test_figures_of_a_row():
    r = measured("vocable", "q8_0", 9000.0, frames=100)
    assert r.frames == 100 and r.ms_per_frame == pytest.approx(90.0) and r.rtf == pytest.approx(9.0 / 8.0)
    short = measured("vox", "q8_0", 4500.0, frames=50)   # a peer that made fewer frames: per frame made
    assert short.frames == 50 and short.ms_per_frame == pytest.approx(90.0) and short.rtf == pytest.approx(1.125)
    assert peers.not_measured("vox", "q8_0", "not installed", "x").figures() == {
        "frames": None, "ms_per_frame": None, "rtf": None, "median_wall_ms": None, "median_first_audio_ms": None,
        "peak_rss_mib": None}


def test_ratios_and_missed_targets():
    rows = [measured("vocable", "q8_0", 8000.0, first=200.0, rss=1500.0),
            measured("qwentts.cpp", "q8_0", 16000.0, first=500.0, rss=3000.0),
            measured("vox", "q8_0", 6000.0, first=100.0, rss=1200.0, frames=80),
            peers.not_measured("pytorch", "q8_0", "not run", "fp32 only"),
            peers.not_measured("vocable", "q4_k", "failed", "exit status 1: boom"),
            measured("vox", "q4_k", 5000.0)]
    rat = peers.ratios(rows)
    assert rat[("vocable", "q8_0")] == {"rtf": 1.0, "first_audio": 1.0, "peak_rss": 1.0}
    assert rat[("qwentts.cpp", "q8_0")] == pytest.approx({"rtf": 2.0, "first_audio": 2.5, "peak_rss": 2.0})
    assert rat[("vox", "q8_0")]["rtf"] == pytest.approx((6000 / 80) / (8000 / 100))   # per frame made
    assert ("pytorch", "q8_0") not in rat and ("vox", "q4_k") not in rat   # nothing to compare with
    missed = peers.missed_targets(rows)
    assert missed[0].startswith("q8_0: vox (bf16 + q8) real-time factor 0.938")
    assert missed[1] == "q4_k: Vocable has no figure (failed: exit status 1: boom)" and len(missed) == 2
    assert peers.missed_targets(rows[:2]) == []


def test_table_lists_every_row():
    rows = [measured("vocable", "f32", 16000.0), measured("pytorch", "f32", 64000.0, first=64000.0, rss=6000.0),
            peers.not_measured("qwentts.cpp", "f32", "not run", peers.QWENTTS_CLONE_HINT),
            peers.not_measured("vox", "f32", "not installed", "no peers' Python at /x")]
    lines = peers.table_lines(rows)
    assert lines[0].split()[:2] == ["engine", "weights"] and lines[2] == "f32:"
    vocable = next(ln for ln in lines if ln.strip().startswith("Vocable"))
    torch = next(ln for ln in lines if "PyTorch" in ln)
    assert vocable.split()[2:] == ["100", "160.0", "2.000", "250", "1000", "1.00x", "1.00x", "1.00x"]
    assert torch.split()[-3:] == ["4.00x", "256.00x", "6.00x"]
    assert any("qwentts.cpp" in ln and "not run: qwentts.cpp's converter" in ln for ln in lines)
    assert any(ln.split()[:2] == ["vox", "f32"] and "not installed: no peers' Python at /x" in ln for ln in lines)
    # a row that did not run, with the longest engine name: the columns still line up
    rows = [measured("vocable", "q8_0", 8000.0), peers.not_measured("pytorch", "q8_0", "not run", "fp32 only"),
            measured("vox", "q8_0", 9000.0)]
    lines = peers.table_lines(rows)[3:]
    starts = {ln.index(r.weights, 2 + len(peers.LABELS[r.engine])) for ln, r in zip(lines, rows)}
    assert len(starts) == 1 and lines[1].endswith("not run: fp32 only")


# ---- child processes ------------------------------------------------------------------------

def test_child_peak_rss_is_its_own(tmp_path):
    """Even after this process has peaked higher (which a child's ru_maxrss would inherit)."""
    x = bytearray(400 << 20)
    x[::4096] = b"1" * len(x[::4096])
    del x
    script = tmp_path / "child.py"
    script.write_text("import sys\nx = bytearray(int(sys.argv[1]) << 20)\nx[::4096] = b'1' * len(x[::4096])\n"
                      "print('{\"ok\": %s}' % sys.argv[1])\nsys.exit(int(sys.argv[2]))\n")
    big = peers.run_child(peers.python_child(sys.executable, str(script), "200", "0"))
    small = peers.run_child(peers.python_child(sys.executable, str(script), "0", "0"))
    assert big.returncode == small.returncode == 0 and big.last_json() == {"ok": 200}
    assert small.peak_rss_mib < 100 < 200 < big.peak_rss_mib < 300
    assert peers.HWM_MARK not in big.stderr
    failed = peers.run_child(peers.python_child(sys.executable, str(script), "0", "3"))   # exits: still reported
    assert failed.returncode == 3 and failed.peak_rss_mib < 100 and failed.why() == "exit status 3: (nothing on stderr)"
    module = peers.run_child(peers.python_child(sys.executable, "-m", "json.tool", str(tmp_path / "no.json")))
    assert module.returncode == 2 and "No such file" in module.why() and module.peak_rss_mib < 100


def test_child_failure_and_timeout():
    res = peers.run_child([sys.executable, "-c", "import sys; print('one', file=sys.stderr); sys.exit('two')"])
    assert res.returncode == 1 and res.why() == "exit status 1: one | two"
    row = peers.row_from_child("vox", "q8_0", res)
    assert (row.status, row.reason, row.weights) == ("failed", "exit status 1: one | two", "bf16 + q8")
    slow = peers.run_child([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)
    assert slow.timed_out and slow.returncode != 0 and "ran past" in slow.why()
    garbled = peers.row_from_child("vox", "q8_0", peers.ChildResult(0, "not json\n", "", 10.0))
    assert garbled.status == "failed" and garbled.reason.startswith("unreadable result")
    silent = peers.row_from_child("vox", "q8_0", peers.ChildResult(0, json.dumps(
        {"runs": [{"wall_ms": 5.0, "first_audio_ms": None, "samples": 0}]}), "", 10.0))
    assert silent.status == "failed"


# ---- qwentts.cpp's quantization policy ------------------------------------------------------

@pytest.mark.parametrize("name, n_dims, variant, want", [
    ("talker.blk.0.attn_q.weight", 2, "Q4_K_M", "Q4_K"),
    ("talker.blk.0.ffn_down.weight", 2, "Q4_K_M", "Q4_K"),    # its bump rules look for HF names
    ("talker.text_embd.weight", 2, "Q4_K_M", "Q6_K"),
    ("code_pred.codec_embd.3.weight", 2, "Q8_0", "Q8_0"),
    ("tok_dec.pre_tfm.blk.2.attn_v.weight", 2, "Q8_0", "Q8_0"),
    ("tok_dec.dec.1.conv_t.weight", 3, "Q8_0", "Q8_0"),        # (rows of 7 taps then go F16)
    ("tok_dec.vq_first.0.codebook", 2, "Q4_K_M", None),
    ("tok_enc.vq_semantic.input_proj.weight", 2, "Q8_0", None),
    ("spk_enc.fc.weight", 2, "Q8_0", None),
    ("talker.output_norm.weight", 1, "Q8_0", None),
    ("model.layers.0.mlp.down_proj.weight", 2, "Q4_K_M", "Q6_K"),   # first layers
    ("model.layers.4.mlp.down_proj.weight", 2, "Q4_K_M", "Q4_K"),
    ("model.layers.6.self_attn.v_proj.weight", 2, "Q4_K_M", "Q6_K"),  # every third
    ("model.layers.25.mlp.down_proj.weight", 2, "Q4_K_M", "Q6_K"),  # last layers
    ("model.layers.6.self_attn.v_proj.weight", 2, "Q8_0", "Q8_0"),
])
def test_qwentts_quant_policy(name, n_dims, variant, want):
    assert peers.qwentts_quant_type(name, n_dims, 28, variant) == want


def _peers_python() -> str | None:
    python, _ = peers.find_peers_python(None)
    if python is None or os.environ.get("CI"):
        return None
    versions = peers.probe_peers(python)
    return python if all(isinstance(versions.get(m), str) for m in ("qwentts_cpp_cpu", "gguf")) else None


def test_requantize_with_the_wheels_ggml(tmp_path):
    """In the peers' venv (skipped where it is not installed, and in CI): an F32 GGUF in
    qwentts.cpp's naming to Q4_K_M and back, checked with gguf-py's own dequantizers."""
    python = _peers_python()
    if python is None:
        pytest.skip(f"the peers are not installed ({peers.SETUP_HINT}) or CI")
    import gguf

    rng = np.random.default_rng(0)
    tensors = {"talker.blk.0.attn_q.weight": rng.standard_normal((8, 512), dtype=np.float32),
               "talker.text_embd.weight": rng.standard_normal((4, 256), dtype=np.float32),
               "tok_dec.dec.0.conv.weight": rng.standard_normal((16, 8, 7), dtype=np.float32),
               "tok_dec.vq_first.0.codebook": rng.standard_normal((4, 256), dtype=np.float32),
               "talker.output_norm.weight": rng.standard_normal(512, dtype=np.float32)}
    src, dst = tmp_path / "in.gguf", tmp_path / "out.gguf"
    w = gguf.GGUFWriter(str(src), "qwen3-tts")
    w.add_uint32("qwen3-tts.talker.block_count", 28)
    for name, value in tensors.items():
        w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    res = peers.run_child([python, str(SCRIPT), "--child-quantize", str(src), str(dst), "Q4_K_M"])
    assert res.returncode == 0, res.why()
    r = gguf.GGUFReader(str(dst))
    assert r.fields["general.file_type"].contents() == "Q4_K_M"
    assert r.fields["qwen3-tts.talker.block_count"].contents() == 28
    T = gguf.GGMLQuantizationType
    got = {t.name: t for t in r.tensors}
    want = {"talker.blk.0.attn_q.weight": T.Q4_K, "talker.text_embd.weight": T.Q6_K, "tok_dec.dec.0.conv.weight": T.F16,
            "tok_dec.vq_first.0.codebook": T.F32, "talker.output_norm.weight": T.F32}
    assert {n: t.tensor_type for n, t in got.items()} == want
    for name, value in tensors.items():
        t = got[name]
        back = gguf.quants.dequantize(t.data, t.tensor_type).reshape(value.shape)
        tol = {T.Q4_K: 0.15, T.Q6_K: 0.04, T.F16: 1e-3, T.F32: 0.0}[t.tensor_type]
        assert np.sqrt(np.mean((back - value) ** 2)) <= tol * np.sqrt(np.mean(value ** 2)), name


# ---- a whole run, no peer installed ---------------------------------------------------------

def test_a_run_without_peers(tmp_path, monkeypatch, capsys):
    """Vocable measured on a small random model in its own process; every peer in the table with
    its reason; the JSON line with the same."""
    from vocable.bench import model as bench_model
    spec = bench_model.spec_from_folder(fixture_dir("0.6b") / "model", seed=3, name="tiny-random")
    hf = tmp_path / "tiny-random"
    bench_model.build_hf_folder(spec, hf)
    monkeypatch.delenv(peers.QWENTTS_CONVERT_ENV, raising=False)
    monkeypatch.setenv("VOCABLE_REFERENCE_PYTHON", str(tmp_path / "no-reference" / "python"))
    rc = peers.main(["--model", str(hf), "--cache-dir", str(tmp_path / "cache"), "--types", "q8_0,f32",
                     "--frames", "6", "--repeats", "2", "--threads", "1", "--ref-seconds", "2",
                     "--peers-python", str(tmp_path / "no-venv" / "python")])
    out = capsys.readouterr().out
    assert rc == 0
    rep = json.loads(out.strip().splitlines()[-1])
    rows = {(r["engine"], r["weight_type"]): r for r in rep["rows"]}
    assert list(rows) == [("vocable", "f32"), ("qwentts.cpp", "f32"), ("vox", "f32"), ("pytorch", "f32"),
                          ("vocable", "q8_0"), ("qwentts.cpp", "q8_0"), ("vox", "q8_0"), ("pytorch", "q8_0")]
    for wt in ("f32", "q8_0"):
        v = rows[("vocable", wt)]
        assert v["status"] == "ok" and v["frames"] == 6 and len(v["wall_ms"]) == len(v["first_audio_ms"]) == 2
        assert all(0 < first <= wall for first, wall in zip(v["first_audio_ms"], v["wall_ms"]))
        assert v["samples"] == [6 * FRAME] * 2 and v["peak_rss_mib"] > 20
        assert v["vs_vocable"] == {"rtf": 1.0, "first_audio": 1.0, "peak_rss": 1.0}
        assert v["info"]["forget_prompts"] is True   # each run computes its prefill, as the peers'
        for peer in ("qwentts.cpp", "vox"):
            assert rows[(peer, wt)]["status"] == "not installed" and "no peers' Python" in rows[(peer, wt)]["reason"]
    assert rows[("pytorch", "f32")]["status"] == "not installed"
    assert "does not exist" in rows[("pytorch", "f32")]["reason"]
    assert rows[("pytorch", "q8_0")]["status"] == "not run" and "fp32" in rows[("pytorch", "q8_0")]["reason"]
    assert rep["missed_targets"] == [] and rep["threads"] == 1 and rep["frames"] == 6
    assert "kernels:" in rep["vocable_backend"]
    table = out[:out.rindex("{")]
    assert table.count("not installed: no peers' Python at") == 4 and "Vocable" in table
    assert "MISSED" not in table and "no peer ran, nothing to compare" in table
