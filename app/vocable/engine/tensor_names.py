"""The engine's name for each tensor of a Hugging Face Qwen3-TTS checkpoint (the names
native/src/gguf-names.h expects), its kind (how the converter lays it out), and the tensors the
engine does not use.
"""
from __future__ import annotations

import re

from ..errors import ConversionError

_LAYER_RULES = [  # transformer sub-module names shared by talker, code predictor and codecs
    (r"self_attn\.(q|k|v|o)_proj\.", r"attn_\1."),
    (r"self_attn\.(q|k)_norm\.", r"attn_\1_norm."),
    (r"mlp\.gate_proj\.", "ffn_gate."), (r"mlp\.up_proj\.", "ffn_up."), (r"mlp\.down_proj\.", "ffn_down."),
    (r"mlp\.fc1\.", "ffn_up."), (r"mlp\.fc2\.", "ffn_down."),
    (r"input_layernorm\.", "attn_norm."), (r"post_attention_layernorm\.", "ffn_norm."),
    (r"self_attn_layer_scale\.scale$", "attn_scale"), (r"mlp_layer_scale\.scale$", "ffn_scale"),
]

# (HF pattern, engine name, kind); kind: "linear", "conv", "tconv" (ConvTranspose1d),
# "codebook" (embedding_sum / cluster_usage), "vector", "embedding".
_RULES: list[tuple[str, str, str]] = [
    # speaker encoder
    (r"speaker_encoder\.blocks\.0\.conv\.(weight|bias)", r"spk.blk.0.conv.\1", "conv"),
    (r"speaker_encoder\.blocks\.(\d+)\.tdnn([12])\.conv\.(weight|bias)", r"spk.blk.\1.tdnn\2.\3", "conv"),
    (r"speaker_encoder\.blocks\.(\d+)\.res2net_block\.blocks\.(\d+)\.conv\.(weight|bias)", r"spk.blk.\1.res2net.\2.\3", "conv"),
    (r"speaker_encoder\.blocks\.(\d+)\.se_block\.conv([12])\.(weight|bias)", r"spk.blk.\1.se\2.\3", "conv"),
    (r"speaker_encoder\.mfa\.conv\.(weight|bias)", r"spk.mfa.\1", "conv"),
    (r"speaker_encoder\.asp\.tdnn\.conv\.(weight|bias)", r"spk.asp.tdnn.\1", "conv"),
    (r"speaker_encoder\.asp\.conv\.(weight|bias)", r"spk.asp.conv.\1", "conv"),
    (r"speaker_encoder\.fc\.(weight|bias)", r"spk.fc.\1", "conv"),
    # talker
    (r"talker\.model\.layers\.(\d+)\.(.+)", r"talker.blk.\1.\2", "layer"),
    (r"talker\.model\.norm\.weight", "talker.output_norm.weight", "vector"),
    (r"talker\.model\.codec_embedding\.weight", "talker.codec_embd.weight", "embedding"),
    (r"talker\.model\.text_embedding\.weight", "talker.text_embd.weight", "embedding"),
    (r"talker\.text_projection\.linear_fc([12])\.(weight|bias)", r"talker.text_proj\1.\2", "linear"),
    (r"talker\.codec_head\.weight", "talker.codec_head.weight", "linear"),
    # code predictor
    (r"talker\.code_predictor\.model\.layers\.(\d+)\.(.+)", r"cp.blk.\1.\2", "layer"),
    (r"talker\.code_predictor\.model\.norm\.weight", "cp.output_norm.weight", "vector"),
    (r"talker\.code_predictor\.model\.codec_embedding\.(\d+)\.weight", r"cp.codec_embd.\1.weight", "embedding"),
    (r"talker\.code_predictor\.lm_head\.(\d+)\.weight", r"cp.head.\1.weight", "linear"),
    (r"talker\.code_predictor\.small_to_mtp_projection\.(weight|bias)", r"cp.in_proj.\1", "linear"),
    # 12 Hz codec encoder (Mimi)
    (r"encoder\.encoder\.layers\.(\d+)\.conv\.(weight|bias)", r"cenc.seanet.\1.\2", "conv"),
    (r"encoder\.encoder\.layers\.(\d+)\.block\.(\d+)\.conv\.(weight|bias)", r"cenc.seanet.\1.block\2.\3", "conv"),
    (r"encoder\.encoder_transformer\.layers\.(\d+)\.(.+)", r"cenc.blk.\1.\2", "layer"),
    (r"encoder\.downsample\.conv\.weight", "cenc.downsample.weight", "conv"),
    (r"encoder\.quantizer\.semantic_residual_vector_quantizer\.input_proj\.weight", "cenc.rvq_sem.in_proj.weight", "conv"),
    (r"encoder\.quantizer\.acoustic_residual_vector_quantizer\.input_proj\.weight", "cenc.rvq_ac.in_proj.weight", "conv"),
    (r"encoder\.quantizer\.semantic_residual_vector_quantizer\.layers\.(\d+)\.codebook\.embed_sum", r"cenc.rvq_sem.codebook.\1", "codebook"),
    (r"encoder\.quantizer\.acoustic_residual_vector_quantizer\.layers\.(\d+)\.codebook\.embed_sum", r"cenc.rvq_ac.codebook.\1", "codebook"),
    # 12 Hz codec decoder
    (r"decoder\.quantizer\.(rvq_first|rvq_rest)\.vq\.layers\.(\d+)\._codebook\.embedding_sum", r"cdec.\1.codebook.\2", "codebook"),
    (r"decoder\.quantizer\.(rvq_first|rvq_rest)\.output_proj\.weight", r"cdec.\1.out_proj.weight", "conv"),
    (r"decoder\.pre_conv\.conv\.(weight|bias)", r"cdec.pre_conv.\1", "conv"),
    (r"decoder\.pre_transformer\.input_proj\.(weight|bias)", r"cdec.tf_in.\1", "linear"),
    (r"decoder\.pre_transformer\.output_proj\.(weight|bias)", r"cdec.tf_out.\1", "linear"),
    (r"decoder\.pre_transformer\.norm\.weight", "cdec.tf_norm.weight", "vector"),
    (r"decoder\.pre_transformer\.layers\.(\d+)\.(.+)", r"cdec.blk.\1.\2", "layer"),
    (r"decoder\.upsample\.(\d+)\.0\.conv\.(weight|bias)", r"cdec.up.\1.tconv.\2", "tconv"),
    (r"decoder\.upsample\.(\d+)\.1\.dwconv\.conv\.(weight|bias)", r"cdec.up.\1.dwconv.\2", "conv"),
    (r"decoder\.upsample\.(\d+)\.1\.norm\.(weight|bias)", r"cdec.up.\1.norm.\2", "vector"),
    (r"decoder\.upsample\.(\d+)\.1\.gamma", r"cdec.up.\1.gamma", "vector"),
    (r"decoder\.upsample\.(\d+)\.1\.pwconv([12])\.(weight|bias)", r"cdec.up.\1.pw\2.\3", "linear"),
    (r"decoder\.decoder\.(\d+)\.conv\.(weight|bias)", r"cdec.dec.\1.conv.\2", "conv"),
    (r"decoder\.decoder\.(\d+)\.(alpha|beta)", r"cdec.dec.\1.snake.\2", "vector"),
    (r"decoder\.decoder\.(\d+)\.block\.0\.(alpha|beta)", r"cdec.dec.\1.snake.\2", "vector"),
    (r"decoder\.decoder\.(\d+)\.block\.1\.conv\.(weight|bias)", r"cdec.dec.\1.tconv.\2", "tconv"),
    (r"decoder\.decoder\.(\d+)\.block\.([234])\.act([12])\.(alpha|beta)", r"cdec.dec.\1.res\2.snake\3.\4", "vector"),
    (r"decoder\.decoder\.(\d+)\.block\.([234])\.conv([12])\.conv\.(weight|bias)", r"cdec.dec.\1.res\2.conv\3.\4", "conv"),
]
_COMPILED = [(re.compile(p + "$"), r, k) for p, r, k in _RULES]
# Tensors that inference never reads.
_SKIPPED = re.compile(r"(.*\.initialized$|.*\.cluster_usage$|encoder\.quantizer\..*\.output_proj\.weight$"
                      r"|decoder\.quantizer\..*\.input_proj\.weight$)")


def engine_name(hf_name: str) -> tuple[str, str] | None:
    """(engine tensor name, kind) for a checkpoint tensor; None when inference does not use it."""
    if _SKIPPED.match(hf_name):
        return None
    for pattern, repl, kind in _COMPILED:
        m = pattern.match(hf_name)
        if m:
            name = m.expand(repl)
            if kind == "layer":
                head, _, rest = name.partition(".blk.")
                layer, _, sub = rest.partition(".")
                for p, r in _LAYER_RULES:
                    sub = re.sub(p, r, sub)
                name = f"{head}.blk.{layer}.{sub}"
                kind = "vector" if hf_name.endswith(("norm.weight", "norm.bias", ".scale")) else "linear"
            return name, kind
    raise ConversionError(f"unexpected tensor {hf_name!r}: not a Qwen3-TTS 12 Hz Base checkpoint")

