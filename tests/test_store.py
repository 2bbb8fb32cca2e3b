"""Atomic writes and the cached folders of files (vocable/store.py)."""
from __future__ import annotations

import os
import time

import pytest

from vocable import store
from vocable.errors import VocableError


def test_atomic_write_replaces_and_leaves_nothing_else(tmp_path):
    target = tmp_path / "a.json"
    store.atomic_write_text(target, "first")
    store.atomic_write_text(target, "second ✓")
    assert target.read_text(encoding="utf-8") == "second ✓"
    store.atomic_write_bytes(target, b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_a_failed_write_keeps_the_old_file(tmp_path):
    target = tmp_path / "voice.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with store.atomic_writer(target) as tmp:
            tmp.write_bytes(b"half of the new")
            raise RuntimeError("the writer failed")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["voice.bin"]
    with pytest.raises(OSError):
        store.atomic_write_bytes(tmp_path / "missing" / "x", b"data")


def test_atomic_copy_and_a_stopped_copy(tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(3 * 1024 + 5))
    dest = store.atomic_copy(src, tmp_path / "dest.bin", chunk=1024)
    assert dest.read_bytes() == src.read_bytes()

    def stop(copied):
        if copied >= 2048:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        store.atomic_copy(src, tmp_path / "stopped.bin", chunk=1024, on_chunk=stop)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest.bin", "src.bin"]


def test_stale_temp_files_are_removed_fresh_ones_kept(tmp_path):
    old = tmp_path / ".a.json.1234abcd.tmp"
    fresh = tmp_path / ".b.json.5678abcd.tmp"
    other = tmp_path / "user-file.tmp"
    for p in (old, fresh, other):
        p.write_text("x")
    long_ago = time.time() - 7200
    os.utime(old, (long_ago, long_ago))
    os.utime(other, (long_ago, long_ago))
    store.remove_stale_temp_files(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [fresh.name, other.name]


class FolderError(VocableError):
    pass


def test_a_file_folder_reads_each_file_once_until_it_changes(tmp_path):
    reads = []

    def read(path):
        reads.append(path.name)
        text = path.read_text()
        if text == "bad":
            raise FolderError(f"{path.name} is bad")
        return text

    folder = store.FileFolder(tmp_path / "things", lambda: tmp_path / "unused", read, FolderError, "the things")
    assert folder.root.is_dir()
    (folder.root / "a.txt").write_text("first")
    (folder.root / "b.txt").write_text("bad")
    (folder.root / ".c.txt").write_text("hidden: a temporary file")
    skipped = []
    files = sorted(folder.files("*.txt"))
    assert [p.name for p in files] == ["a.txt", "b.txt"]
    assert folder.read_each(files, lambda path, e: skipped.append((path.name, str(e)))) == ["first"]
    assert skipped == [("b.txt", "b.txt is bad")]
    assert folder.read_each(files, lambda path, e: None) == ["first"]
    assert reads == ["a.txt", "b.txt", "b.txt"]  # a bad file is read again, a good one is not
    (folder.root / "a.txt").write_text("second, longer")
    assert folder.read(folder.root / "a.txt") == "second, longer"
    folder.forget(folder.root / "a.txt")
    assert folder.read(folder.root / "a.txt") == "second, longer"
    assert reads.count("a.txt") == 3


def test_a_file_folder_that_cannot_be_opened_says_which(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(FolderError, match="cannot open the things"):
        store.FileFolder(blocker / "sub", lambda: tmp_path, str, FolderError, "the things")


def test_a_file_folder_deletes_a_file_and_says_why_it_cannot(tmp_path):
    folder = store.FileFolder(tmp_path / "things", lambda: tmp_path / "unused", lambda p: p.read_text(), FolderError,
                              "the things")
    path = folder.root / "a.txt"
    path.write_text("first")
    assert folder.read(path) == "first"
    folder.delete(path, "the thing 'a'")
    assert not path.exists() and folder.files("*.txt") == []
    with pytest.raises(FolderError, match=r"the thing 'a' is not in the things \(deleted already\?\)"):
        folder.delete(path, "the thing 'a'")
    (folder.root / "b").mkdir()   # a folder where a file should be: unlink fails with an OSError
    with pytest.raises(FolderError, match="cannot delete the thing 'b'"):
        folder.delete(folder.root / "b", "the thing 'b'")
