"""A long text's chapters: Markdown headings split it, each heading is spoken, the result says
where each chapter's audio lies (batched or not), and it is saved as one file per chapter or as
an M4B with chapter marks; plus Opus files."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, fixture_dir
from vocable.audio.export import (ChapterSpan, chapter_file_name, check_output, save_speech, write_chapter_files,
                                  write_m4b)
from vocable.audio.files import read_audio, write_audio
from vocable.engine.chapters import Chapter, split_chapters
from vocable.errors import AudioError

BOOK = """A short foreword, before any chapter.

# Chapter One
It was a dark night. The wind rose over the hills.

## The Storm ##
Rain fell until the morning came.

#
# Last words!
The end.
"""


def test_headings_start_chapters_and_are_spoken():
    assert split_chapters(BOOK) == [
        Chapter("", "A short foreword, before any chapter."),
        Chapter("Chapter One", "Chapter One.\n\nIt was a dark night. The wind rose over the hills."),
        Chapter("The Storm", "The Storm.\n\nRain fell until the morning came."),
        Chapter("Last words!", "Last words!\n\nThe end."),   # the empty heading before it has nothing to speak
    ]


def test_a_text_without_headings_is_one_untitled_chapter():
    text = "#hashtag is not a heading.\n    # nor is code indented four spaces."
    assert split_chapters(text) == [Chapter("", text)]


def test_headings_in_fenced_code_and_windows_line_ends():
    text = ("Intro, long enough to stand alone.\r\n```sh\r\n# a comment in code\r\n```\r\n"
            "## Two ##\r\nThe second chapter's words.\r\n#\r\n")
    assert split_chapters(text) == [
        Chapter("", "Intro, long enough to stand alone.\n```sh\n# a comment in code\n```"),
        Chapter("Two", "Two.\n\nThe second chapter's words."),
    ]


def test_chapters_too_short_to_speak_alone_join_the_next():
    assert split_chapters("# Part One\n# Chapter 1\nIt was a dark and stormy night.\n# End") == [
        Chapter("Part One – Chapter 1 – End", "Part One.\n\nChapter 1.\n\nIt was a dark and stormy night.\n\nEnd."),
    ]
    assert split_chapters("# A\n# B") == [Chapter("A – B", "A.\n\nB.")]


def test_chapter_file_names_sort_and_are_safe():
    assert chapter_file_name(2, 12, "The Storm", ".mp3") == "03 The Storm.mp3"
    assert chapter_file_name(0, 150, 'a/b\\c: "d"?', ".wav") == "001 a b c d.wav"
    assert chapter_file_name(0, 3, "", ".flac") == "01.flac"
    assert chapter_file_name(0, 3, "...", ".flac") == "01.flac"
    long = chapter_file_name(0, 3, "章" * 100, ".flac")   # 300 bytes of title: cut to whole characters
    assert len(long.encode()) <= 130 and long == "01 " + "章" * 40 + ".flac"


CHAPTERED = "# One\nThe first part is short.\n\n# Two\nThe second part, a little longer than that."


@pytest.mark.parametrize("batch", [1, 4])
def test_the_result_says_where_each_chapter_lies(engine, voice, batch):
    with engine.synthesize(CHAPTERED, voice, seed=3, max_frames=6, batch=batch) as stream:
        chunks = list(stream.chunks())
        result = stream.result()
    assert result.segments == ("One.\n\nThe first part is short.", "Two.\n\nThe second part, a little longer than that.")
    one, two = result.chapters
    assert (one.title, two.title) == ("One", "Two")
    second = min(c.first_sample for c in chunks if c.segment == 1)
    assert (one.start, one.end, two.start, two.end) == (0, second, second, result.audio.size)
    # the first chapter alone, with the stream's seed (its first segment's), is as long as its span
    alone = engine.synthesize(result.segments[0], voice, seed=3, max_frames=6).result()
    assert one.end == alone.audio.size


def test_chapters_do_not_change_a_text_without_headings(engine, voice):
    result = engine.synthesize("Just one plain sentence.", voice, seed=3, max_frames=5).result()
    assert result.chapters == (ChapterSpan("", 0, result.audio.size),)


def test_one_file_per_chapter_holds_the_audio(tmp_path):
    audio = np.linspace(-0.5, 0.5, 3000, dtype=np.float32)
    spans = [ChapterSpan("", 0, 1000), ChapterSpan("Two", 1000, 3000), ChapterSpan("Unspoken", 3000, 3000)]
    files = write_chapter_files(tmp_path / "book", audio, 24000, spans, ".wav")
    assert [f.name for f in files] == ["01.wav", "02 Two.wav"]
    back = np.concatenate([read_audio(f)[0][:, 0] for f in files])
    np.testing.assert_allclose(back, audio, atol=1 / 32767)
    with pytest.raises(AudioError, match="cannot write chapters as '.m4a'"):
        write_chapter_files(tmp_path / "x", audio, 24000, spans, ".m4a")
    with pytest.raises(AudioError, match="cannot make the folder"):
        write_chapter_files(tmp_path / "missing" / "book", audio, 24000, spans, ".wav")
    (tmp_path / "taken").write_text("a file")
    with pytest.raises(AudioError, match="it is a file, not a folder"):
        write_chapter_files(tmp_path / "taken", audio, 24000, spans, ".wav")


def test_a_failed_chapter_leaves_none_behind(tmp_path):
    audio = np.linspace(-0.5, 0.5, 3000, dtype=np.float32)
    audio[2500] = np.nan   # the second chapter cannot be written
    with pytest.raises(AudioError, match="NaN"):
        write_chapter_files(tmp_path / "book", audio, 24000, [ChapterSpan("a", 0, 1000), ChapterSpan("b", 1000, 3000)],
                            ".flac")
    assert list((tmp_path / "book").iterdir()) == []


def test_a_new_export_replaces_the_chapter_files_of_the_last(tmp_path):
    """Headings edited between two exports: the folder holds the new book only, and files that
    are not chapters of that type stay."""
    audio = np.linspace(-0.5, 0.5, 3000, dtype=np.float32)
    book = tmp_path / "book"
    write_chapter_files(book, audio, 24000, [ChapterSpan("Prologue", 0, 1000), ChapterSpan("The Storm", 1000, 2000),
                                             ChapterSpan("Three", 2000, 3000)], ".wav")
    for keep in ("cover.jpg", "01 Prologue.flac", "notes 01.wav"):
        (book / keep).write_bytes(b"mine")
    files = write_chapter_files(book, audio, 24000, [ChapterSpan("Chapter One", 0, 1500),
                                                     ChapterSpan("Chapter Two", 1500, 3000)], ".wav")
    assert [f.name for f in files] == ["01 Chapter One.wav", "02 Chapter Two.wav"]
    assert sorted(p.name for p in book.iterdir()) == ["01 Chapter One.wav", "01 Prologue.flac", "02 Chapter Two.wav",
                                                      "cover.jpg", "notes 01.wav"]
    # a failed export leaves the last one as it was
    broken = audio.copy()
    broken[2500] = np.nan
    with pytest.raises(AudioError, match="NaN"):
        write_chapter_files(book, broken, 24000, [ChapterSpan("A", 0, 1000), ChapterSpan("B", 1000, 3000)], ".wav")
    assert sorted(p.name for p in book.iterdir()) == ["01 Chapter One.wav", "01 Prologue.flac", "02 Chapter Two.wav",
                                                      "cover.jpg", "notes 01.wav"]
    np.testing.assert_allclose(read_audio(book / "02 Chapter Two.wav")[0][:, 0], audio[1500:], atol=1 / 32767)


def test_opus_files_round_trip(tmp_path):
    t = np.arange(24000) / 24000
    audio = (0.4 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    write_audio(tmp_path / "a.opus", audio, 24000)
    back, rate = read_audio(tmp_path / "a.opus")
    assert rate == 24000 and abs(back.shape[0] - audio.size) <= 960
    n = min(back.shape[0], audio.size)
    # the encoder's delay is compensated: the sine comes back in place
    assert float(np.dot(back[:n, 0], audio[:n]) / np.linalg.norm(back[:n, 0]) / np.linalg.norm(audio[:n])) > 0.99
    with pytest.raises(AudioError, match="Opus takes 8000, 12000, 16000, 24000, 48000 Hz"):
        write_audio(tmp_path / "b.opus", audio, 22050)


def pyav():
    return pytest.importorskip("av", reason="M4B needs PyAV (vocable[aac])")


def test_an_m4b_has_the_chapter_marks(tmp_path):
    av = pyav()
    rate = 24000
    audio = (0.3 * np.sin(2 * np.pi * 200 * np.arange(3 * rate) / rate)).astype(np.float32)
    spans = [ChapterSpan("", 0, rate), ChapterSpan("The Storm", rate, 3 * rate)]
    path = save_speech(tmp_path / "A book.m4b", audio, rate, spans, voice="Grandma")
    with av.open(str(path)) as container:
        marks = container.chapters()
        assert container.metadata.get("title") == "A book" and container.metadata.get("artist") == "Grandma"
        decoded = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)])
    assert [m["metadata"]["title"] for m in marks] == ["Opening", "The Storm"]
    assert [(float(m["start"] * m["time_base"]), float(m["end"] * m["time_base"])) for m in marks] == [(0, 1), (1, 3)]
    assert abs(decoded.size - audio.size) <= 2048
    with pytest.raises(AudioError, match="NaN"):
        write_m4b(tmp_path / "bad.m4b", np.full(100, np.nan, np.float32), rate)
    # an encoder failure midway (a sample rate AAC cannot take) leaves nothing behind either
    with pytest.raises(AudioError, match="cannot write"):
        write_m4b(tmp_path / "odd.m4b", audio, 1234, spans)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["A book.m4b"]
    with pytest.raises(AudioError, match="does not exist"):
        check_output(tmp_path / "nowhere" / "book.m4b")


def test_the_cli_speaks_a_book_into_an_m4b_and_chapter_files(converted, cli_env, tmp_path):
    av = pyav()
    book = tmp_path / "book.md"
    book.write_text(CHAPTERED, encoding="utf-8")
    ref = fixture_dir("0.6b") / "reference" / "ref_24k.wav"
    common = [sys.executable, "-m", "vocable", "say", "--model", str(converted("0.6b", "f32")), "--ref", str(ref),
              "--text-file", str(book), "--seed", "2", "--max-frames", "6", "--threads", "2"]
    proc = subprocess.run(common + ["--out", str(tmp_path / "book.m4b")], env=cli_env, capture_output=True,
                          text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "2 chapters" in proc.stderr
    with av.open(str(tmp_path / "book.m4b")) as container:
        assert [m["metadata"]["title"] for m in container.chapters()] == ["One", "Two"]
    proc = subprocess.run(common + ["--out", str(tmp_path / "book.mp3"), "--split-chapters"], env=cli_env,
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (tmp_path / "book").iterdir()) == ["01 One.mp3", "02 Two.mp3"]
    assert not (tmp_path / "book.mp3").exists()
    proc = subprocess.run(common[:-8] + ["--text", "No headings at all.", "--seed", "2", "--max-frames", "6",
                                         "--out", str(tmp_path / "plain.wav"), "--split-chapters"],
                          env=cli_env, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode != 0 and "the text has no chapters" in proc.stderr, proc.stderr
    for name in ("01 One.mp3", "02 Two.mp3"):
        samples, rate = read_audio(tmp_path / "book" / name)
        assert rate == 24000 and samples.shape[0] > 0
