// GGUF metadata keys and tensor-name conventions of the engine's model file. The converter
// (app/vocable/engine/convert.py) writes exactly these; keep the two in step (the tests convert the
// reference checkpoints and load them, and the loader checks every shape it reads).
#pragma once

#define QT_ARCH "qwen3-tts"

// format_version changes whenever the converter's output changes meaning.
#define QT_FORMAT_VERSION 2

#define QT_KEY_ARCH            "general.architecture"
#define QT_KEY_NAME            "general.name"
#define QT_KEY_FILE_TYPE       "general.file_type"
#define QT_KEY_FORMAT_VERSION  QT_ARCH ".format_version"
#define QT_KEY_MODEL_TYPE      QT_ARCH ".model_type"     // must be "base"
#define QT_KEY_MODEL_SIZE      QT_ARCH ".model_size"     // "0b6", "1b7"

// The last tensor: one u64 checksum (model-loader.h tensor_checksum) per other tensor, in
// file order, stored as int32 pairs because GGUF tensors have no u64 type.
#define QT_TENSOR_CHECKSUMS "checksums"

// Speaker encoder (ECAPA-TDNN); tensors "spk.*"
#define QT_KEY_SPK_MEL_DIM       QT_ARCH ".spk.mel_dim"
#define QT_KEY_SPK_ENC_DIM       QT_ARCH ".spk.enc_dim"
#define QT_KEY_SPK_CHANNELS      QT_ARCH ".spk.channels"
#define QT_KEY_SPK_KERNEL_SIZES  QT_ARCH ".spk.kernel_sizes"
#define QT_KEY_SPK_DILATIONS     QT_ARCH ".spk.dilations"
#define QT_KEY_SPK_ATTN_CHANNELS QT_ARCH ".spk.attention_channels"
#define QT_KEY_SPK_RES2NET_SCALE QT_ARCH ".spk.res2net_scale"
#define QT_KEY_SPK_SE_CHANNELS   QT_ARCH ".spk.se_channels"
#define QT_KEY_SPK_SAMPLE_RATE   QT_ARCH ".spk.sample_rate"

// What the 12 Hz codec's encoder and decoder share (codec-hparams.h): their prefix
// (QT_CODEC_ENCODER, QT_CODEC_DECODER) followed by these; the norm epsilon's key differs
#define QT_KEY_MIMI_SAMPLE_RATE     "sample_rate"
#define QT_KEY_MIMI_FRAME_SAMPLES   "frame_samples"
#define QT_KEY_MIMI_CODEBOOK_SIZE   "codebook_size"
#define QT_KEY_MIMI_CODEBOOK_DIM    "codebook_dim"
#define QT_KEY_MIMI_HIDDEN          "hidden_size"
#define QT_KEY_MIMI_FFN             "intermediate_size"
#define QT_KEY_MIMI_LAYERS          "num_hidden_layers"
#define QT_KEY_MIMI_HEADS           "num_attention_heads"
#define QT_KEY_MIMI_KV_HEADS        "num_key_value_heads"
#define QT_KEY_MIMI_HEAD_DIM        "head_dim"
#define QT_KEY_MIMI_SLIDING_WINDOW  "sliding_window"
#define QT_KEY_MIMI_ROPE_THETA      "rope_theta"

// 12 Hz codec encoder (Mimi encoder + split RVQ); tensors "cenc.*"
#define QT_CODEC_ENCODER               QT_ARCH ".cenc."
#define QT_KEY_CENC_NUM_FILTERS        QT_ARCH ".cenc.num_filters"
#define QT_KEY_CENC_RES_LAYERS         QT_ARCH ".cenc.num_residual_layers"
#define QT_KEY_CENC_RATIOS             QT_ARCH ".cenc.upsampling_ratios"
#define QT_KEY_CENC_KERNEL             QT_ARCH ".cenc.kernel_size"
#define QT_KEY_CENC_LAST_KERNEL        QT_ARCH ".cenc.last_kernel_size"
#define QT_KEY_CENC_RES_KERNEL         QT_ARCH ".cenc.residual_kernel_size"
#define QT_KEY_CENC_DILATION_GROWTH    QT_ARCH ".cenc.dilation_growth_rate"
#define QT_KEY_CENC_COMPRESS           QT_ARCH ".cenc.compress"
#define QT_KEY_CENC_NORM_EPS           QT_ARCH ".cenc.norm_eps"
#define QT_KEY_CENC_SEMANTIC_Q         QT_ARCH ".cenc.num_semantic_quantizers"
#define QT_KEY_CENC_VALID_Q            QT_ARCH ".cenc.valid_num_quantizers"  // codes kept (16)
#define QT_KEY_CENC_FRAME_RATE         QT_ARCH ".cenc.frame_rate"
#define QT_KEY_CENC_ENCODER_FRAME_RATE QT_ARCH ".cenc.encoder_frame_rate"  // before the downsample
#define QT_KEY_CENC_PAD_MODE           QT_ARCH ".cenc.pad_mode"             // "constant" | "replicate" | "reflect"

