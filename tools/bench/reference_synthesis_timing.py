#!/usr/bin/env python3
"""Reference side of `vocable bench`, generation and synthesis stages: the official PyTorch
package (qwen-tts 0.1.1) synthesizing --frames codec frames in x-vector mode, greedy, on the
same Hugging Face model folder, text and speaker embedding as the engine, and decoding them to
audio with its speech tokenizer.

Runs the public `Qwen3TTSModel.generate_voice_clone(text, language, voice_clone_prompt=[x-vector
item], do_sample=False, subtalker_dosample=False, max_new_tokens=frames + 1)` in fp32 on the CPU
with torch.set_num_threads(--threads), timed as /work/shared/reference/bench_reference.py does:
  - a wrapper around talker.generate (HF generate: prefill + one forward per later token),
  - forward hooks on talker.model telling the prefill forward from the 1-token steps,
  - a wrapper around talker.code_predictor.generate (the 15 residual codebooks of a frame),
  - a wrapper around speech_tokenizer.decode (codes to the 24 kHz waveform, all frames at once);
  talker ms/frame = (talker.generate - prefill forward - code predictor) / frames,
  code predictor ms/frame = code predictor / frames,
  decode ms per second of audio = decode / audio seconds,
  time to first audio = the whole call (the package does not stream: its first audio is the
  end of generate and decode), synthesis ms per second of audio = the whole call / audio seconds
  (real-time factor x 1000).
max_new_tokens = frames + 1 gives exactly `frames` codec frames: every forward after the prefill
runs the code predictor for the previous token and one talker step, and the token sampled by
the last forward is discarded by the package. The model folder must have the codec_head row of
codec EOS zeroed (vocable.bench.model does) or greedy decoding may stop early.

One warm-up call, then --repeats timed calls. With --decode-codes (an .npz of int32 [frames, 16]
arrays, e.g. the engine's codes per weight type) each array is then decoded once by the same
speech tokenizer, for the waveform agreement check. Writes the generated codes (int32
[frames, 16]), their audio, the speaker embedding used and each `decoded_<name>` waveform to
--outputs (.npz) and prints ONE JSON line on stdout ("runs_ms": per-run figures of
talker_ms_per_frame, code_predictor_ms_per_frame, prefill_ms, prompt_build_ms, decode_ms,
decode_ms_per_audio_s, first_audio_ms, synthesis_ms_per_audio_s and wall_ms); everything else
goes to stderr.

Usage: python reference_synthesis_timing.py --model-dir HF_DIR --clip CLIP.npy --outputs OUT.npz
           [--speaker-embedding SPK.npy] [--decode-codes CODES.npz] [--frames 50] [--text TEXT]
           [--language English] [--threads 2] [--repeats 3]
Without --speaker-embedding the embedding is extracted from the clip by the package.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also under python -P / PYTHONSAFEPATH
from reference_model import load_reference  # noqa: E402

DEFAULT_TEXT = "The quick brown fox jumps over the lazy dog."


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True, help="Hugging Face model folder (Qwen3-TTS 12 Hz Base layout)")
    ap.add_argument("--clip", required=True, help="mono float32 24 kHz clip as .npy (for the speaker embedding)")
    ap.add_argument("--outputs", required=True, help="where to write the outputs (.npz)")
    ap.add_argument("--speaker-embedding", help="speaker embedding to use (.npy), instead of the clip's")
    ap.add_argument("--decode-codes", help="code arrays to decode for the agreement check (.npz of int32 [frames, 16])")
    ap.add_argument("--frames", type=int, default=50, help="codec frames to generate (80 ms each)")
    ap.add_argument("--text", default=DEFAULT_TEXT)
    ap.add_argument("--language", default="English")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    if args.frames < 1 or args.repeats < 1:
        sys.exit("--frames and --repeats must be at least 1")
    with load_reference(args) as reference:
        import numpy as np
        import torch
        from qwen_tts.inference.qwen3_tts_model import VoiceClonePromptItem

        tts = reference.tts
        m = tts.model
        talker = m.talker
        eos = talker.config.codec_eos_token_id
        eos_row_zero = bool(torch.all(talker.codec_head.weight[eos] == 0))

        if args.speaker_embedding:
            spk = torch.from_numpy(np.ascontiguousarray(np.load(args.speaker_embedding), dtype=np.float32))
        else:
            wav = np.ascontiguousarray(np.load(args.clip), dtype=np.float32)
            spk = m.extract_speaker_embedding(wav, 24000).float()
        spk = spk.reshape(-1)
        prompt = [VoiceClonePromptItem(ref_code=None, ref_spk_embedding=spk, x_vector_only_mode=True, icl_mode=False)]

        # ---- instrumentation (as bench_reference.py) ----------------------------------------
        rec: dict[str, list] = {}

        def add(key, value):
            rec.setdefault(key, []).append(value)

        def wrap(obj, name, key, keep_result=False):
            orig = getattr(obj, name)

            def timed(*a, **k):
                t = time.perf_counter()
                out = orig(*a, **k)
                add(key, time.perf_counter() - t)
                if keep_result:
                    add(key + "_result", out)
                return out
            setattr(obj, name, timed)

        wrap(m, "generate", "generate", keep_result=True)     # prompt building + talker.generate
        wrap(talker, "generate", "talker_generate")           # HF generate loop (prefill + steps)
        wrap(talker.code_predictor, "generate", "cp_generate")  # per frame: 15 codebooks
        decode = m.speech_tokenizer.decode                      # the package's own, for --decode-codes
        wrap(m.speech_tokenizer, "decode", "decode")            # codes to audio, after generate

        state = {}

        def pre(mod, a, kw):
            e = kw.get("inputs_embeds")
            state["t0"], state["prefill"] = time.perf_counter(), (e is not None and e.shape[1] > 1)
            if state["prefill"]:
                rec["prefill_tokens"] = [int(e.shape[1])]

        def post(mod, a, kw, out):
            add("talker_prefill" if state["prefill"] else "talker_step", time.perf_counter() - state["t0"])
        talker.model.register_forward_pre_hook(pre, with_kwargs=True)
        talker.model.register_forward_hook(post, with_kwargs=True)

        def one_call():
            rec.clear()
            t = time.perf_counter()
            wavs, rate = tts.generate_voice_clone(text=args.text, language=args.language, voice_clone_prompt=prompt,
                                                  do_sample=False, subtalker_dosample=False,
                                                  max_new_tokens=args.frames + 1)
            wall = time.perf_counter() - t
            codes = rec["generate_result"][0][0][0]
            n = int(codes.shape[0])
            wav = np.asarray(wavs[0], dtype=np.float32)
            audio_s = len(wav) / float(rate)
            s = lambda k: sum(rec.get(k, []))  # noqa: E731
            fig = {
                "talker_ms_per_frame": 1e3 * (s("talker_generate") - s("talker_prefill") - s("cp_generate")) / n,
                "code_predictor_ms_per_frame": 1e3 * s("cp_generate") / n,
                "prefill_ms": 1e3 * s("talker_prefill"),
                "prompt_build_ms": 1e3 * (s("generate") - s("talker_generate")),
                "talker_step_fwd_ms_per_frame": 1e3 * s("talker_step") / n,
                "generate_ms": 1e3 * s("generate"),
                "decode_ms": 1e3 * s("decode"),
                "decode_ms_per_audio_s": 1e3 * s("decode") / audio_s,
                "first_audio_ms": 1e3 * wall,              # no streaming: the first audio is all of it
                "synthesis_ms_per_audio_s": 1e3 * wall / audio_s,
                "wall_ms": 1e3 * wall,
            }
            info = {"frames": n, "talker_steps": len(rec.get("talker_step", [])),
                    "code_predictor_calls": len(rec.get("cp_generate", [])),
                    "decode_calls": len(rec.get("decode", [])),
                    "prefill_tokens": rec.get("prefill_tokens", [None])[0],
                    "audio_s": round(audio_s, 4), "sample_rate": int(rate), "samples": len(wav)}
            return codes.detach().cpu().numpy().astype(np.int32), wav, fig, info

        codes, wav, _, info = one_call()  # warm-up
        runs: dict[str, list[float]] = {}
        for _ in range(args.repeats):
            c, _, fig, info = one_call()
            if not np.array_equal(c, codes):
                print("[reference_synthesis_timing] warning: greedy codes differ between calls", file=sys.stderr)
            for k, v in fig.items():
                runs.setdefault(k, []).append(v)
        arrays = {"codes": codes, "audio": wav, "speaker_embedding": spk.numpy().astype(np.float32)}
        decoded = {}
        if args.decode_codes:   # the same decoder on the engine's codes, once each
            with np.load(args.decode_codes) as given:
                for name in given.files:
                    c = np.ascontiguousarray(given[name], dtype=np.int64)
                    t = time.perf_counter()
                    out, _ = decode([{"audio_codes": torch.from_numpy(c)}])
                    arrays[f"decoded_{name}"] = np.asarray(out[0], dtype=np.float32)
                    decoded[name] = {"frames": int(c.shape[0]), "samples": int(arrays[f"decoded_{name}"].size),
                                     "decode_ms": round(1e3 * (time.perf_counter() - t), 2)}
        np.savez(args.outputs, **arrays)
        reference.write_result(
            args, runs, frames_requested=args.frames, **info, reached_eos=info["frames"] < args.frames,
            codec_eos_row_zero=eos_row_zero, text=args.text, language=args.language, decoded=decoded,
            speaker_embedding_given=bool(args.speaker_embedding))


if __name__ == "__main__":
    main()
