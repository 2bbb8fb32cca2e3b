"""The voice library: saving, listing, renaming, deleting, exporting and importing voices, and
refusing damaged or hostile files."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import resource
import signal
import struct
from datetime import datetime, timezone

import numpy as np
import pytest
from safetensors.numpy import save_file

from vocable.errors import VoiceError
from vocable.library.voices import VoiceLibrary
from vocable.library.voice import MAX_FILE_BYTES, Voice, read_voice_file


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("VOCABLE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def make_voice(seed=0, codes=True, ref_text="Hello there.", dim=1024) -> Voice:
    rng = np.random.default_rng(seed)
    return Voice(rng.standard_normal(dim).astype(np.float32),
                 rng.integers(0, 2048, (40, 16), dtype=np.int32) if codes else None,
                 ref_text, "", "0.6B", 3.2)


def same_voice(a: Voice, b: Voice) -> bool:
    return (np.array_equal(a.speaker_embedding, b.speaker_embedding)
            and ((a.codes is None and b.codes is None) or np.array_equal(a.codes, b.codes))
            and a.ref_text == b.ref_text and a.model_variant == b.model_variant
            and a.reference_seconds == b.reference_seconds)


def test_save_list_load_and_restart(home):
    lib = VoiceLibrary()
    assert lib.root == home / "data" / "voices"
    assert lib.entries() == []
    before = datetime.now(timezone.utc).replace(microsecond=0)
    a = lib.save(make_voice(1), "  Zoë — grand-mère  ")
    b = lib.save(make_voice(2, codes=False, ref_text=None), "αβγ 日本語")
    c = lib.save(make_voice(3), "anna")
    assert a.name == "Zoë — grand-mère" and a.path.parent == lib.root and a.id == a.path.stem
    assert a.has_codes and a.ref_text == "Hello there." and a.seconds == pytest.approx(3.2)
    assert a.model_variant == "0.6B" and a.created >= before and a.created.tzinfo is not None
    assert not b.has_codes and b.ref_text is None
    assert [e.id for e in lib.entries()] == [c.id, a.id, b.id]  # by name, case-insensitive

    again = VoiceLibrary()  # a restart
    assert [(e.id, e.name, e.created) for e in again.entries()] == [(e.id, e.name, e.created) for e in lib.entries()]
    voice = again.load(a.id)
    assert same_voice(voice, make_voice(1)) and voice.name == "Zoë — grand-mère"
    assert same_voice(again.load(b.id), make_voice(2, codes=False, ref_text=None))
    # the files are plain voice files, readable by Voice.load too
    assert same_voice(Voice.load(a.path), make_voice(1))
    assert not [p for p in lib.root.iterdir() if p.suffix != ".safetensors"]


def test_same_names_are_separate_voices():
    lib = VoiceLibrary()
    a = lib.save(make_voice(1), "Me")
    b = lib.save(make_voice(2), "Me")
    assert a.id != b.id and len(lib.entries()) == 2


def test_rename_keeps_the_voice_and_its_date():
    lib = VoiceLibrary()
    entry = lib.save(make_voice(1), "old name")
    renamed = lib.rename(entry.id, "new name ✓")
    assert renamed.id == entry.id and renamed.name == "new name ✓" and renamed.created == entry.created
    assert same_voice(lib.load(entry.id), make_voice(1))
    assert [e.name for e in VoiceLibrary().entries()] == ["new name ✓"]


@pytest.mark.parametrize("name, message", [
    ("", "needs a name"), ("   ", "needs a name"), ("x" * 201, "at most 200"),
    ("bad\x00name", "control"), ("tab\tname", "control"), (None, "must be text"),
])
def test_bad_names_are_refused(name, message):
    lib = VoiceLibrary()
    with pytest.raises(VoiceError, match=message):
        lib.save(make_voice(), name)
    entry = lib.save(make_voice(), "fine")
    with pytest.raises(VoiceError, match=message):
        lib.rename(entry.id, name)
    assert [e.name for e in lib.entries()] == ["fine"]


def test_delete():
    lib = VoiceLibrary()
    a = lib.save(make_voice(1), "a")
    b = lib.save(make_voice(2), "b")
    lib.delete(a.id)
    assert [e.id for e in lib.entries()] == [b.id]
    with pytest.raises(VoiceError, match="no voice"):
        lib.delete(a.id)
    with pytest.raises(VoiceError, match="no voice"):
        lib.load(a.id)


@pytest.mark.parametrize("bad_id", ["../voices/x", "/etc/passwd", "", "a/b", ".hidden", "x" * 200, 5])
def test_ids_are_never_paths(bad_id):
    lib = VoiceLibrary()
    for call in (lib.load, lib.delete, lambda i: lib.rename(i, "n"), lambda i: lib.export(i, lib.root)):
        with pytest.raises(VoiceError, match="invalid voice id"):
            call(bad_id)


def test_export_and_import(tmp_path):
    lib = VoiceLibrary()
    entry = lib.save(make_voice(4), "Grand-père")
    out = lib.export(entry.id, tmp_path / "shared.safetensors")
    assert out == tmp_path / "shared.safetensors" and same_voice(Voice.load(out), make_voice(4))
    in_folder = lib.export(entry.id, tmp_path)
    assert in_folder == tmp_path / "grand-pere.safetensors"
    with pytest.raises(VoiceError, match="does not exist"):
        lib.export(entry.id, tmp_path / "missing" / "x.safetensors")
    with pytest.raises(VoiceError, match="ends in .safetensors"):
        lib.export(entry.id, tmp_path / "x.wav")

    other = VoiceLibrary(tmp_path / "other-library")
    imported = other.import_file(out)
    assert imported.name == "Grand-père" and imported.id != "shared"
    assert same_voice(other.load(imported.id), make_voice(4))
    renamed = other.import_file(out, name="Papi")
    assert renamed.name == "Papi" and len(other.entries()) == 2
    assert out.exists()  # the source is left alone


def test_import_a_file_written_by_voice_save(tmp_path):
    voice = make_voice(5)
    voice.name = ""
    path = voice.save(tmp_path / "my clone.safetensors")
    entry = VoiceLibrary().import_file(path)
    assert entry.name == "my clone" and entry.created.tzinfo is not None
    assert same_voice(VoiceLibrary().load(entry.id), voice)


# ---- untrusted files ----------------------------------------------------------------------------

def _meta(**over):
    meta = {"format": "vocable-voice", "version": "1", "name": "x", "ref_text": "", "has_ref_text": "false",
            "model_variant": "0.6B", "reference_seconds": "3.0"}
    meta.update(over)
    return {k: v for k, v in meta.items() if v is not None}


def _tensors(**over):
    t = {"speaker_embedding": np.ones(1024, np.float32), "codes": np.zeros((10, 16), np.int32)}
    t.update(over)
    return {k: v for k, v in t.items() if v is not None}


class Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/vocable-pwned",))


def _hostile_files(folder):
    """(file, expected message) pairs: each must be refused with that message."""
    files = []

    def st(name, message, tensors=None, meta=None):
        path = folder / name
        save_file(tensors if tensors is not None else _tensors(), str(path), metadata=meta if meta is not None else _meta())
        files.append((path, message))

    (folder / "pickle.safetensors").write_bytes(pickle.dumps(Evil()))
    files.append((folder / "pickle.safetensors", "not a Vocable voice file|not a safetensors"))
    (folder / "random.safetensors").write_bytes(os.urandom(4096))
    files.append((folder / "random.safetensors", "not a"))
    (folder / "empty.safetensors").write_bytes(b"")
    files.append((folder / "empty.safetensors", "only 0 bytes"))
    huge_header = struct.pack("<Q", 1 << 60) + b"{" + b" " * 100
    (folder / "header.safetensors").write_bytes(huge_header)
    files.append((folder / "header.safetensors", "not a safetensors file"))
    big = folder / "big.safetensors"
    with open(big, "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: no disk used
    files.append((big, "far smaller"))
    st("good-then-cut.safetensors", "not a readable voice file")
    cut = folder / "good-then-cut.safetensors"
    cut.write_bytes(cut.read_bytes()[:-100])
    st("other-format.safetensors", "no Vocable voice metadata", meta=_meta(format="pytorch"))
    st("no-metadata.safetensors", "no Vocable voice metadata", meta={})
    st("version-text.safetensors", "invalid voice format version", meta=_meta(version="1; rm -rf"))
    st("newer.safetensors", "newer Vocable", meta=_meta(version="99"))
    st("f64.safetensors", "expected F32", tensors=_tensors(speaker_embedding=np.ones(1024, np.float64)))
    st("matrix.safetensors", "expected F32 with 1", tensors=_tensors(speaker_embedding=np.ones((4, 4), np.float32)))
    st("extra.safetensors", "unexpected tensors", tensors=_tensors(payload=np.zeros(10, np.uint8)))
    st("no-embedding.safetensors", "no speaker embedding", tensors=_tensors(speaker_embedding=None))
    st("nan.safetensors", "NaN", tensors=_tensors(speaker_embedding=np.full(1024, np.nan, np.float32)))
    st("codes-range.safetensors", "out of range", tensors=_tensors(codes=np.full((4, 16), -5, np.int32)))
    st("codes-shape.safetensors", "reference codes of shape",
       tensors=_tensors(codes=np.zeros((5000, 16), np.int32)))
    st("seconds.safetensors", "invalid reference length", meta=_meta(reference_seconds="soon"))
    st("abc-seconds.safetensors", "invalid reference length", meta=_meta(reference_seconds="abc"))
    st("inf-seconds.safetensors", "invalid reference length", meta=_meta(reference_seconds="inf"))
    st("nan-seconds.safetensors", "invalid reference length", meta=_meta(reference_seconds="nan"))
    st("long-meta.safetensors", "oversized metadata", meta=_meta(junk="x" * 100_000))
    # codebook 0 has 2048 codes; 2048 to 3071 are the talker's control ids, which crashed the engine
    codes = np.zeros((10, 16), np.int32)
    codes[:, 0] = np.arange(2048, 2058)
    st("codebook-0.safetensors", "out of range", tensors=_tensors(codes=codes))
    st("codes-2048.safetensors", "out of range", tensors=_tensors(codes=np.full((3, 16), 2048, np.int32)))
    st("codebooks.safetensors", "reference codes of shape", tensors=_tensors(codes=np.zeros((10, 8), np.int32)))
    st("codes-i64.safetensors", "expected I32", tensors=_tensors(codes=np.zeros((10, 16), np.int64)))
    st("codes-1d.safetensors", "expected I32 with 2", tensors=_tensors(codes=np.zeros(16, np.int32)))
    st("embedding-f16.safetensors", "expected F32", tensors=_tensors(speaker_embedding=np.ones(1024, np.float16)))
    st("inf.safetensors", "NaN or infinite",
       tensors=_tensors(speaker_embedding=np.full(1024, np.inf, np.float32)))
    st("empty-embedding.safetensors", "non-empty vector",
       tensors=_tensors(speaker_embedding=np.zeros(0, np.float32)))
    st("version-superscript.safetensors", "invalid voice format version", meta=_meta(version="\u00b2"))
    st("version-huge.safetensors", "invalid voice format version", meta=_meta(version="9" * 5000))
    # headers written by hand: what no safetensors writer makes
    def raw(name, message, header: bytes, data: bytes = b"\0" * 64):
        (folder / name).write_bytes(struct.pack("<Q", len(header)) + header + data)
        files.append((folder / name, message))

    tensor = b'"speaker_embedding":{"dtype":"F32","shape":[16],"data_offsets":[0,64]}'
    raw("latin1-meta.safetensors", "not a readable voice file",
        b'{"__metadata__":{"format":"vocable-voice","version":"1","name":"Ren\xe9e"},' + tensor + b"}")
    raw("deep-header.safetensors", "not a readable voice file|no Vocable voice metadata",
        b'{"__metadata__":{"format":"vocable-voice","version":"1"},"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    raw("number-meta.safetensors", "not a readable voice file",
        b'{"__metadata__":{"format":"vocable-voice","version":1},' + tensor + b"}")
    raw("negative-shape.safetensors", "not a readable voice file",
        b'{"__metadata__":{"format":"vocable-voice","version":"1"},'
        b'"speaker_embedding":{"dtype":"F32","shape":[-16],"data_offsets":[0,64]}}')
    raw("overflow-shape.safetensors", "not a readable voice file",
        b'{"__metadata__":{"format":"vocable-voice","version":"1"},'
        b'"speaker_embedding":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,64]}}')
    raw("offsets-past-end.safetensors", "not a readable voice file",
        b'{"__metadata__":{"format":"vocable-voice","version":"1"},'
        b'"speaker_embedding":{"dtype":"F32","shape":[16],"data_offsets":[0,6400]}}')
    return files


def test_hostile_and_damaged_files_are_refused(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    for path, message in _hostile_files(bad):
        with pytest.raises(VoiceError, match=message):
            read_voice_file(path)
    assert not os.path.exists("/tmp/vocable-pwned")


def test_import_refuses_bad_files_and_adds_nothing(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    lib = VoiceLibrary()
    keep = lib.save(make_voice(), "keep")
    for path, message in _hostile_files(bad):
        with pytest.raises(VoiceError, match=message):
            lib.import_file(path)
    with pytest.raises(VoiceError, match="not found"):
        lib.import_file(tmp_path / "nothing.safetensors")
    with pytest.raises(VoiceError, match="not a file"):
        lib.import_file(tmp_path)
    assert [e.id for e in lib.entries()] == [keep.id]
    assert [p.name for p in lib.root.iterdir()] == [keep.path.name]


def test_listing_skips_bad_files_in_the_library_folder(caplog):
    lib = VoiceLibrary()
    keep = lib.save(make_voice(), "keep")
    _hostile_files(lib.root)
    (lib.root / "user copy (1).safetensors").write_bytes(keep.path.read_bytes())
    with caplog.at_level(logging.WARNING, logger="vocable.library"):
        assert [e.id for e in lib.entries()] == [keep.id]
    assert "skipping" in caplog.text and "not a name Vocable gives" in caplog.text
    assert same_voice(lib.load(keep.id), make_voice())


def test_a_changed_file_is_read_again():
    lib = VoiceLibrary()
    entry = lib.save(make_voice(), "first")
    assert [e.name for e in lib.entries()] == ["first"]
    VoiceLibrary().rename(entry.id, "second")  # another window, another instance
    assert [e.name for e in lib.entries()] == ["second"]
    entry.path.write_bytes(b"garbage")
    assert lib.entries() == []


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="needs file permissions that bind")
def test_a_read_only_library_gives_an_error_and_loses_nothing():
    lib = VoiceLibrary()
    entry = lib.save(make_voice(), "kept")
    lib.root.chmod(0o500)
    try:
        with pytest.raises(VoiceError, match="cannot write the voice file"):
            lib.save(make_voice(1), "new")
        with pytest.raises(VoiceError, match="cannot write the voice file"):
            lib.rename(entry.id, "renamed")
        with pytest.raises(VoiceError, match="cannot delete"):
            lib.delete(entry.id)
    finally:
        lib.root.chmod(0o700)
    assert [(e.id, e.name) for e in lib.entries()] == [(entry.id, "kept")]
    assert same_voice(lib.load(entry.id), make_voice())


def test_the_metadata_is_json_free_text():
    """Names and transcripts with quotes, newlines and JSON in them come back unchanged."""
    lib = VoiceLibrary()
    text = 'She said "hi"\nand {"left": [1]}'
    voice = make_voice(ref_text=text)
    entry = lib.save(voice, 'Name "quoted" {json}')
    assert lib.load(entry.id).ref_text == text and lib.entries()[0].name == 'Name "quoted" {json}'
    json.dumps([e.name for e in lib.entries()])


@contextlib.contextmanager
def write_limit(max_bytes: int):
    """Writes past `max_bytes` in any file fail with EFBIG (RLIMIT_FSIZE), like a full disk; works
    as root too, where read-only folders do not bind."""
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, old_limit[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)


def test_a_write_that_fails_midway_loses_nothing():
    lib = VoiceLibrary()
    entry = lib.save(make_voice(), "kept")
    before = entry.path.read_bytes()
    with write_limit(2000):
        with pytest.raises(VoiceError, match="cannot write the voice file"):
            lib.rename(entry.id, "renamed")
        with pytest.raises(VoiceError, match="cannot write the voice file"):
            lib.save(make_voice(1), "new")
    assert entry.path.read_bytes() == before
    assert [(e.id, e.name) for e in lib.entries()] == [(entry.id, "kept")]
    assert [p.name for p in lib.root.iterdir()] == [entry.path.name]


def test_a_fifo_or_device_is_refused_without_blocking(tmp_path):
    lib = VoiceLibrary()
    os.mkfifo(tmp_path / "voice.safetensors")
    os.mkfifo(lib.root / "fifo.safetensors")
    for path in (tmp_path / "voice.safetensors", "/dev/zero"):
        with pytest.raises(VoiceError, match="not a file"):
            lib.import_file(path)
    assert lib.entries() == []


def test_a_voice_averages_several_clips(engine, reference_clip, tmp_path):
    """Engine.add_clip averages another recording into the speaker embedding; the clip count is
    kept in the file and the library, and the in-context clip (codes, transcript) stays."""
    from vocable.library.voices import VoiceLibrary
    first = engine.embed_voice(reference_clip, 24000, ref_text="Okay. Yeah.")
    other = reference_clip[::-1].copy()
    both = engine.add_clip(first, other, 24000)
    three = engine.add_clip(both, reference_clip[: 24000 * 2], 24000)
    second = engine.embed_voice(other, 24000).speaker_embedding
    third = engine.embed_voice(reference_clip[: 24000 * 2], 24000).speaker_embedding
    assert both.clips == 2 and three.clips == 3
    assert np.allclose(three.speaker_embedding, (first.speaker_embedding + second + third) / 3, atol=1e-5)
    assert np.array_equal(three.codes, first.codes) and three.ref_text == first.ref_text
    library = VoiceLibrary(tmp_path)
    entry = library.save(first, "Ivy")
    assert entry.clips == 1
    entry = library.replace(entry.id, three)
    assert (entry.clips, entry.name) == (3, "Ivy")
    assert library.load(entry.id).clips == 3


def test_a_voice_file_with_a_bad_clip_count_is_refused(tmp_path):
    from safetensors.numpy import save_file
    from vocable.errors import VoiceError
    from vocable.library.voice import Voice
    good = tmp_path / "v.safetensors"
    Voice(np.ones(8, np.float32), name="x").save(good)
    for clips in ("0", "-1", "abc", "1000", ""):
        bad = tmp_path / f"bad{clips}.safetensors"
        from safetensors import safe_open
        with safe_open(good, "np") as f:
            meta = dict(f.metadata())
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        meta["clips"] = clips
        save_file(tensors, bad, metadata=meta)
        with pytest.raises(VoiceError):
            Voice.load(bad)
