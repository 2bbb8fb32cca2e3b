"""The model store: describing GGUF files safely, adding converted models, importing (converting)
a Hugging Face folder with progress and cancel, and downloading (the offline path)."""
from __future__ import annotations

import os
import shutil
import socket
import struct
import threading
import time

import numpy as np
import pytest

from conftest import fixture_dir
from fake_hub import FakeHub
from vocable.engine.convert import ConversionCancelled
from vocable.errors import ModelError
from vocable.engine.gguf_header import read_gguf_header
from vocable.engine.models import ModelStore


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("VOCABLE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_describe_converted_models(converted):
    store = ModelStore()
    for variant, weight_type, name in (("0.6b", "f32", "0.6B"), ("0.6b", "q8_0", "0.6B"), ("1.7b", "f16", "1.7B")):
        path = converted(variant, weight_type)
        entry = store.describe(path)
        assert (entry.variant, entry.weight_type, entry.path) == (name, weight_type, path)
        assert entry.size_bytes == path.stat().st_size
        assert entry.name == f"Qwen3-TTS 12Hz {name} Base ({weight_type})"


def test_add_converted_and_list(home, converted):
    store = ModelStore()
    assert store.root == home / "data" / "models" and store.entries() == []
    src = converted("0.6b", "q8_0")
    entry = store.add_converted(src)
    assert entry.path.parent == store.root and entry.path.read_bytes() == src.read_bytes()
    again = store.add_converted(src)  # same name: a second copy beside it, nothing overwritten
    assert again.path != entry.path and again.path.stem == entry.path.stem + "-2"
    assert store.add_converted(entry.path) == entry  # already in the store: nothing copied
    assert sorted(e.path.name for e in ModelStore().entries()) == ["model-2.gguf", "model.gguf"]
    store.delete(again.path)
    assert [e.path for e in store.entries()] == [entry.path]
    with pytest.raises(ModelError, match="not in the models folder"):
        store.delete(src)


def _gguf_other_arch(path):
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("some llm")
    w.add_tensor("w", np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _bad_models(folder, converted):
    """(file, expected message) pairs."""
    good = converted("0.6b", "f32").read_bytes()
    files = []

    def put(name, data, message):
        (folder / name).write_bytes(data)
        files.append((folder / name, message))

    put("empty.gguf", b"", "not a GGUF model file")
    put("random.gguf", os.urandom(5000), "not a GGUF model file")
    put("text.gguf", b"GGUF" + b"not really" * 10, "GGUF version|not a GGUF")
    put("truncated.gguf", good[: len(good) // 2], "truncated")
    put("header-only.gguf", good[:3000], "truncated")
    put("counts.gguf", b"GGUF" + struct.pack("<IQQ", 3, 1 << 62, 1 << 62), "implausible counts")
    put("huge-string.gguf", b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1 << 40) + b"x" * 64,
        "oversized key|truncated")
    put("bad-type.gguf", b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 3) + b"key"
        + struct.pack("<I", 77) + b"\0" * 16, "unknown type 77")
    put("deep-array.gguf", b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 3) + b"key"
        + (struct.pack("<IIQ", 9, 9, 1 << 40) * 10), "truncated|unknown type")
    put("latin1-value.gguf", _gguf_kv(("general.description", 8, struct.pack("<Q", 4) + b"caf\xe9")), "not UTF-8")
    put("latin1-key.gguf", _gguf_kv(("gen\xe9ral.name", 8, struct.pack("<Q", 1) + b"x")), "not UTF-8")
    put("latin1-in-array.gguf", _gguf_kv(("general.tags", 9, struct.pack("<IQ", 8, 2) + struct.pack("<Q", 1) + b"a"
                                          + struct.pack("<Q", 1) + b"\xff")), "not UTF-8")
    for alignment in (0, 3, 1 << 20):
        put(f"alignment-{alignment}.gguf", _gguf_kv(("general.alignment", 4, struct.pack("<I", alignment))),
            "invalid alignment")
    put("alignment-text.gguf", _gguf_kv(("general.alignment", 8, struct.pack("<Q", 2) + b"32")), "invalid alignment")
    _gguf_other_arch(folder / "llama.gguf")
    files.append((folder / "llama.gguf", "for 'llama', not a Qwen3-TTS"))
    return files


def _gguf_kv(*entries: tuple[str, int, bytes]) -> bytes:
    """A GGUF with these (key, value type, encoded value) pairs, no tensors, padded to 64 bytes."""
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, len(entries))
    for key, vtype, value in entries:
        raw = key.encode("latin-1")
        data += struct.pack("<Q", len(raw)) + raw + struct.pack("<I", vtype) + value
    return data + b"\0" * 64


