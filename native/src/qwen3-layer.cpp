#include "qwen3-layer.h"

namespace qt {

qwen3_layer load_qwen3_layer(model_loader & ml, const std::string & p, const qwen3_geometry & g) {
    const int64_t H = g.hidden;
    const int64_t q_dim = g.heads * g.head_dim;
    const int64_t kv_dim = g.kv_heads * g.head_dim;
    qwen3_layer l;
    l.attn_norm = ml.require(p + "attn_norm.weight", { H });
    l.q = ml.require(p + "attn_q.weight", { H, q_dim });
    l.k = ml.require(p + "attn_k.weight", { H, kv_dim });
    l.v = ml.require(p + "attn_v.weight", { H, kv_dim });
    l.o = ml.require(p + "attn_o.weight", { q_dim, H });
    l.q_norm = ml.require(p + "attn_q_norm.weight", { g.head_dim });
    l.k_norm = ml.require(p + "attn_k_norm.weight", { g.head_dim });
    l.ffn_norm = ml.require(p + "ffn_norm.weight", { H });
    l.gate = ml.require(p + "ffn_gate.weight", { H, g.ffn });
    l.up = ml.require(p + "ffn_up.weight", { H, g.ffn });
    l.down = ml.require(p + "ffn_down.weight", { g.ffn, H });
    return l;
}

} // namespace qt
