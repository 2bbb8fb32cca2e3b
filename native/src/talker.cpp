#include "talker.h"

#include "cpu-ops.h"
#include "gguf-names.h"
#include "log.h"

#include "ggml-alloc.h"

#include <cmath>
#include <cstring>
#include <string>

namespace qt {

namespace {

ggml_tensor * rms_norm(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, float eps) {
    return ggml_mul(ctx, ggml_rms_norm(ctx, x, eps), w);
}

} // namespace

void talker::load(model_loader & ml) {
    hp_.hidden = int(ml.get_u32(QT_KEY_TALKER_HIDDEN));
    hp_.ffn = int(ml.get_u32(QT_KEY_TALKER_FFN));
    hp_.layers = int(ml.get_u32(QT_KEY_TALKER_LAYERS));
    hp_.heads = int(ml.get_u32(QT_KEY_TALKER_HEADS));
    hp_.kv_heads = int(ml.get_u32(QT_KEY_TALKER_KV_HEADS));
    hp_.head_dim = int(ml.get_u32(QT_KEY_TALKER_HEAD_DIM));
    hp_.norm_eps = ml.get_f32(QT_KEY_TALKER_NORM_EPS);
    hp_.rope_theta = ml.get_f32(QT_KEY_TALKER_ROPE_THETA);
    hp_.vocab = int(ml.get_u32(QT_KEY_TALKER_VOCAB));
    hp_.text_hidden = int(ml.get_u32(QT_KEY_TALKER_TEXT_HIDDEN));
    hp_.text_vocab = int(ml.get_u32(QT_KEY_TALKER_TEXT_VOCAB));

    const bool geometry_ok = hp_.hidden > 0 && hp_.ffn > 0 && hp_.layers > 0 && hp_.heads > 0 && hp_.kv_heads > 0 &&
                             hp_.heads % hp_.kv_heads == 0 && hp_.head_dim > 0 && hp_.head_dim % 2 == 0 &&
                             hp_.vocab > 0 && hp_.text_hidden > 0 && hp_.text_vocab > 0 && hp_.norm_eps > 0.0f &&
                             hp_.rope_theta > 0.0f;
    if (!geometry_ok) {
        throw error(QT_STATUS_INVALID_PARAMS,
                    format("%s: unsupported talker geometry (hidden %d, ffn %d, %d layers, %d/%d heads of %d)",
                           ml.path().c_str(), hp_.hidden, hp_.ffn, hp_.layers, hp_.heads, hp_.kv_heads,
                           hp_.head_dim));
    }

    const int64_t H = hp_.hidden;
    const int64_t q_dim = int64_t(hp_.heads) * hp_.head_dim;
    const int64_t kv_dim = int64_t(hp_.kv_heads) * hp_.head_dim;
    layers_.clear();
    for (int i = 0; i < hp_.layers; ++i) {
        const std::string p = "talker.blk." + std::to_string(i) + ".";
        layer l;
        l.attn_norm = ml.require(p + "attn_norm.weight", { H });
        l.q = ml.require(p + "attn_q.weight", { H, q_dim });
        l.k = ml.require(p + "attn_k.weight", { H, kv_dim });
        l.v = ml.require(p + "attn_v.weight", { H, kv_dim });
        l.o = ml.require(p + "attn_o.weight", { q_dim, H });
        l.q_norm = ml.require(p + "attn_q_norm.weight", { hp_.head_dim });
        l.k_norm = ml.require(p + "attn_k_norm.weight", { hp_.head_dim });
        l.ffn_norm = ml.require(p + "ffn_norm.weight", { H });
        l.gate = ml.require(p + "ffn_gate.weight", { H, hp_.ffn });
        l.up = ml.require(p + "ffn_up.weight", { H, hp_.ffn });
        l.down = ml.require(p + "ffn_down.weight", { hp_.ffn, H });
        layers_.push_back(l);
    }
    output_norm_ = ml.require("talker.output_norm.weight", { H });
    codec_embd_ = ml.require("talker.codec_embd.weight", { H, hp_.vocab });
    text_embd_ = ml.require("talker.text_embd.weight", { hp_.text_hidden, hp_.text_vocab });
    text_proj1_w_ = ml.require("talker.text_proj1.weight", { hp_.text_hidden, hp_.text_hidden });
    text_proj1_b_ = ml.require("talker.text_proj1.bias", { hp_.text_hidden });
    text_proj2_w_ = ml.require("talker.text_proj2.weight", { hp_.text_hidden, H });
    text_proj2_b_ = ml.require("talker.text_proj2.bias", { H });
    codec_head_ = ml.require("talker.codec_head.weight", { H, hp_.vocab });
}

size_t talker::step_weight_bytes() const {
    size_t n = ggml_nbytes(output_norm_) + ggml_nbytes(codec_head_);
    for (const layer & l : layers_) {
        for (const ggml_tensor * t : { l.attn_norm, l.q, l.k, l.v, l.o, l.q_norm, l.k_norm, l.ffn_norm, l.gate, l.up,
                                       l.down }) {
            n += ggml_nbytes(t);
        }
    }
    return n;
}

namespace {

void check_ids(const int32_t * ids, int64_t n, int limit, const char * what) {
    for (int64_t i = 0; i < n; ++i) {
        if (ids[i] < 0 || ids[i] >= limit) {
            throw error(QT_STATUS_INVALID_PARAMS,
                        format("%s id %d at index %lld is out of range [0, %d)", what, ids[i], (long long) i, limit));
        }
    }
}

} // namespace

std::vector<float> talker::text_embed(const cpu_backend & backend, const int32_t * ids, int64_t n) const {
    if (n <= 0) {
        return {};
    }
    check_ids(ids, n, hp_.text_vocab, "text token");
    stage_dumper no_dump;
    graph_run run(backend, no_dump, 64);
    ggml_context * ctx = run.ctx();
    ggml_tensor * x = ggml_get_rows(ctx, text_embd_, run.input_i32("text_ids", ids, { n }));  // (text_hidden, n)
    x = ggml_silu(ctx, dense(ctx, text_proj1_w_, x, text_proj1_b_));
    x = dense(ctx, text_proj2_w_, x, text_proj2_b_);
    run.compute(x);
    return run.read_f32(x);
}

std::vector<float> talker::codec_embed(const cpu_backend & backend, const int32_t * ids, int64_t n) const {
    if (n <= 0) {
        return {};
    }
    check_ids(ids, n, hp_.vocab, "codec");
    stage_dumper no_dump;
    graph_run run(backend, no_dump, 16);
    ggml_tensor * x = ggml_get_rows(run.ctx(), codec_embd_, run.input_i32("codec_ids", ids, { n }));
    run.compute(x);
    return run.read_f32(x);
}

// Batch-1 matrix-vector products are bound by the bandwidth of reading the weight, which
// ggml_mul_mat streams once; the packed GEMM of dense() pays off over many positions.
ggml_tensor * talker::linear(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, bool batched) const {
    return batched ? dense(ctx, w, x) : ggml_mul_mat(ctx, w, x);
}

template <typename Store>
ggml_tensor * talker::layer_forward(ggml_context * ctx, ggml_tensor * x, const layer & l, ggml_tensor * pos,
                                    ggml_tensor * mask, bool batched, Store && store) const {
    const int64_t T = x->ne[1];
    const int     hd = hp_.head_dim;
    const float   eps = hp_.norm_eps;

    ggml_tensor * h = rms_norm(ctx, x, l.attn_norm, eps);
    // The reference's interleaved multimodal RoPE gets the same position in all three sections
    // (batch 1, no padding: position = cache position), which makes it plain NEOX RoPE.
    auto rope = [&](ggml_tensor * t) {
        return ggml_rope_ext(ctx, t, pos, nullptr, hd, GGML_ROPE_TYPE_NEOX, 0, hp_.rope_theta, 1.0f, 0.0f, 1.0f,
                             0.0f, 0.0f);
    };
    ggml_tensor * q = ggml_reshape_3d(ctx, linear(ctx, l.q, h, batched), hd, hp_.heads, T);
    ggml_tensor * k = ggml_reshape_3d(ctx, linear(ctx, l.k, h, batched), hd, hp_.kv_heads, T);
    ggml_tensor * v = linear(ctx, l.v, h, batched);  // (kv_heads * hd, T)
    q = rope(rms_norm(ctx, q, l.q_norm, eps));
    k = rope(rms_norm(ctx, k, l.k_norm, eps));

    auto [kc, vc] = store(ggml_reshape_2d(ctx, k, int64_t(hd) * hp_.kv_heads, T), v);  // (hd, n_kv, kv_heads)
    q = ggml_permute(ctx, q, 0, 2, 1, 3);                                               // (hd, T, heads)
    ggml_tensor * a = ggml_flash_attn_ext(ctx, q, kc, vc, mask, 1.0f / std::sqrt(float(hd)), 0.0f, 0.0f);
    a = ggml_reshape_2d(ctx, a, int64_t(hd) * hp_.heads, T);  // result is (hd, heads, T)
    x = ggml_add(ctx, x, linear(ctx, l.o, a, batched));

    h = rms_norm(ctx, x, l.ffn_norm, eps);
    h = ggml_swiglu_split(ctx, linear(ctx, l.gate, h, batched), linear(ctx, l.up, h, batched));
    return ggml_add(ctx, x, linear(ctx, l.down, h, batched));
}

// ---- talker_state ----------------------------------------------------------------------------

namespace {

// Writes rows (kv_dim, T) into `cache` (kv_dim, capacity) at the rows `slots` and returns a view
// of the first n_kv cache rows as (head_dim, n_kv, kv_heads). The view is taken of the
// ggml_set_rows result, so the graph orders the write before the read.
ggml_tensor * store_rows(ggml_context * ctx, ggml_tensor * cache, ggml_tensor * rows, ggml_tensor * slots,
                         int64_t n_kv, int head_dim) {
    ggml_tensor * written = ggml_set_rows(ctx, cache, rows, slots);
    const int64_t kv_heads = cache->ne[0] / head_dim;
    return ggml_view_3d(ctx, written, head_dim, n_kv, kv_heads, written->nb[1], size_t(head_dim) * ggml_element_size(cache),
                        0);
}

} // namespace

talker_state::talker_state(const talker & model, const cpu_backend & backend, int64_t max_positions)
    : model_(model), backend_(backend), capacity_(max_positions) {
    const talker_hparams & hp = model.hp_;
    if (max_positions <= 0) {
        throw error(QT_STATUS_INVALID_PARAMS, format("talker: KV cache of %lld positions", (long long) max_positions));
    }
    const int64_t kv_dim = int64_t(hp.kv_heads) * hp.head_dim;

    // KV cache and the step graph's inputs live in one persistent buffer: the step graph's
    // compute buffer never holds anything that must survive a step.
    const size_t n_tensors = size_t(2 * hp.layers + 4);
    ggml_init_params params = {
        /*.mem_size   =*/ ggml_tensor_overhead() * n_tensors,
        /*.mem_buffer =*/ nullptr,
        /*.no_alloc   =*/ true,
    };
    cache_ctx_.reset(ggml_init(params));
    if (!cache_ctx_) {
        throw error(QT_STATUS_OUT_OF_MEMORY, "cannot allocate the KV cache context");
    }
    ggml_context * cctx = cache_ctx_.get();
    for (int i = 0; i < hp.layers; ++i) {
        k_cache_.push_back(ggml_new_tensor_2d(cctx, GGML_TYPE_F32, kv_dim, capacity_));
        v_cache_.push_back(ggml_new_tensor_2d(cctx, GGML_TYPE_F32, kv_dim, capacity_));
        ggml_format_name(k_cache_.back(), "k_cache_%d", i);
        ggml_format_name(v_cache_.back(), "v_cache_%d", i);
    }
    in_embed_ = ggml_new_tensor_2d(cctx, GGML_TYPE_F32, hp.hidden, 1);
    in_pos_ = ggml_new_tensor_1d(cctx, GGML_TYPE_I32, 1);
    in_slot_ = ggml_new_tensor_1d(cctx, GGML_TYPE_I64, 1);
    in_mask_ = ggml_new_tensor_2d(cctx, GGML_TYPE_F16, capacity_, 1);
    ggml_set_name(in_embed_, "step_embed");
    ggml_set_name(in_pos_, "step_pos");
    ggml_set_name(in_slot_, "step_slot");
    ggml_set_name(in_mask_, "step_mask");
    cache_buf_.reset(ggml_backend_alloc_ctx_tensors(cctx, backend.get()));
    if (!cache_buf_) {
        throw error(QT_STATUS_OUT_OF_MEMORY,
                    format("cannot allocate a KV cache of %lld positions (%.1f MiB)", (long long) capacity_,
                           2.0 * hp.layers * double(kv_dim) * double(capacity_) * sizeof(float) / (1024.0 * 1024.0)));
    }
    // Cache rows past the valid length are masked, and flash attention skips masked rows, but
    // zeroed memory keeps any stray read finite.
    ggml_backend_buffer_clear(cache_buf_.get(), 0);
    std::vector<ggml_fp16_t> mask(size_t(capacity_), ggml_fp32_to_fp16(-INFINITY));
    ggml_backend_tensor_set(in_mask_, mask.data(), 0, ggml_nbytes(in_mask_));

    build_step_graph();
}

talker_state::~talker_state() = default;

void talker_state::build_step_graph() {
    const talker_hparams & hp = model_.hp_;
    const size_t max_nodes = size_t(hp.layers) * 40 + 64;
    ggml_init_params params = {
        /*.mem_size   =*/ ggml_tensor_overhead() * max_nodes + ggml_graph_overhead_custom(max_nodes, false),
        /*.mem_buffer =*/ nullptr,
        /*.no_alloc   =*/ true,
    };
    step_ctx_.reset(ggml_init(params));
    if (!step_ctx_) {
        throw error(QT_STATUS_OUT_OF_MEMORY, "cannot allocate the talker step graph context");
    }
    ggml_context * ctx = step_ctx_.get();

    ggml_tensor * x = in_embed_;
    for (int il = 0; il < hp.layers; ++il) {
        auto store = [&](ggml_tensor * k, ggml_tensor * v) {
            return std::make_pair(store_rows(ctx, k_cache_[size_t(il)], k, in_slot_, capacity_, hp.head_dim),
                                  store_rows(ctx, v_cache_[size_t(il)], v, in_slot_, capacity_, hp.head_dim));
        };
        x = model_.layer_forward(ctx, x, model_.layers_[size_t(il)], in_pos_, in_mask_, false, store);
    }
    out_hidden_ = rms_norm(ctx, x, model_.output_norm_, hp.norm_eps);
    out_logits_ = ggml_mul_mat(ctx, model_.codec_head_, out_hidden_);
    ggml_set_name(out_hidden_, "talker_hidden");
    ggml_set_name(out_logits_, "talker_logits");
    ggml_set_output(out_hidden_);
    ggml_set_output(out_logits_);

    step_graph_ = ggml_new_graph_custom(ctx, max_nodes, false);
    ggml_build_forward_expand(step_graph_, out_logits_);
    step_alloc_.reset(ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend_.get())));
    if (!step_alloc_ || !ggml_gallocr_alloc_graph(step_alloc_.get(), step_graph_)) {
        throw error(QT_STATUS_OUT_OF_MEMORY, "not enough memory for the talker step graph");
    }
}