def test_damaged_and_foreign_files_are_refused(tmp_path, converted):
    store = ModelStore()
    for path, message in _bad_models(tmp_path, converted):
        with pytest.raises(ModelError, match=message):
            store.describe(path)
        with pytest.raises(ModelError, match=message):
            store.add_converted(path)
    with pytest.raises(ModelError, match="not found"):
        store.describe(tmp_path / "missing.gguf")
    with pytest.raises(ModelError, match="is a folder"):
        store.describe(fixture_dir("0.6b") / "model")
    assert list(store.root.iterdir()) == []


def test_listing_skips_unusable_files(converted, caplog):
    store = ModelStore()
    good = store.add_converted(converted("0.6b", "f32"))
    _bad_models(store.root, converted)
    assert [e.path for e in store.entries()] == [good.path]
    assert "skipping" in caplog.text


def test_header_values_of_the_wrong_kind_are_errors_not_crashes(tmp_path):
    """A kept value may be of any GGUF type: a file type that is an array once raised TypeError
    (unhashable list), and a kept array of millions of items would be built as a Python list."""
    path = tmp_path / "odd.gguf"
    path.write_bytes(_gguf_kv(("general.architecture", 8, struct.pack("<Q", 9) + b"qwen3-tts"),
                              ("qwen3-tts.model_type", 8, struct.pack("<Q", 4) + b"base"),
                              ("qwen3-tts.format_version", 4, struct.pack("<I", 2)),
                              ("general.file_type", 9, struct.pack("<IQ", 4, 2) + struct.pack("<II", 1, 2))))
    assert ModelStore().describe(path).weight_type.startswith("type [1, 2]")
    many = 1 << 21
    path.write_bytes(_gguf_kv(("qwen3-tts.talker.language_names", 9, struct.pack("<IQ", 0, many) + bytes(many))))
    with pytest.raises(ModelError, match="metadata array of 2097152 items"):
        read_gguf_header(path, {"qwen3-tts.talker.language_names"})
    assert read_gguf_header(path, set())["file_size"] == path.stat().st_size  # skipped, it is only bytes


def test_header_arrays_cannot_stall_the_model_list(tmp_path):
    """The model list reads every .gguf in the store on the GUI thread: arrays of arrays under a
    key it keeps, or millions of strings under one it skips (walked one by one), are refused at
    once instead of taking tens of seconds and hundreds of MB."""
    import time

    path = tmp_path / "nested.gguf"
    inner = struct.pack("<IQ", 0, 4) + bytes(4)
    path.write_bytes(_gguf_kv(("general.name", 9, struct.pack("<IQ", 9, 1000) + inner * 1000)))
    with pytest.raises(ModelError, match="metadata array of 1000 items of arrays"):
        read_gguf_header(path, {"general.name"})
    many = (1 << 21) + 1
    path.write_bytes(_gguf_kv(("tokenizer.ggml.junk", 9, struct.pack("<IQ", 8, many) + struct.pack("<Q", 0) * many)))
    started = time.monotonic()
    with pytest.raises(ModelError, match="more than 2097152 metadata array items"):
        ModelStore().describe(path)
    assert time.monotonic() - started < 2


def test_header_reader_reads_only_the_header(converted):
    meta = read_gguf_header(converted("0.6b", "q8_0"), {"general.architecture", "qwen3-tts.model_size"})
    assert meta["general.architecture"] == "qwen3-tts" and meta["qwen3-tts.model_size"] == "0b6"
    assert meta["data_end"] <= meta["file_size"] and meta["data_start"] % 32 == 0


