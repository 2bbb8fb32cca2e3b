// A Qwen3 decoder stack, the talker's and the code predictor's alike: its hyperparameters and
// the tensors of each layer (RMSNorm, attention with per-head q/k RMSNorm, GQA, SwiGLU, no
// biases), read from the GGUF with shape checks.
#pragma once

#include "model-loader.h"
#include "interleaved-rows.h"

#include <cstddef>
#include <string>
#include <vector>

namespace qt {

// What every Qwen3 decoder stack has; talker_hparams and code_predictor_hparams add their own.
struct qwen3_hparams {
    int   hidden = 0;
    int   ffn = 0;
    int   layers = 0;
    int   heads = 0;
    int   kv_heads = 0;
    int   head_dim = 0;
    float norm_eps = 1e-6f;
    float rope_theta = 0.0f;
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

// The stack's hyperparameters from the keys `key_prefix` + QT_KEY_STACK_* (gguf-names.h), checked
// for the geometry the graphs assume (query heads a multiple of the KV heads, an even head_dim
// for RoPE); the error names the stack as `what` ("talker", "code predictor").
qwen3_hparams read_qwen3_hparams(const model_loader & loader, const std::string & key_prefix, const char * what);

// The stack's layers: tensors `tensor_prefix` + "blk.<i>." + "attn_q.weight", ... ("talker.",
// "cp."), each checked against the shape the hyperparameters give; the matrices `interleaved`
// takes are its stand-ins (commit it after loading).
std::vector<qwen3_layer> load_qwen3_layers(model_loader & loader, const std::string & tensor_prefix,
                                           const qwen3_hparams & hp, interleaved_weights & interleaved);

// Bytes of the layers' weights: what one pass over the stack reads.
size_t qwen3_layers_bytes(const std::vector<qwen3_layer> & layers);

} // namespace qt