void talker_state::prefill(const stage_dumper & dumper, const float * embeds, int64_t n, talker_output & out) {
    const talker_hparams & hp = model_.hp_;
    if (n <= 0 || n_past_ + n > capacity_) {
        throw error(QT_STATUS_INVALID_PARAMS, format("talker prefill of %lld positions at %lld exceeds the cache (%lld)",
                                                     (long long) n, (long long) n_past_, (long long) capacity_));
    }
    const int64_t n_kv = n_past_ + n;
    std::vector<int32_t> pos(static_cast<size_t>(n));
    std::vector<int32_t> slots(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
        pos[size_t(i)] = int32_t(n_past_ + i);
        slots[size_t(i)] = int32_t(n_past_ + i);
    }
    // causal mask (n_kv, n): query i (absolute position n_past + i) sees cache rows <= n_past + i
    std::vector<float> mask(size_t(n_kv * n));
    for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < n_kv; ++j) {
            mask[size_t(i * n_kv + j)] = j <= n_past_ + i ? 0.0f : -INFINITY;
        }
    }
    const bool from_start = n_past_ == 0;

    graph_run run(backend_, dumper, size_t(hp.layers) * 48 + 64);
    ggml_context * ctx = run.ctx();
    ggml_tensor * x = run.input_f32("prefill_embeds", embeds, { hp.hidden, n });
    ggml_tensor * gpos = run.input_i32("prefill_pos", pos.data(), { n });
    ggml_tensor * gslots = run.input_i32("prefill_slots", slots.data(), { n });
    ggml_tensor * gmask = ggml_cast(ctx, run.input_f32("prefill_mask", mask.data(), { n_kv, n }), GGML_TYPE_F16);
    for (int il = 0; il < hp.layers; ++il) {
        auto store = [&](ggml_tensor * k, ggml_tensor * v) {
            return std::make_pair(store_rows(ctx, k_cache_[size_t(il)], k, gslots, n_kv, hp.head_dim),
                                  store_rows(ctx, v_cache_[size_t(il)], v, gslots, n_kv, hp.head_dim));
        };
        x = model_.layer_forward(ctx, x, model_.layers_[size_t(il)], gpos, gmask, true, store);
        if (from_start) {
            x = run.stage(x, "talker_hidden_layer" + std::to_string(il));
        }
    }
    ggml_tensor * hn = rms_norm(ctx, x, model_.output_norm_, hp.norm_eps);
    if (from_start) {
        hn = run.stage(hn, "talker_hidden_norm");
    }
    ggml_tensor * last = ggml_view_2d(ctx, hn, hp.hidden, 1, hn->nb[1], size_t(n - 1) * hn->nb[1]);
    ggml_tensor * logits = ggml_mul_mat(ctx, model_.codec_head_, last);
    if (from_start) {
        logits = run.stage(ggml_reshape_1d(ctx, logits, hp.vocab), "talker_step0_logits");
    }
    // one output holding both: logits then the hidden state
    ggml_tensor * result = ggml_concat(ctx, ggml_reshape_2d(ctx, logits, hp.vocab, 1),
                                       ggml_reshape_2d(ctx, ggml_cont(ctx, last), hp.hidden, 1), 0);
    run.compute(result);
    std::vector<float> both = run.read_f32(result);
    out.logits.assign(both.begin(), both.begin() + hp.vocab);
    out.hidden.assign(both.begin() + hp.vocab, both.end());
    n_past_ = n_kv;
}

