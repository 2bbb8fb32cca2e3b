"""Command line: `vocable <command>`; run `vocable --help` for the list."""
from __future__ import annotations

import argparse
import logging
import sys
import threading
from pathlib import Path

from .engine import runaway
from .engine import FILE_BATCH
from .errors import VocableError
from .engine.sentences import expected_speech_seconds


def _cmd_convert(args) -> int:
    from .engine.convert import ConversionError, convert, print_progress

    out = Path(args.out)
    if out.is_dir():
        out = out / f"qwen3-tts-{args.type}.gguf"
    print(f"converting {args.hf_model_dir} -> {out} ({args.type})", file=sys.stderr)
    try:
        convert(Path(args.hf_model_dir), out, args.type, progress=None if args.quiet else print_progress())
    except ConversionError as e:
        raise VocableError(str(e)) from e
    print(out)
    return 0


def _checked_reference(path: str):
    """The reference clip read and checked as the app checks it (not trimmed: the command line
    clones the file as it is), with its warnings and notes printed; AudioError when unusable."""
    from .audio.files import read_reference
    from .audio.reference import check_reference

    samples, rate, seconds = read_reference(path)
    check = check_reference(samples, rate, trim=False, source_seconds=seconds)
    for note in check.notes:
        print(f"note: {note}", file=sys.stderr)
    for warning in check.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return check


def _say_fallback(engine, asked: str) -> None:
    """A device asked for by name that is not in use is worth a warning; "auto" on a machine
    without a GPU is not."""
    if engine.device_fallback and asked != "auto":
        print(f"warning: running on the CPU: {engine.device_fallback}", file=sys.stderr)


def _add_device_option(parser) -> None:
    parser.add_argument("--device", default="auto",
                        help="where the model runs: auto (default: the best GPU, else the CPU), cpu, or a device "
                             "id that `vocable about` lists (vulkan:0)")


def _transcriber(args):
    from .asr.transcriber import Transcriber, find_whisper_model
    return Transcriber(find_whisper_model(args.whisper), threads=args.threads)


def _transcribe_reference(args, check) -> str:
    """The reference's transcript by speech recognition, printed for the user to verify."""
    heard = _transcriber(args).transcribe(check.samples, check.sample_rate)
    if not heard.text:
        raise VocableError("speech recognition heard no words in the reference; give --ref-text")
    print(f"transcript ({heard.tts_language if heard.tts_language != 'auto' else heard.language}): {heard.text}",
          file=sys.stderr)
    return heard.text


def _check_result(args, engine, voice, text, result):
    """The result transcribed and compared with the text, and its speaker with the voice's."""
    from .asr import check_output
    from .asr.transcriber import TTS_LANGUAGES
    language = next((code for code, name in TTS_LANGUAGES.items() if name == args.language), None)
    return check_output(_transcriber(args), text, result.audio, result.sample_rate, engine=engine, voice=voice,
                        language=language)


def _cmd_transcribe(args) -> int:
    from .audio.files import read_audio
    samples, rate = read_audio(args.audio)
    heard = _transcriber(args).transcribe(samples, rate, args.language)
    print(heard.text)
    print(f"{Path(args.audio).name}: {heard.seconds:.1f} s, language {heard.language} "
          f"(p={heard.language_probability:.2f}); for vocable: --language {heard.tts_language}", file=sys.stderr)
    return 0


def _cmd_whisper_download(args) -> int:
    from .engine.models import ModelStore
    folder = ModelStore().download_whisper(args.name, progress=None if args.quiet else _print_fraction)
    print(folder)
    return 0


def _print_fraction(fraction: float, message: str) -> None:
    print(f"\r{100 * fraction:5.1f} % {message}".ljust(79), end="" if fraction < 1 else "\n", file=sys.stderr,
          flush=True)


