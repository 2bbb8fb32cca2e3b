// The tensors of one Qwen3 decoder layer (talker and code predictor alike): RMSNorm, attention
// with per-head q/k RMSNorm, GQA, SwiGLU, no biases. Loaded by name prefix with shape checks.
#pragma once

#include "model-loader.h"

#include <string>

namespace qt {

struct qwen3_geometry {
    int64_t hidden = 0;
    int64_t ffn = 0;
    int64_t heads = 0;
    int64_t kv_heads = 0;
    int64_t head_dim = 0;
};

struct qwen3_layer {
    ggml_tensor * attn_norm = nullptr;
    ggml_tensor * q = nullptr;       // (hidden, heads * head_dim)
    ggml_tensor * k = nullptr;       // (hidden, kv_heads * head_dim)
    ggml_tensor * v = nullptr;
    ggml_tensor * o = nullptr;       // (heads * head_dim, hidden)
    ggml_tensor * q_norm = nullptr;  // (head_dim)
    ggml_tensor * k_norm = nullptr;
    ggml_tensor * ffn_norm = nullptr;
    ggml_tensor * gate = nullptr;    // (hidden, ffn)
    ggml_tensor * up = nullptr;
    ggml_tensor * down = nullptr;    // (ffn, hidden)
};

// `prefix` is e.g. "talker.blk.3." (the converter's names follow it with attn_q.weight, ...).
qwen3_layer load_qwen3_layer(model_loader & loader, const std::string & prefix, const qwen3_geometry & g);

} // namespace qt