def test_import_a_hugging_face_folder_with_progress():
    from vocable.engine import Engine

    store = ModelStore()
    calls = []
    entry = store.import_hf_folder(fixture_dir("0.6b") / "model", "q8_0", lambda f, m: calls.append((f, m)))
    assert entry.path.parent == store.root and entry.path.name == "Qwen3-TTS-12Hz-0.6B-Base-q8_0.gguf"
    assert (entry.variant, entry.weight_type) == ("0.6B", "q8_0")
    fractions = [f for f, _ in calls]
    assert fractions[0] == 0.0 and fractions[-1] == 1.0 and fractions == sorted(fractions) and len(calls) > 10
    assert any("converting talker." in m for _, m in calls)
    assert [e.path for e in store.entries()] == [entry.path]
    with Engine(entry.path) as engine:  # the engine accepts it
        assert engine.info["variant"] == "0.6B"
    second = store.import_hf_folder(fixture_dir("0.6b") / "model", "q8_0")
    assert second.path.name == "Qwen3-TTS-12Hz-0.6B-Base-q8_0-2.gguf"


def test_cancel_an_import_leaves_nothing():
    store = ModelStore()
    cancel = threading.Event()
    seen = []

    def progress(fraction, message):
        seen.append(fraction)
        if fraction > 0.3:
            cancel.set()

    with pytest.raises(ConversionCancelled):
        store.import_hf_folder(fixture_dir("1.7b") / "model", "f16", progress, cancel)
    assert max(seen) < 0.9
    assert list(store.root.iterdir()) == []
    cancel.set()
    with pytest.raises(ConversionCancelled):  # cancelled before it starts
        store.import_hf_folder(fixture_dir("0.6b") / "model", "f16", None, cancel)
    assert list(store.root.iterdir()) == []


def test_import_errors_are_clear(tmp_path):
    store = ModelStore()
    with pytest.raises(ModelError, match="unknown weight type 'q2'"):
        store.import_hf_folder(fixture_dir("0.6b") / "model", "q2")
    with pytest.raises(ModelError, match="is not a folder"):
        store.import_hf_folder(tmp_path / "nothing", "f16")
    with pytest.raises(ModelError, match="config.json is missing"):
        store.import_hf_folder(tmp_path, "f16")
    broken = tmp_path / "broken"
    shutil.copytree(fixture_dir("0.6b") / "model", broken)
    (broken / "model.safetensors").write_bytes((broken / "model.safetensors").read_bytes()[:5000])
    with pytest.raises(ModelError, match="truncated|model.safetensors"):
        store.import_hf_folder(broken, "f16")
    assert list(store.root.iterdir()) == []


@pytest.mark.parametrize("change", [
    lambda c: [], lambda c: {**c, "talker_config": "oops"}, lambda c: {**c, "talker_config": {}},
    lambda c: {**c, "talker_config": {**c["talker_config"], "hidden_size": "wide"}},
    lambda c: {**c, "talker_config": {**c["talker_config"], "codec_language_id": [1, 2]}},
])
def test_a_malformed_config_is_a_clear_error(tmp_path, change):
    import json

    folder = tmp_path / "model"
    shutil.copytree(fixture_dir("0.6b") / "model", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(change(config)))
    store = ModelStore()
    with pytest.raises(ModelError):
        store.import_hf_folder(folder, "f16")
    assert list(store.root.iterdir()) == []


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_download_offline_fails_fast_with_a_clear_message(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    store = ModelStore()
    start = time.monotonic()
    with pytest.raises(ModelError, match=r"cannot reach 127\.0\.0\.1: .*offline"):
        store.download("Qwen/Qwen3-TTS-12Hz-0.6B-Base", "q8_0")
    assert time.monotonic() - start < 5
    assert list(store.root.iterdir()) == []
    monkeypatch.setenv("HF_ENDPOINT", "http://no-such-host.invalid")
    with pytest.raises(ModelError, match="cannot reach no-such-host.invalid"):
        store.download()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match="HF_HUB_OFFLINE"):
        store.download()


@pytest.mark.parametrize("repo, weight_type, message", [
    ("not a repo", "q8_0", "not a Hugging Face model name"), ("../../etc", "q8_0", "not a Hugging Face"),
    ("Qwen/Qwen3-TTS-12Hz-0.6B-Base", "q3", "unknown weight type"),
])
def test_download_argument_errors(repo, weight_type, message):
    with pytest.raises(ModelError, match=message):
        ModelStore().download(repo, weight_type)


# ---- downloading from a hub on this machine (fake_hub.py) ---------------------------------------