def _cmd_embed(args) -> int:
    from .engine import Engine

    first, *more = args.ref
    checks = [_checked_reference(path) for path in args.ref]
    if args.transcribe and not args.ref_text:
        args.ref_text = _transcribe_reference(args, checks[0])
    with Engine(args.model, threads=args.threads, dump_dir=args.dump_dir, device=args.device) as engine:
        _say_fallback(engine, args.device)
        voice = engine.embed_voice(checks[0].samples, checks[0].sample_rate, ref_text=args.ref_text,
                                   name=args.name or Path(first).stem)
        for check in checks[1:]:
            voice = engine.add_clip(voice, check.samples, check.sample_rate)
    voice.save(args.out)
    if more:
        print(f"the speaker embedding averages {voice.clips} clips; in-context cloning continues {first}",
              file=sys.stderr)
    mode = "in-context (transcript given)" if voice.ref_text else "x-vector only (no transcript)"
    print(f"voice '{voice.name}': {voice.reference_seconds:.2f} s reference, embedding {voice.speaker_embedding.shape[0]}, "
          f"{voice.codes.shape[0]} code frames; clones {mode} -> {args.out}", file=sys.stderr)
    return 0


def _whole_number(low: int, high: int | None = None):
    """An argparse type: a whole number in [low, high], with the range in the error."""
    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            n = low - 1
        if n < low or (high is not None and n > high):
            span = f"from {low} to {high}" if high is not None else f"of at least {low}"
            raise argparse.ArgumentTypeError(f"must be a whole number {span}, not '{value}'")
        return n
    return parse


def _batch_width(value: str) -> int:
    from . import _engine
    return _whole_number(1, _engine.MAX_BATCH)(value)


def _read_text(args) -> str:
    if args.text is not None:
        text = args.text
    elif args.text_file == "-":   # UTF-8 whatever the locale (a Windows pipe would be read as cp1252)
        try:
            text = sys.stdin.buffer.read().decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise VocableError(f"standard input is not UTF-8 text (byte {e.start}); send UTF-8") from None
    else:
        path = Path(args.text_file)
        if not path.is_file():
            raise VocableError(f"text file not found: {path}" if not path.exists() else f"{path} is not a file")
        try:
            text = path.read_text(encoding="utf-8-sig")
        except UnicodeDecodeError as e:
            raise VocableError(f"{path.name} is not UTF-8 text (byte {e.start}); save it as UTF-8") from None
        except OSError as e:
            raise VocableError(f"cannot read {path}: {e.strerror or e}") from None
    if not text.strip():
        raise VocableError("the text is empty: give some words to speak" + (
            f" ({args.text_file} holds none)" if args.text is None else ""))
    return text


class _ProgressLine:
    """Shows a synthesis' progress on stderr: one line rewritten in place on a terminal, a plain
    line every few seconds otherwise (logs, pipes)."""

    def __init__(self, stream, player=None, stream_to=sys.stderr):
        self._stream, self._player, self._out = stream, player, stream_to
        self._tty = stream_to.isatty()
        self._stop = threading.Event()
        self._width = 0
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        if self._tty and self._width:
            print("\r" + " " * self._width + "\r", end="", file=self._out, flush=True)

    def _describe(self) -> str:
        waiting = self._player.waiting if self._player is not None else None
        return "speaking: " + self._stream.progress.describe() + (f"; {waiting}" if waiting else "")

    def _loop(self):
        if self._tty:  # at once, then five times a second
            while True:
                text = self._describe()
                self._width = max(self._width, len(text))
                print("\r" + text.ljust(self._width), end="", file=self._out, flush=True)
                if self._stop.wait(0.2):
                    return
        while not self._stop.wait(5.0):
            print(self._describe(), file=self._out, flush=True)


