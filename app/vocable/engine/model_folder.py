"""A downloaded Hugging Face Qwen3-TTS 12 Hz Base folder, read and checked before conversion:
its configurations (with the defaults transformers fills in), its tokenizer files and the
license its model card declares. Everything in it is untrusted input.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConversionError
from ..untrusted import parse_json

# transformers' MimiConfig defaults (kyutai/mimi geometry), used for keys a config leaves out.
_MIMI_DEFAULTS = dict(
    sampling_rate=24000, frame_rate=12.5, hidden_size=512, num_filters=64, num_residual_layers=1,
    upsampling_ratios=[8, 6, 5, 4], kernel_size=7, last_kernel_size=3, residual_kernel_size=3,
    dilation_growth_rate=2, compress=2, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8,
    head_dim=None, intermediate_size=2048, norm_eps=1e-5, rope_theta=10000.0, sliding_window=250,
    codebook_size=2048, codebook_dim=256, num_semantic_quantizers=1, pad_mode="constant")
# Qwen3TTSSpeakerEncoderConfig defaults.
_SPEAKER_DEFAULTS = dict(mel_dim=128, enc_dim=1024, enc_channels=[512, 512, 512, 512, 1536],
                         enc_kernel_sizes=[5, 3, 3, 3, 1], enc_dilations=[1, 2, 3, 4, 1],
                         enc_attention_channels=128, enc_res2net_scale=8, enc_se_channels=128, sample_rate=24000)
MODEL_CARD_BYTES = 64 << 10   # a model card's front matter is within its first lines


def _read_json(path: Path) -> dict:
    """A JSON object from the model folder; ConversionError for anything else."""
    if not path.is_file():
        raise ConversionError(f"{path} is missing: is this a downloaded Qwen3-TTS model folder?")
    try:
        value = parse_json(path.read_bytes())
    except (OSError, ValueError) as e:
        raise ConversionError(f"{path} is unreadable or not valid JSON: {e}") from e
    if not isinstance(value, dict):
        raise ConversionError(f"{path} is not a model configuration (not a JSON object)")
    return value


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise ConversionError(f"{path} is missing: the text tokenizer files are part of the model folder")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConversionError(f"{path} is not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise ConversionError(f"cannot read {path}: {e.strerror or e}") from e


@dataclass
class ModelFolder:
    root: Path
    config: dict
    speech_config: dict
    generation_config: dict
    tokenizer_files: dict[str, str]
    license: str | None = None   # what the model card declares

    @property
    def talker(self) -> dict:
        return self.config["talker_config"]

    @property
    def predictor(self) -> dict:
        return self.talker["code_predictor_config"]

    @property
    def encoder(self) -> dict:
        enc = self.speech_config.get("encoder_config")
        return {**_MIMI_DEFAULTS, **(enc if isinstance(enc, dict) else {})}

    @property
    def decoder(self) -> dict:
        return self.speech_config["decoder_config"]

    @property
    def speaker(self) -> dict:
        return {**_SPEAKER_DEFAULTS, **self.config.get("speaker_encoder_config", {})}


def read_model_folder(root: Path) -> ModelFolder:
    root = Path(root)
    if not root.is_dir():
        raise ConversionError(f"{root} is not a folder")
    config = _read_json(root / "config.json")
    if config.get("tts_model_type") != "base":
        kind = config.get("tts_model_type") or config.get("model_type") or "unknown"
        raise ConversionError(f"{root} holds a '{kind}' model; Vocable needs a Qwen3-TTS 12 Hz *Base* model "
                              "(Qwen/Qwen3-TTS-12Hz-0.6B-Base or -1.7B-Base)")
    if config.get("tokenizer_type") != "qwen3_tts_tokenizer_12hz":
        raise ConversionError(f"{root} uses the '{config.get('tokenizer_type')}' speech tokenizer; "
                              "only the 12 Hz tokenizer is supported")
    speech_config = _read_json(root / "speech_tokenizer" / "config.json")
    generation_config = _read_json(root / "generation_config.json") if (root / "generation_config.json").exists() else {}
    tokenizer_files = {name: _read_text(root / name)
                       for name in ("vocab.json", "merges.txt", "tokenizer_config.json")}
    folder = ModelFolder(root, config, speech_config, generation_config, tokenizer_files,
                         model_card_license(root / "README.md"))
    try:
        malformed = not all(isinstance(section, dict) for section in (folder.talker, folder.predictor, folder.decoder))
    except KeyError as e:
        raise ConversionError(f"{root}/config.json lacks {e}: not a Qwen3-TTS 12 Hz Base config") from e
    except TypeError:  # the talker section is not an object, so the predictor's cannot be looked up in it
        malformed = True
    if malformed:
        raise ConversionError(f"{root}/config.json has a malformed talker, code predictor or decoder section: "
                              "not a Qwen3-TTS 12 Hz Base config")
    return folder


def model_card_license(readme: Path) -> str | None:
    """The license a Hugging Face model card declares in its front matter (`license: apache-2.0`;
    for `other`, its `license_name`), or None without a card or a declaration. Only a regular
    file's first 64 KiB are read: a FIFO or a device in its place would block or never end."""
    try:
        if not readme.is_file():
            return None
        with open(readme, "rb") as f:
            text = f.read(MODEL_CARD_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return None
    front = re.match(r"---\s*\n(.*?)\n---\s*(\n|$)", text, re.DOTALL)
    if not front:
        return None
    fields = dict(re.findall(r"^(license(?:_name)?):[ \t]*['\"]?([^'\"\n]*?)['\"]?[ \t]*$", front[1], re.MULTILINE))
    declared = fields.get("license") or None
    if declared == "other" and fields.get("license_name"):
        return fields["license_name"]
    return declared