@pytest.fixture
def hub(monkeypatch):
    hub = FakeHub(fixture_dir("0.6b") / "model", "Qwen/Qwen3-TTS-12Hz-0.6B-Base")
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    yield hub
    hub.close()


def test_download_converts_into_the_store(home, hub):
    store = ModelStore()
    calls = []
    entry = store.download("Qwen/Qwen3-TTS-12Hz-0.6B-Base", "q8_0", lambda f, m: calls.append((f, m)))
    assert entry.path.parent == store.root and (entry.variant, entry.weight_type) == ("0.6B", "q8_0")
    fractions = [f for f, _ in calls]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert any(m.startswith("downloading model.safetensors") for _, m in calls)
    assert any(m.startswith("converting ") for _, m in calls)
    downloaded = home / "data" / "downloads" / "Qwen--Qwen3-TTS-12Hz-0.6B-Base"
    source = fixture_dir("0.6b") / "model"
    assert (downloaded / "speech_tokenizer" / "model.safetensors").read_bytes() == \
        (source / "speech_tokenizer" / "model.safetensors").read_bytes()
    # a second download finds the files there and fetches nothing again
    before = len([r for r in hub.requests if r[0] == "GET" and "/resolve/" in r[1]])
    store.download("Qwen/Qwen3-TTS-12Hz-0.6B-Base", "f16", keep_download=False)
    assert len([r for r in hub.requests if r[0] == "GET" and "/resolve/" in r[1]]) == before
    assert not downloaded.exists()
    assert sorted(e.weight_type for e in store.entries()) == ["f16", "q8_0"]


def test_cancel_a_download_midway(home, hub):
    hub.delay = 0.02
    store = ModelStore()
    cancel = threading.Event()

    def progress(fraction, message):
        if message.startswith("downloading model.safetensors") and fraction > 0.05:
            cancel.set()

    start = time.monotonic()
    with pytest.raises(ConversionCancelled):
        store.download(progress=progress, cancel=cancel)
    assert time.monotonic() - start < 10
    fetched = [path for method, path in hub.requests if method == "GET" and "/resolve/" in path]
    assert fetched[-1].endswith("/model.safetensors")  # stopped there: nothing after it was asked for
    assert list(store.root.iterdir()) == []
    assert not (home / "data" / "downloads" / "Qwen--Qwen3-TTS-12Hz-0.6B-Base" / "model.safetensors").exists()
    hub.delay = 0.0
    entry = store.download()  # resumes and finishes
    assert entry.weight_type == "q8_0"


def test_a_missing_repository_is_a_clear_error(hub):
    with pytest.raises(ModelError, match="Qwen/Nothing-Here was not found on 127.0.0.1"):
        ModelStore().download("Qwen/Nothing-Here")


def test_a_full_disk_during_import_leaves_nothing(converted):
    from test_library import write_limit

    converted("0.6b", "f16")  # any conversion the fixtures need, before the limit
    store = ModelStore()
    with write_limit(1 << 20):
        with pytest.raises(ModelError, match="cannot write the converted model"):
            store.import_hf_folder(fixture_dir("0.6b") / "model", "f16")
        with pytest.raises(ModelError, match="cannot copy"):
            store.add_converted(converted("0.6b", "f16"))
    assert list(store.root.iterdir()) == []


def test_a_fifo_or_device_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    store = ModelStore()
    for path in (fifo, "/dev/zero"):
        with pytest.raises(ModelError, match="not a regular file"):
            store.describe(path)
    os.mkfifo(store.root / "fifo.gguf")
    assert store.entries() == []


def test_a_model_size_name_too_long_for_a_file_name_is_cut(tmp_path):
    """The file name comes from the folder's config: 300 characters of it raised a raw OSError
    (File name too long)."""
    import json
    import shutil

    src = tmp_path / "hf"
    shutil.copytree(fixture_dir("0.6b") / "model", src)
    config = json.loads((src / "config.json").read_text())
    config["tts_model_size"] = "x" * 300
    (src / "config.json").write_text(json.dumps(config))
    entry = ModelStore().import_hf_folder(src, "q8_0")
    assert entry.path.is_file() and len(entry.path.name.encode()) <= 255 and entry.path.suffix == ".gguf"
