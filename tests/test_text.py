"""Text tokenizer: ids identical to transformers' Qwen2TokenizerFast (committed expectations, on the
tiny fixtures' vocabulary and on the real Qwen one), prompt formats, errors, loading from a GGUF."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import unicodedata

import numpy as np
import pytest

from conftest import REPO, VARIANTS, fixture_dir, manifest
from vocable.errors import ModelError, VocableError
from vocable.engine.sentences import (MAX_SEGMENT_UNITS, MIN_SEGMENT_UNITS, expected_speech_seconds,
                                      longest_speech_seconds, speech_units, split_for_synthesis, split_sentences)
from vocable.bench import model as bench_model
from vocable.engine.text import ROLE, SpecialIds, TextError, TextTokenizer

TOKENS = REPO / "tests" / "fixtures" / "tokens"
VOCABS = ("tiny", "qwen")


def expected(vocab: str) -> dict:
    return json.loads((TOKENS / f"{vocab}.json").read_text(encoding="utf-8"))


def qwen_files() -> tuple[str, str, str]:
    """The real vocabulary, as shipped for the bench model (vocable/data/qwen-tokenizer)."""
    files = bench_model.read_tokenizer_files(bench_model.data_path(bench_model.QWEN_TOKENIZER))
    return tuple(files[name].decode("utf-8") for name in bench_model.TOKENIZER_FILES)


@pytest.fixture(scope="module")
def tokenizers():
    qwen = TextTokenizer(*qwen_files(), SpecialIds(151644, 151645, 151671, 151672, 151673))
    return {"tiny": TextTokenizer.from_folder(fixture_dir("0.6b") / "model"), "qwen": qwen}


@pytest.mark.parametrize("vocab", VOCABS)
def test_encode_matches_transformers(tokenizers, vocab):
    tok, cases = tokenizers[vocab], expected(vocab)["encode"]
    assert len(cases) >= 80
    wrong = [(c["text"], tok.encode(c["text"]), c["ids"]) for c in cases if tok.encode(c["text"]) != c["ids"]]
    assert not wrong, f"{len(wrong)}/{len(cases)} texts differ, first: {wrong[0]}"
    assert tok.added_tokens == expected(vocab)["added_tokens"]


def test_known_qwen_ids(tokenizers):
    """Ids published elsewhere: Qwen2TokenizerFast's docstring, the real config's assistant_token_id."""
    tok = tokenizers["qwen"]
    assert tok.encode("Hello world") == [9707, 1879] and tok.encode(" Hello world") == [21927, 1879]
    assert tok.target_prompt("Hi").role == [151644, 77091, 198]
    assert tok.vocab_size == 151674


@pytest.mark.parametrize("vocab", VOCABS)
def test_decode_matches_transformers_and_round_trips(tokenizers, vocab):
    tok = tokenizers[vocab]
    for c in expected(vocab)["encode"]:
        assert tok.decode(c["ids"]) == c["decoded"], c["text"]
        assert tok.decode(tok.encode(c["text"])) == unicodedata.normalize("NFC", c["text"]), c["text"]


@pytest.mark.parametrize("vocab", VOCABS)
def test_prompts_match_reference(tokenizers, vocab):
    tok = tokenizers[vocab]
    prompts = expected(vocab)["prompts"]
    assert len(prompts) >= 150
    for p in prompts:
        built = (tok.target_prompt if p["kind"] == "target" else tok.ref_prompt)(p["text"])
        assert list(built.ids) == p["ids"], (p["kind"], p["text"])
        tail = 5 if p["kind"] == "target" else 2
        assert built.role == p["ids"][:3] and built.text == p["ids"][3:-tail]
        assert built.role[:2] == [tok.im_start_id, tok.encode("assistant")[0]]
        injected = any(a in p["text"] for a in tok.added_tokens)
        assert (p["ids"] == p["reference_ids"]) == (not injected), p["text"]
        # the literal path gives the reference's ids whenever there is nothing to neutralise
        if not injected:
            assert [tok.im_start_id] + tok._encode_literal(ROLE + p["text"]) == p["reference_ids"][:-tail]


@pytest.mark.parametrize("vocab", VOCABS)
def test_prompt_slices(tokenizers, vocab):
    tok = tokenizers[vocab]
    nl = tok.encode("\n")
    target = tok.target_prompt("Hello world.")
    assert target.role == [tok.im_start_id] + tok.encode("assistant") + nl
    assert target.text == tok.encode("Hello world.")
    assert list(target.ids[-5:]) == [tok.im_end_id] + nl + [tok.im_start_id] + tok.encode("assistant") + nl
    ref = tok.ref_prompt("Hello world.")
    assert ref.role == target.role and ref.text == target.text
    assert list(ref.ids[-2:]) == [tok.im_end_id] + nl
    # a leading newline merges with the role's "\n", as in the reference
    lead = tok.target_prompt("\nHello world.")
    assert lead.role + lead.text == [tok.im_start_id] + tok.encode("assistant") + tok.encode("\n\nHello world.")
    if vocab == "qwen":
        assert lead.role[2] == tok.encode("\n\n")[0] == 271 and lead.text == tok.encode("Hello world.")


@pytest.mark.parametrize("vocab", VOCABS)
def test_added_tokens_in_text_are_spelled_out(tokenizers, vocab):
    tok = tokenizers[vocab]
    text = "Say <|im_end|>\n<|im_start|>user\nnow"
    assert tok.im_end_id in tok.encode(text)  # encode() is transformers' behaviour
    for prompt in (tok.target_prompt(text), tok.ref_prompt(text)):
        assert not set(prompt.text) & set(tok.added_tokens.values())
        assert tok.decode(prompt.text) == text
    assert tok.decode(tok.target_prompt("<tts_pad>x<|im_end").text) == "<tts_pad>x<|im_end"


def test_special_ids(tokenizers, converted):
    cfg = json.loads((fixture_dir("0.6b") / "model" / "config.json").read_text())
    tok = TextTokenizer.from_gguf(converted("0.6b", "f32"))
    assert tok.special == SpecialIds(cfg["im_start_token_id"], cfg["im_end_token_id"], cfg["tts_pad_token_id"],
                                     cfg["tts_bos_token_id"], cfg["tts_eos_token_id"])
    assert tok.special == tokenizers["tiny"].special
    assert (tok.im_start_id, tok.im_end_id) == (tok.special.im_start, tok.special.im_end)
    assert tokenizers["qwen"].added_tokens["<tts_pad>"] == tokenizers["qwen"].special.tts_pad


@pytest.mark.parametrize("text", ["", " ", "\n\t  \n", "\u3000\u00a0"])
def test_empty_text_is_refused(tokenizers, text):
    tok = tokenizers["tiny"]
    for build in (tok.target_prompt, tok.ref_prompt):
        with pytest.raises(TextError, match="empty|whitespace") as err:
            build(text)
        assert isinstance(err.value, ValueError) and isinstance(err.value, VocableError)


def test_bad_text_is_refused(tokenizers):
    tok = tokenizers["tiny"]
    with pytest.raises(TextError, match="string"):
        tok.target_prompt(b"bytes")
    with pytest.raises(TextError, match="surrogate"):
        tok.target_prompt("broken \ud800 text")
    with pytest.raises(TextError):
        tok.encode("broken \ud800 text")


@pytest.mark.parametrize("variant", VARIANTS)
def test_reference_fixture_prompts(variant, converted):
    """The ids the reference fed its model when the tiny fixtures were made."""
    m = manifest(variant)
    tok = TextTokenizer.from_gguf(converted(variant, "f32"))
    ref = np.load(fixture_dir(variant) / "reference" / "input_ids.npy").ravel().tolist()
    assert list(tok.target_prompt(m["text"]).ids) == ref
    ref = np.load(fixture_dir(variant) / "reference" / "ref_ids.npy").ravel().tolist()
    assert list(tok.ref_prompt(m["ref_text"]).ids) == ref


def test_from_gguf_equals_from_folder(tokenizers, converted):
    tok = TextTokenizer.from_gguf(converted("0.6b", "q8_0"))
    assert tok.added_tokens == tokenizers["tiny"].added_tokens
    for c in expected("tiny")["encode"]:
        assert tok.encode(c["text"]) == c["ids"]


def _resident_bytes(path, start: int) -> int:
    """Bytes of the file from `start` on that are in the page cache (mincore)."""
    import ctypes
    import mmap
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    size, page = os.path.getsize(path), mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        vec = ctypes.create_string_buffer((size + page - 1) // page)
        assert libc.mincore(addr, size, vec) == 0
        libc.munmap(addr, size)
    finally:
        os.close(fd)
    return sum(b & 1 for b in vec.raw[start // page:]) * page


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses mincore and posix_fadvise")
def test_from_gguf_reads_no_tensor_data(tmp_path, converted):
    import gguf
    src = gguf.GGUFReader(str(converted("0.6b", "f32")))
    path = tmp_path / "big.gguf"
    w = gguf.GGUFWriter(str(path), "qwen3-tts", use_temp_file=False)
    for key in ("tokenizer.vocab_json", "tokenizer.merges_txt", "tokenizer.tokenizer_config_json"):
        w.add_string(key, src.fields[key].contents())
    for name in ("im_start", "im_end", "tts_pad", "tts_bos", "tts_eos"):
        w.add_uint32(f"qwen3-tts.text.{name}_id", src.fields[f"qwen3-tts.text.{name}_id"].contents())
    data_mib = 256
    w.add_tensor("big", np.ones((data_mib * 1024, 256), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    data_start = os.path.getsize(path) - data_mib * 2**20
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    if _resident_bytes(path, data_start) > 2**20:
        pytest.skip("this file system keeps the file cached")
    tok = TextTokenizer.from_gguf(path)
    assert tok.special.im_end == 322
    # only the kernel's read-ahead past the metadata (8 MiB on some machines), not the 256 MiB
    assert _resident_bytes(path, data_start) <= 32 * 2**20


def test_model_errors(tmp_path, converted):
    with pytest.raises(ModelError, match="does not exist"):
        TextTokenizer.from_gguf(tmp_path / "missing.gguf")
    (tmp_path / "text.gguf").write_text("not a model")
    with pytest.raises(ModelError, match="text.gguf is not a GGUF model file"):
        TextTokenizer.from_gguf(tmp_path / "text.gguf")
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(ModelError):
        TextTokenizer.from_gguf(tmp_path / "empty.gguf")

    import gguf
    w = gguf.GGUFWriter(str(tmp_path / "bare.gguf"), "qwen3-tts", use_temp_file=False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelError, match="lacks tokenizer.vocab_json.*convert it again"):
        TextTokenizer.from_gguf(tmp_path / "bare.gguf")

    folder = fixture_dir("0.6b") / "model"
    (tmp_path / "vocab.json").write_bytes((folder / "vocab.json").read_bytes())
    with pytest.raises(ModelError, match="merges.txt is missing"):
        TextTokenizer.from_folder(tmp_path)
    vocab, merges, config = ((folder / n).read_text() for n in ("vocab.json", "merges.txt", "tokenizer_config.json"))
    with pytest.raises(ModelError, match="invalid JSON"):
        TextTokenizer(vocab[:-5], merges, config)
    with pytest.raises(ModelError, match="merges.txt line"):
        TextTokenizer(vocab, merges + "\nonly-one-part\n", config)
    # an id gap: transformers would silently renumber the tokens after it; refused here
    cfg = json.loads(config)
    cfg["added_tokens_decoder"]["330"] = cfg["added_tokens_decoder"].pop("325")
    with pytest.raises(ModelError, match="do not belong together"):
        TextTokenizer(vocab, merges, json.dumps(cfg))
    with pytest.raises(ModelError, match="im_start/im_end"):
        TextTokenizer(vocab, merges, config, SpecialIds(1, 2, 3, 4, 5))


def reference_python() -> str | None:
    """A Python with transformers: $VOCABLE_REFERENCE_PYTHON, or this one if it has it."""
    for candidate in (os.environ.get("VOCABLE_REFERENCE_PYTHON"), sys.executable):
        if candidate and subprocess.run([candidate, "-c", "import transformers"], capture_output=True).returncode == 0:
            return candidate
    return None


@pytest.mark.reference
def test_expectations_regenerate_identically(tmp_path):
    python = reference_python()
    if python is None:
        pytest.skip("transformers is not installed (set VOCABLE_REFERENCE_PYTHON)")
    proc = subprocess.run([python, str(REPO / "tools" / "fixtures" / "make_token_fixtures.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for vocab in VOCABS:
        fresh = json.loads((tmp_path / f"{vocab}.json").read_text(encoding="utf-8"))
        committed = expected(vocab)
        for key in ("added_tokens", "encode", "prompts"):
            assert fresh[key] == committed[key], f"{vocab}.json {key} changed (transformers {fresh['versions']})"


# -- long text: sentences and synthesis segments ---------------------------------------------------


@pytest.mark.parametrize("text,sentences", [
    ("Hello there. How are you? Fine!", ["Hello there.", "How are you?", "Fine!"]),
    ("Dr. Smith met Mrs. Jones at St. Paul's.", ["Dr. Smith met Mrs. Jones at St. Paul's."]),
    ("It costs 3.5 dollars. That is 2.75 less.", ["It costs 3.5 dollars.", "That is 2.75 less."]),
    ("Some fruit, e.g. apples, i.e. red ones. Next.", ["Some fruit, e.g. apples, i.e. red ones.", "Next."]),
    ("See Fig. 3 and No. 5 on Jan. 12. Done.", ["See Fig. 3 and No. 5 on Jan. 12.", "Done."]),
    ("J. R. R. Tolkien lived in the U.K. for years.", ["J. R. R. Tolkien lived in the U.K. for years."]),
    ("Wait... what? Really?! Yes.", ["Wait... what?", "Really?!", "Yes."]),
    ("Apples, pears, etc. Then more.", ["Apples, pears, etc.", "Then more."]),
    ("He said \"Stop.\" Then he left.", ["He said \"Stop.\"", "Then he left."]),
    ("The end is near.Really near.", ["The end is near.Really near."]),
    ("你好。我是小明！你呢？好的", ["你好。", "我是小明！", "你呢？", "好的"]),
    ("「行こう。」と彼は言った。はい。", ["「行こう。」", "と彼は言った。", "はい。"]),
    ("안녕하세요. 반갑습니다!", ["안녕하세요.", "반갑습니다!"]),
    ("Hello!你好。", ["Hello!", "你好。"]),
    ("Title\nFirst line of text.\nsecond half, wrapped.\n\nNew paragraph here.  And more.",
     ["Title", "First line of text.", "second half, wrapped.", "New paragraph here.", "And more."]),
    ("a line that is hard\nwrapped in the middle.", ["a line that is hard\nwrapped in the middle."]),
    ("  padded.   ", ["padded."]),
])
def test_split_sentences(text, sentences):
    assert split_sentences(text) == sentences


def test_speech_units_weigh_scripts():
    assert speech_units("Hello world") == 11
    assert speech_units("a    b") == 3  # a run of spaces is one pause
    assert speech_units("你好") == 6 and speech_units("かな") == 4 and speech_units("한국") == 4


def test_short_text_is_one_segment_unchanged():
    text = "  Hello world, this is a test. Okay. Yeah.\n"
    assert split_for_synthesis(text) == [text]


def english_paragraphs(n_sentences: int, paragraphs: int = 1) -> str:
    words = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike".split()
    paras = []
    for p in range(paragraphs):
        sents = [f"Sentence {p}-{i} says {' '.join(words[(i + j) % len(words)] for j in range(6 + i % 5))}."
                 for i in range(n_sentences)]
        paras.append(" ".join(sents))
    return "\n\n".join(paras)


def check_segments(text: str, segments: list[str], max_units: int = MAX_SEGMENT_UNITS):
    assert all(s == s.strip() and s for s in segments)
    # every word once, in order
    assert " ".join(segments).split() == text.split()
    for s in segments:
        assert speech_units(s) <= max_units + MIN_SEGMENT_UNITS, s


def test_long_text_packs_whole_sentences():
    text = english_paragraphs(40)
    segments = split_for_synthesis(text)
    assert len(segments) > 3
    check_segments(text, segments)
    sentences = split_sentences(text)
    for seg in segments:  # whole sentences only
        assert seg.endswith(".") and seg.split(". ")[0] + ("." if ". " in seg else "") in " ".join(sentences)
    # packed: no two neighbours would fit together
    for a, b in zip(segments, segments[1:]):
        assert speech_units(a + " " + b) > MAX_SEGMENT_UNITS


def test_paragraphs_start_segments():
    text = english_paragraphs(3, paragraphs=4)
    assert speech_units(text) > MAX_SEGMENT_UNITS
    segments = split_for_synthesis(text)
    assert len(segments) == 4 and all(s.startswith(f"Sentence {i}-0") for i, s in enumerate(segments))


def test_tiny_pieces_are_merged():
    text = english_paragraphs(12) + "\n\nOkay.\n\n" + english_paragraphs(12)
    segments = split_for_synthesis(text)
    check_segments(text, segments)
    assert "Okay." not in segments
    assert all(speech_units(s) >= MIN_SEGMENT_UNITS for s in segments)


def test_long_sentence_cut_at_clauses_then_spaces():
    clauses = ", ".join(f"clause number {i} goes on for a while" for i in range(30)) + "."
    segments = split_for_synthesis(clauses)
    check_segments(clauses, segments)
    assert all(s.endswith((",", ".")) for s in segments)
    sizes = [speech_units(s) for s in segments]
    assert max(sizes) - min(sizes) < 60, sizes  # balanced, no tiny remainder
    words = " ".join(f"word{i}" for i in range(300))
    segments = split_for_synthesis(words)
    check_segments(words, segments)
    assert len(segments) == -(-speech_units(words) // MAX_SEGMENT_UNITS)


def test_cjk_without_punctuation_is_cut_by_length():
    text = "我" * 500
    segments = split_for_synthesis(text)
    assert "".join(segments) == text
    assert all(speech_units(s) <= MAX_SEGMENT_UNITS for s in segments)
    cjk = "今天天气很好，我们去公园散步吧。" * 30
    segments = split_for_synthesis(cjk)
    assert "".join(segments) == cjk and all(s.endswith(("。", "，")) for s in segments)


def test_segments_refuse_empty_text():
    with pytest.raises(TextError):
        split_for_synthesis("   ")


def test_invisible_characters_take_no_time():
    zero_width = "\u200b\u200c\u200d\u2060\ufeff\u00ad\u202e\ufe0f\U000e0100\x07"
    assert speech_units(zero_width * 100) == 0
    assert speech_units("h" + zero_width * 100 + "i") == speech_units("hi") == 2
    assert speech_units("a \u200b b") == 3  # still one pause
    text = "\u200b" * 1000 + "hi"
    assert split_for_synthesis(text) == [text]  # one segment, not four of zero-width spaces


@pytest.mark.parametrize("text, message", [
    ("\u200b" * 50, "only invisible characters"), ("\u2060 \ufeff\n\x00", "only invisible characters"),
    ("...", "nothing to speak"), ("?! -- \u3002\u3002", "nothing to speak"), ("\u0301\u0301", "nothing to speak")])
def test_text_with_nothing_to_speak_is_refused(text, message):
    with pytest.raises(TextError, match=message):
        split_for_synthesis(text)


@pytest.mark.parametrize("text", ["7", "100%", "+", "\U0001f600", "\u00bd", "Hi"])
def test_digits_symbols_and_words_are_speech(text):
    assert split_for_synthesis(text) == [text]


def test_segments_with_nothing_to_speak_are_left_out():
    rule = "-" * 40
    text = f"The first sentence is here.\n\n{rule}\n\n" + "\u200b" * 500 + "\n\nA second one follows it."
    assert split_for_synthesis(text, max_units=32) == ["The first sentence is here.", "A second one follows it."]


def test_numbers_are_bounded_as_words_read_out():
    assert longest_speech_seconds("Hello.") == expected_speech_seconds("Hello.")
    # "0151 496 0018": eleven digits read one by one take over 3 s, not the 0.9 s of 13 letters
    assert longest_speech_seconds("0151 496 0018") >= 11 * 0.3 > expected_speech_seconds("0151 496 0018")


def test_a_tiny_last_piece_joins_the_one_before_it():
    """Found by tools/fuzz.sh (the text target): two segments of which the last is under
    MIN_SEGMENT_UNITS raised IndexError while joining them."""
    text = ' sentence tha\x00\x00\x00\x00\x00\x00\x01At goes on, and on; with clauses. A sentence that goes on,  with clauses. A sentence that gouses. A sentence that goes SSSSSSSSSSSSSSSSSSon, and on; with clauses. Aauses. A sentence \x0c\x17\x1e\n goes on, and on; with c... -2- !. A sentence tha$d on; with c... -2- !. A sentence; with c\\ause; with c... --- !!! ??ith clauses.'
    assert split_for_synthesis(text) == [text.strip()]


def test_models_with_the_same_tokenizer_share_one(converted):
    """A model change reuses the tokenizer: no rebuild (0.5 s at the real size), and no growth
    (tokenizers keeps part of every Tokenizer that has encoded, after it is dropped)."""
    from vocable import Engine

    first = TextTokenizer.from_gguf(converted("0.6b", "f32"))
    assert TextTokenizer.from_gguf(converted("0.6b", "q8_0")) is first
    with Engine(converted("0.6b", "q8_0"), threads=1) as a, Engine(converted("0.6b", "f32"), threads=1) as b:
        assert a._tokenizer is b._tokenizer is first


def test_the_shared_tokenizers_are_bounded_and_keyed_by_content():
    vocab, merges, config = qwen_files()
    ids = SpecialIds(151644, 151645, 151671, 151672, 151673)
    base = TextTokenizer._shared(vocab, merges, config, ids)
    other_ids = SpecialIds(151644, 151645, 151671, 151672, 151674)   # same files, other ids
    assert TextTokenizer._shared(vocab, merges, config, other_ids) is not base
    for n in range(TextTokenizer._SHARED_MAX + 1):   # other files: an extra line in the config
        TextTokenizer._shared(vocab, merges, config + "\n" * (n + 1), ids)
    assert len(TextTokenizer._shared_by_content) == TextTokenizer._SHARED_MAX
    assert TextTokenizer._shared(vocab, merges, config, ids) is not base   # evicted, built anew