def _cmd_say(args) -> int:
    from .engine import Engine
    from .audio.export import check_chapter_output, check_output, save_speech, spoken_chapters, write_chapter_files
    from .engine.chapters import split_chapters
    from .library.voice import Voice

    out = Path(args.out)
    if args.split_chapters and out.suffix.lower() == ".m4b":
        raise VocableError("--split-chapters writes a file per chapter: give --out a .wav, .flac, .ogg, .opus or "
                           ".mp3 name (an .m4b holds its chapters in one file)")
    if args.split_chapters:
        check_chapter_output(out.with_suffix(""), out.suffix)
    else:
        check_output(out)
    text = _read_text(args)
    if args.split_chapters and len(split_chapters(text)) < 2:
        raise VocableError("--split-chapters: the text has no chapters; start each one with a heading line such as "
                           "'# Chapter One'")
    voice = Voice.load(args.voice) if args.voice else None
    ref = _checked_reference(args.ref) if args.ref else None
    with Engine(args.model, threads=args.threads, device=args.device) as engine:
        _say_fallback(engine, args.device)
        if voice is None:
            voice = engine.embed_voice(ref.samples, ref.sample_rate, ref_text=args.ref_text, name=Path(args.ref).stem)
        player = None
        if args.play:
            from .errors import AudioDeviceError
            from .audio.playback import StreamPlayer
            try:
                device = (int(args.output_device) if args.output_device and args.output_device.isdigit()
                          else args.output_device)
                player = StreamPlayer(engine.sample_rate, device=device, expected_seconds=expected_speech_seconds(text),
                                      max_chunk_seconds=engine.max_chunk_seconds)
            except AudioDeviceError as e:
                print(f"vocable: {e}; writing {out} only", file=sys.stderr)
        try:
            # a long text's segments generate side by side into the file; played, one by one
            batch = args.batch or (1 if player is not None else FILE_BATCH)
            with engine.synthesize(text, voice, args.language, args.ref_text, seed=args.seed, greedy=args.greedy,
                                   max_frames=args.max_frames, batch=batch) as stream:
                with _ProgressLine(stream, player):
                    for chunk in stream:
                        if player is not None:
                            player.write(chunk)
                    result = stream.result()
            if args.split_chapters:
                written = write_chapter_files(out.with_suffix(""), result.audio, result.sample_rate, result.chapters,
                                              out.suffix)
            else:
                written = [save_speech(out, result.audio, result.sample_rate, result.chapters, voice.name)]
            if player is not None:
                player.finish()
                player.wait()
        finally:
            if player is not None:
                player.stop()
        checked = _check_result(args, engine, voice, text, result) if args.check else None
    where = str(written[0]) if len(written) == 1 else f"{len(written)} files in {written[0].parent}"
    print(f"{where}: {result.seconds:.2f} s of audio at {result.sample_rate} Hz in {result.wall_time:.2f} s "
          f"(first audio after {result.time_to_first_audio:.2f} s, real-time factor {result.real_time_factor:.2f}); "
          f"{result.mode} ({result.mode_reason}), seed {result.seed}"
          + ("" if result.reached_eos or result.runaway else ", stopped at the frame cap")
          + (f", {len(result.segments)} segments" if len(result.segments) > 1 else "")
          + (f", {len(spoken)} chapters" if len(spoken := spoken_chapters(result.chapters)) > 1 else ""),
          file=sys.stderr)
    if result.runaway:
        print(f"warning: {runaway.summary(result.runaway)}", file=sys.stderr)
    if player is not None:
        waited = "" if player.waited_seconds is None else f", first sound {player.waited_seconds:.2f} s after the first audio"
        reason = f" ({player.wait_reason})" if player.wait_reason else ""
        print(f"played on '{player.device_name}'{waited}{reason}, "
              + (f"{player.underruns} pause(s) waiting for audio" if player.underruns else "no pauses"), file=sys.stderr)
    if checked is not None:
        print(f"check: {checked.describe()}; heard: \"{checked.transcript}\"", file=sys.stderr)
        if not checked.ok:
            print("warning: the check flagged the result (exit status 3)", file=sys.stderr)
            return 3
    return 0