void talker_state::step(const float * embed, talker_output & out) {
    const talker_hparams & hp = model_.hp_;
    if (n_past_ >= capacity_) {
        throw error(QT_STATUS_INVALID_PARAMS,
                    format("talker step at position %lld: the KV cache holds %lld", (long long) n_past_,
                           (long long) capacity_));
    }
    const int32_t pos = int32_t(n_past_);
    const int64_t slot = n_past_;
    const ggml_fp16_t zero = ggml_fp32_to_fp16(0.0f);
    ggml_backend_tensor_set(in_embed_, embed, 0, ggml_nbytes(in_embed_));
    ggml_backend_tensor_set(in_pos_, &pos, 0, sizeof(pos));
    ggml_backend_tensor_set(in_slot_, &slot, 0, sizeof(slot));
    // rows [0, n_past] are valid now; the prefill leaves its rows masked in the step mask, so
    // unmask everything up to the new row (once per row)
    for (int64_t j = mask_valid_; j <= n_past_; ++j) {
        ggml_backend_tensor_set(in_mask_, &zero, size_t(j) * sizeof(ggml_fp16_t), sizeof(zero));
    }
    mask_valid_ = n_past_ + 1;
    if (ggml_backend_graph_compute(backend_.get(), step_graph_) != GGML_STATUS_SUCCESS) {
        throw error(QT_STATUS_FAILED, "talker step computation failed");
    }
    out.logits.resize(size_t(hp.vocab));
    out.hidden.resize(size_t(hp.hidden));
    ggml_backend_tensor_get(out_logits_, out.logits.data(), 0, out.logits.size() * sizeof(float));
    ggml_backend_tensor_get(out_hidden_, out.hidden.data(), 0, out.hidden.size() * sizeof(float));
    n_past_ += 1;
}

} // namespace qt
