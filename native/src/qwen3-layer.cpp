#include "qwen3-layer.h"

#include "gguf-names.h"
#include "log.h"

namespace qt {

qwen3_hparams read_qwen3_hparams(const model_loader & ml, const std::string & key_prefix, const char * what) {
    auto size = [&](const char * key) { return ml.get_size((key_prefix + key).c_str()); };
    qwen3_hparams hp;
    hp.hidden = size(QT_KEY_STACK_HIDDEN);
    hp.ffn = size(QT_KEY_STACK_FFN);
    hp.layers = size(QT_KEY_STACK_LAYERS);
    hp.heads = size(QT_KEY_STACK_HEADS);
    hp.kv_heads = size(QT_KEY_STACK_KV_HEADS);
    hp.head_dim = size(QT_KEY_STACK_HEAD_DIM);
    hp.norm_eps = ml.get_f32((key_prefix + QT_KEY_STACK_NORM_EPS).c_str());
    hp.rope_theta = ml.get_f32((key_prefix + QT_KEY_STACK_ROPE_THETA).c_str());
    if (hp.heads % hp.kv_heads != 0 || hp.head_dim % 2 != 0 || hp.norm_eps <= 0.0f || hp.rope_theta <= 0.0f) {
        throw error(QT_STATUS_INVALID_PARAMS,
                    format("%s: unsupported %s geometry (hidden %d, ffn %d, %d layers, %d/%d heads of %d, "
                           "norm eps %g, rope theta %g)",
                           ml.path().c_str(), what, hp.hidden, hp.ffn, hp.layers, hp.heads, hp.kv_heads, hp.head_dim,
                           double(hp.norm_eps), double(hp.rope_theta)));
    }
    return hp;
}

namespace {

qwen3_layer load_layer(model_loader & ml, const std::string & p, const qwen3_hparams & hp,
                       interleaved_weights & interleaved) {
    const int64_t H = hp.hidden;
    const int64_t q_dim = int64_t(hp.heads) * hp.head_dim;
    const int64_t kv_dim = int64_t(hp.kv_heads) * hp.head_dim;
    qwen3_layer l;
    l.attn_norm = ml.require(p + "attn_norm.weight", { H });
    l.q = ml.require(p + "attn_q.weight", { H, q_dim });
    l.k = ml.require(p + "attn_k.weight", { H, kv_dim });
    l.v = ml.require(p + "attn_v.weight", { H, kv_dim });
    l.o = ml.require(p + "attn_o.weight", { q_dim, H });
    l.q_norm = ml.require(p + "attn_q_norm.weight", { hp.head_dim });
    l.k_norm = ml.require(p + "attn_k_norm.weight", { hp.head_dim });
    l.ffn_norm = ml.require(p + "ffn_norm.weight", { H });
    l.gate = ml.require(p + "ffn_gate.weight", { H, hp.ffn });
    l.up = ml.require(p + "ffn_up.weight", { H, hp.ffn });
    l.down = ml.require(p + "ffn_down.weight", { hp.ffn, H });
    for (ggml_tensor ** w : { &l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down }) {
        *w = interleaved.adopt(ml, *w);
    }
    return l;
}

} // namespace

std::vector<qwen3_layer> load_qwen3_layers(model_loader & ml, const std::string & tensor_prefix,
                                           const qwen3_hparams & hp, interleaved_weights & interleaved) {
    std::vector<qwen3_layer> layers;
    layers.reserve(size_t(hp.layers));
    for (int i = 0; i < hp.layers; ++i) {
        layers.push_back(load_layer(ml, tensor_prefix + "blk." + std::to_string(i) + ".", hp, interleaved));
    }
    return layers;
}

size_t qwen3_layers_bytes(const std::vector<qwen3_layer> & layers) {
    size_t n = 0;
    for (const qwen3_layer & l : layers) {
        for (const ggml_tensor * t : { l.attn_norm, l.q, l.k, l.v, l.o, l.q_norm, l.k_norm, l.ffn_norm, l.gate, l.up,
                                       l.down }) {
            n += ggml_nbytes(t);
        }
    }
    return n;
}

} // namespace qt