def _cmd_serve(args) -> int:
    import os
    from .engine import Engine
    from .library.settings import Settings
    from .library.voices import VoiceLibrary
    from .server import ServerConfig, check_exposure, serve

    settings = Settings.load()
    model = args.model or settings.model_path
    if not model:
        raise VocableError("no model: give --model, or pick one in the app first")
    config = ServerConfig(host=args.host, port=args.port, api_key=args.api_key or os.environ.get("VOCABLE_API_KEY"),
                          max_input_chars=args.max_input_chars, max_waiting=args.queue)
    check_exposure(config)   # before the model loads
    library = VoiceLibrary(Path(args.voices) if args.voices else None)
    with Engine(model, threads=args.threads or settings.threads, device=args.device) as engine:
        _say_fallback(engine, args.device)
        print(f"serving {Path(model).name} ({engine.device}) with {len(library.entries())} voice(s) from "
              f"{library.root}", file=sys.stderr)
        try:
            serve(engine, config, library)
        except KeyboardInterrupt:
            pass
    return 0


def _display_problem() -> str | None:
    """Why no window can open here, or None: Qt would abort the process without a display."""
    import os
    if sys.platform.startswith("linux") and not os.environ.get("QT_QPA_PLATFORM"):
        if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
            return ("no display to open the window on (neither DISPLAY nor WAYLAND_DISPLAY is set); "
                    "run it in a desktop session, or see `vocable --help` for the command line")
    return None


def _cmd_gui(args) -> int:
    problem = _display_problem()
    if problem:
        raise VocableError(problem)
    try:
        from .gui.app import run
    except ImportError as e:
        raise VocableError(f"the desktop app needs PySide6 ({e}); pip install PySide6-Essentials") from e
    selftest = tuple(args.selftest) if getattr(args, "selftest", None) else None
    return run(selftest=selftest, out=getattr(args, "out", None), text=getattr(args, "text", None),
               verbose=args.verbose)


def _cmd_bench(args) -> int:
    from .bench.runner import run_bench
    return run_bench(args)


def _cmd_about(args) -> int:
    from . import about
    from .errors import ModelError
    from .engine.models import ModelStore
    from .library.settings import Settings

    described = None
    in_use = Settings.load().model_path
    if args.model:
        entry = ModelStore().describe(Path(args.model))
        described = (entry.name, entry.license)
    elif in_use:
        try:
            entry = ModelStore().describe(Path(in_use))
            described = (entry.name, entry.license)
        except ModelError:
            pass  # the app asks for another model at its next start; the rest is still worth printing
    print(about.report(described, with_texts=args.licenses))
    return 0


def version_text() -> str:
    from . import _engine
    return (f"vocable {_engine.__version__}; engine {_engine.version()} (ABI {_engine.abi_version()}, accepts "
            f"{_engine.abi_min_version()} to {_engine.abi_version()}); ggml {_engine.ggml_version()}\n"
            f"CPU backend: {_engine.system_info()}")


