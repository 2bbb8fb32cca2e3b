"""Command line: `vocable <command>`; run `vocable --help` for the list."""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from .errors import VocableError


def _cmd_convert(args) -> int:
    from .convert import ConversionError, convert, print_progress

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


def _cmd_embed(args) -> int:
    from .audio_io import read_audio
    from .engine import Engine

    samples, rate = read_audio(args.ref)
    with Engine(args.model, threads=args.threads, dump_dir=args.dump_dir) as engine:
        voice = engine.embed_voice(samples, rate, ref_text=args.ref_text, name=args.name or Path(args.ref).stem)
    for w in voice.warnings:
        print(f"warning: {w}", file=sys.stderr)
    voice.save(args.out)
    mode = "in-context (transcript given)" if voice.ref_text else "x-vector only (no transcript)"
    print(f"voice '{voice.name}': {voice.reference_seconds:.2f} s reference, embedding {voice.speaker_embedding.shape[0]}, "
          f"{voice.codes.shape[0]} code frames; clones {mode} -> {args.out}", file=sys.stderr)
    return 0


def _cmd_bench(args) -> int:
    from .bench import run_bench
    return run_bench(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vocable", description="Local voice cloning with Qwen3-TTS 12 Hz.")
    p.add_argument("-v", "--verbose", action="store_true", help="log engine details ([Perf] lines)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    c = sub.add_parser("convert", help="convert a Hugging Face Qwen3-TTS 12 Hz Base folder to the engine's GGUF")
    c.add_argument("hf_model_dir")
    c.add_argument("out", help="output .gguf file (or a folder)")
    c.add_argument("--type", choices=["f32", "f16", "q8_0", "q4_k"], default="f16", help="matrix weight type")
    c.add_argument("-q", "--quiet", action="store_true")
    c.set_defaults(func=_cmd_convert)

    e = sub.add_parser("embed", help="make a voice file from a reference recording")
    e.add_argument("--model", required=True, help="converted .gguf model")
    e.add_argument("--ref", required=True, help="reference audio (WAV, FLAC, OGG, MP3)")
    e.add_argument("--ref-text", help="transcript of the reference (enables in-context cloning)")
    e.add_argument("--name", help="voice name (default: the file name)")
    e.add_argument("--out", required=True, help="voice file to write")
    e.add_argument("--threads", type=int)
    e.add_argument("--dump-dir", help="write every engine stage as .npy here")
    e.set_defaults(func=_cmd_embed)

    b = sub.add_parser("bench", help="time the engine against the PyTorch reference on random real-size weights")
    b.add_argument("--threads", type=int, default=2)
    b.add_argument("--ref-seconds", type=float, default=10.0)
    b.add_argument("--repeats", type=int, default=3)
    b.add_argument("--cache-dir", help="where the random real-size model is kept")
    b.add_argument("--frames", type=int, default=50, help="frames to generate per weight type (80 ms each)")
    b.add_argument("--types", default="f32,f16,q8_0,q4_k", help="comma-separated weight types to time generation for")
    b.add_argument("--model", help="bench this model instead (an HF folder, or a .gguf: no reference then)")
    b.add_argument("--no-reference", action="store_true", help="skip the PyTorch side")
    b.set_defaults(func=_cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    if not args.command:
        parser.print_help()
        return 0
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