// A Qwen3 decoder stack's keys: its prefix (QT_STACK_TALKER, QT_STACK_CP) followed by these
#define QT_KEY_STACK_HIDDEN      "hidden_size"
#define QT_KEY_STACK_FFN         "intermediate_size"
#define QT_KEY_STACK_LAYERS      "num_hidden_layers"
#define QT_KEY_STACK_HEADS       "num_attention_heads"
#define QT_KEY_STACK_KV_HEADS    "num_key_value_heads"
#define QT_KEY_STACK_HEAD_DIM    "head_dim"
#define QT_KEY_STACK_NORM_EPS    "rms_norm_eps"
#define QT_KEY_STACK_ROPE_THETA  "rope_theta"

// Talker (Qwen3 decoder); tensors "talker.*"
#define QT_STACK_TALKER             QT_ARCH ".talker."
#define QT_KEY_TALKER_HIDDEN        QT_STACK_TALKER QT_KEY_STACK_HIDDEN
#define QT_KEY_TALKER_LAYERS        QT_STACK_TALKER QT_KEY_STACK_LAYERS
#define QT_KEY_TALKER_VOCAB         QT_ARCH ".talker.vocab_size"
#define QT_KEY_TALKER_TEXT_HIDDEN   QT_ARCH ".talker.text_hidden_size"
#define QT_KEY_TALKER_TEXT_VOCAB    QT_ARCH ".talker.text_vocab_size"
#define QT_KEY_TALKER_CODE_GROUPS   QT_ARCH ".talker.num_code_groups"
#define QT_KEY_TALKER_LANG_NAMES    QT_ARCH ".talker.language_names"
#define QT_KEY_TALKER_LANG_IDS      QT_ARCH ".talker.language_ids"
#define QT_KEY_CODEC_PAD_ID         QT_ARCH ".codec.pad_id"
#define QT_KEY_CODEC_BOS_ID         QT_ARCH ".codec.bos_id"
#define QT_KEY_CODEC_EOS_ID         QT_ARCH ".codec.eos_id"
#define QT_KEY_CODEC_THINK_ID       QT_ARCH ".codec.think_id"
#define QT_KEY_CODEC_NOTHINK_ID     QT_ARCH ".codec.nothink_id"
#define QT_KEY_CODEC_THINK_BOS_ID   QT_ARCH ".codec.think_bos_id"
#define QT_KEY_CODEC_THINK_EOS_ID   QT_ARCH ".codec.think_eos_id"
#define QT_KEY_TEXT_IM_START_ID     QT_ARCH ".text.im_start_id"
#define QT_KEY_TEXT_IM_END_ID       QT_ARCH ".text.im_end_id"
#define QT_KEY_TEXT_TTS_PAD_ID      QT_ARCH ".text.tts_pad_id"
#define QT_KEY_TEXT_TTS_BOS_ID      QT_ARCH ".text.tts_bos_id"
#define QT_KEY_TEXT_TTS_EOS_ID      QT_ARCH ".text.tts_eos_id"

// Code predictor; tensors "cp.*"
#define QT_STACK_CP           QT_ARCH ".cp."
#define QT_KEY_CP_HIDDEN      QT_STACK_CP QT_KEY_STACK_HIDDEN
#define QT_KEY_CP_LAYERS      QT_STACK_CP QT_KEY_STACK_LAYERS
#define QT_KEY_CP_VOCAB       QT_ARCH ".cp.vocab_size"

// 12 Hz codec decoder; tensors "cdec.*"
#define QT_CODEC_DECODER          QT_ARCH ".cdec."
#define QT_KEY_CDEC_LATENT_DIM    QT_ARCH ".cdec.latent_dim"
#define QT_KEY_CDEC_DECODER_DIM   QT_ARCH ".cdec.decoder_dim"
#define QT_KEY_CDEC_QUANTIZERS    QT_ARCH ".cdec.num_quantizers"
#define QT_KEY_CDEC_SEMANTIC_Q    QT_ARCH ".cdec.num_semantic_quantizers"
#define QT_KEY_CDEC_UPSAMPLE_RATES QT_ARCH ".cdec.upsample_rates"
#define QT_KEY_CDEC_UPSAMPLING_RATIOS QT_ARCH ".cdec.upsampling_ratios"
#define QT_KEY_CDEC_NORM_EPS      QT_ARCH ".cdec.rms_norm_eps"
