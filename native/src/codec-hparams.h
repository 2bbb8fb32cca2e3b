// What the 12 Hz codec's encoder and decoder share: the audio framing, the codebooks and the
// geometry of their Mimi transformer (RoPE attention with GQA), read under each one's key prefix.
#pragma once

#include "model-loader.h"

#include <string>

namespace qt {

struct codec_hparams {
    int   sample_rate = 0;
    int   frame_samples = 0;   // audio samples per 12.5 Hz frame
    int   codebook_size = 0;
    int   codebook_dim = 0;
    int   hidden = 0;          // transformer
    int   ffn = 0;
    int   layers = 0;          // 0: no transformer, a well-defined codec
    int   heads = 0;
    int   kv_heads = 0;
    int   head_dim = 0;
    int   sliding_window = 0;  // frames attended to, the current one included
    float norm_eps = 0.0f;
    float rope_theta = 0.0f;
};

// The keys `prefix` + QT_KEY_MIMI_* (QT_CODEC_ENCODER, QT_CODEC_DECODER; gguf-names.h) and the
// norm epsilon's `norm_eps_key`, checked for what both graphs assume (query heads a multiple of
// the KV heads); the error names the part as `what`.
codec_hparams read_codec_hparams(const model_loader & loader, const std::string & prefix, const char * norm_eps_key,
                                 const char * what);

} // namespace qt