class _VersionAction(argparse.Action):
    """--version: the text is made when asked for (it loads the CPU backend) and not re-wrapped."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vocable", description="Local voice cloning with Qwen3-TTS 12 Hz.")
    p.add_argument("-v", "--verbose", action="store_true", help="log engine details ([Perf] lines)")
    p.add_argument("--version", action=_VersionAction,
                   help="print the versions of Vocable, its engine (and ABI range), ggml and its CPU backend")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    c = sub.add_parser("convert", help="convert a Hugging Face Qwen3-TTS 12 Hz Base folder to the engine's GGUF")
    c.add_argument("hf_model_dir")
    c.add_argument("out", help="output .gguf file (or a folder)")
    c.add_argument("--type", choices=["f32", "f16", "q8_0", "q4_k"], default="f16", help="matrix weight type")
    c.add_argument("-q", "--quiet", action="store_true")
    c.set_defaults(func=_cmd_convert)

    e = sub.add_parser("embed", help="make a voice file from a reference recording")
    e.add_argument("--model", required=True, help="converted .gguf model")
    e.add_argument("--ref", required=True, action="append", help="reference audio (WAV, FLAC, OGG, MP3); give it "
                   "again for more clips of the same speaker, averaged into the speaker embedding (the first is "
                   "the one in-context cloning continues, with --ref-text)")
    e.add_argument("--ref-text", help="transcript of the reference (enables in-context cloning)")
    e.add_argument("--transcribe", action="store_true", help="fill in --ref-text by speech recognition (Whisper), "
                   "for in-context cloning without typing; the transcript is printed to check")
    e.add_argument("--whisper", help="speech recognition model: a name in the store (tiny, base, ...) or a folder")
    e.add_argument("--name", help="voice name (default: the file name)")
    e.add_argument("--out", required=True, help="voice file to write")
    e.add_argument("--threads", type=_whole_number(1))
    _add_device_option(e)
    e.add_argument("--dump-dir", help="write every engine stage as .npy here")
    e.set_defaults(func=_cmd_embed)

    s = sub.add_parser("say", help="speak a text in a cloned voice into an audio file (and play it as it comes)")
    s.add_argument("--model", required=True, help="converted .gguf model")
    v = s.add_mutually_exclusive_group(required=True)
    v.add_argument("--voice", help="voice file made by `vocable embed`")
    v.add_argument("--ref", help="reference audio to clone (WAV, FLAC, OGG, MP3)")
    s.add_argument("--ref-text", help="transcript of the reference (enables in-context cloning)")
    t = s.add_mutually_exclusive_group(required=True)
    t.add_argument("--text", help="what to say")
    t.add_argument("--text-file", help="UTF-8 file with what to say ('-': standard input)")
    s.add_argument("--out", required=True, help="audio file to write: .wav, .flac, .ogg, .opus or .mp3, or .m4b (an "
                   "audiobook with the text's chapters marked; needs PyAV). Markdown headings ('# Title') in the "
                   "text start chapters")
    s.add_argument("--split-chapters", action="store_true", help="write one file per chapter instead, into a folder "
                   "named after --out (book.mp3: book/01 Title.mp3, ...)")
    s.add_argument("--play", action="store_true", help="play the speech as it is generated")
    s.add_argument("--check", action="store_true", help="transcribe the result and compare it with the text (word "
                   "error rate) and the voice (speaker similarity); exit status 3 when it is flagged")
    s.add_argument("--whisper", help="speech recognition model for --check: a name in the store or a folder")
    s.add_argument("--output-device", help="audio output for --play (a name or part of one, or an index)")
    s.add_argument("--language", default="auto", help="auto (default) or a language the model knows: english, ...")
    s.add_argument("--seed", type=_whole_number(0, 2 ** 64 - 1), help="reproduce a run (the seed is printed at the end)")
    s.add_argument("--greedy", action="store_true", help="take the most likely codes instead of sampling")
    s.add_argument("--max-frames", type=_whole_number(1), help="stop each segment of the text after this many "
                   "frames (80 ms each)")
    s.add_argument("--batch", type=_batch_width, help="how many segments of a long text generate side by side "
                   f"(default {FILE_BATCH}; 1 with --play, where the first audio matters more)")
    s.add_argument("--threads", type=_whole_number(1))
    _add_device_option(s)
    s.set_defaults(func=_cmd_say)

    r = sub.add_parser("serve", help="serve the OpenAI-compatible speech API (POST /v1/audio/speech) on this machine")
    r.add_argument("--model", help="converted .gguf model (default: the one the app uses)")
    r.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only; "
                   "any other needs --api-key)")
    r.add_argument("--port", type=_whole_number(0, 65535), default=8765, help="port (default 8765; 0: any free one)")
    r.add_argument("--api-key", help="the key clients must send (Authorization: Bearer KEY); default: the "
                   "VOCABLE_API_KEY environment variable, which keeps it out of the process list")
    r.add_argument("--voices", help="voice library folder (default: the app's)")
    r.add_argument("--queue", type=_whole_number(0), default=8, help="requests that may wait for the engine (default 8); "
                   "more get 429 with Retry-After")
    r.add_argument("--max-input-chars", type=_whole_number(1), default=4096, help="longest text accepted (default 4096)")
    r.add_argument("--threads", type=_whole_number(1))
    _add_device_option(r)
    r.set_defaults(func=_cmd_serve)

    tr = sub.add_parser("transcribe", help="the words spoken in an audio file (speech recognition with Whisper)")
    tr.add_argument("audio")
    tr.add_argument("--language", help="Whisper's language code (en, de, ...); default: detected")
    tr.add_argument("--whisper", help="speech recognition model: a name in the store (tiny, base, ...) or a folder")
    tr.add_argument("--threads", type=_whole_number(1))
    tr.set_defaults(func=_cmd_transcribe)

    wd = sub.add_parser("whisper-download", help="download a speech recognition model (Whisper, for faster-whisper)")
    wd.add_argument("name", nargs="?", default="base", help="tiny, tiny.en, base (default), base.en, small, small.en")
    wd.add_argument("-q", "--quiet", action="store_true")
    wd.set_defaults(func=_cmd_whisper_download)

    g = sub.add_parser("gui", help="open the desktop app (also what `vocable` alone does)")
    g.add_argument("--selftest", nargs=2, metavar=("MODEL", "REF_AUDIO"),
                   help="open the window, clone REF_AUDIO's voice with MODEL through the same code path as a "
                        "click, save the result and exit (0: it worked); MODEL 'installed': the model the app "
                        "finds at start")
    g.add_argument("--out", help="where --selftest saves the speech (default: vocable-selftest.wav)")
    g.add_argument("--text", help="what --selftest says")
    g.set_defaults(func=_cmd_gui)

    a = sub.add_parser("about", help="versions, the model's license and the licenses of every bundled component")
    a.add_argument("--licenses", action="store_true", help="print every license text too")
    a.add_argument("--model", help="a converted .gguf model (default: the one the app uses)")
    a.set_defaults(func=_cmd_about)

    b = sub.add_parser("bench", help="time the engine against the PyTorch reference on random real-size weights")
    b.add_argument("--threads", type=_whole_number(1), default=2)
    b.add_argument("--device", default="cpu", help="where the engine runs: cpu (default), auto, or a device id "
                   "that `vocable about` lists (vulkan:0); a software driver such as lavapipe times correctness, not speed")
    b.add_argument("--ref-seconds", type=float, default=10.0)
    b.add_argument("--repeats", type=_whole_number(1), default=3)
    b.add_argument("--cache-dir", help="where the random real-size model is kept")
    b.add_argument("--frames", type=_whole_number(1), default=50, help="frames to generate per weight type (80 ms each)")
    b.add_argument("--types", default="f32,f16,q8_0,q4_k", help="comma-separated weight types to time generation for")
    b.add_argument("--model", help="bench this model instead (an HF folder, or a .gguf: no reference then)")
    b.add_argument("--batch", type=_batch_width, default=FILE_BATCH,
                   help=f"segments side by side in the long-text run (default {FILE_BATCH})")
    b.add_argument("--no-long-text", action="store_true", help="skip the long-text run (10 segments, one by one "
                   "and in a batch)")
    b.add_argument("--no-reference", action="store_true", help="skip the PyTorch side")
    b.add_argument("--background-load", type=_whole_number(0), default=0, metavar="N",
                   help="also time synthesis beside N busy processes (each spins one core)")
    b.add_argument("--background-engines", type=_whole_number(0), default=0, metavar="N",
                   help="also time synthesis beside N other engines synthesizing at the same time")
    b.add_argument("--cpu-variants", metavar="A,B,...",
                   help="also time synthesis, and the long text --batch at a time, on each of these ggml CPU "
                        "variants (e.g. haswell,alderlake,zen4: AVX2, AVX2 with AVX-VNNI, AVX512), each in its own "
                        "process, with speed-ups over the first")
    b.set_defaults(func=_cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command not in (None, "gui"):  # the app logs into its log folder (gui/app.py)
        logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    if not args.command:
        args.func = _cmd_gui  # `vocable` alone opens the window
    try:
        return args.func(args)
    except VocableError as e:
        print(f"vocable: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("vocable: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
