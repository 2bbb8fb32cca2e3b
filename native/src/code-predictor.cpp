#include "code-predictor.h"

#include "gguf-names.h"
#include "log.h"
#include "sampler.h"

#include "ggml-alloc.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

namespace qt {

namespace {

constexpr float k_neg_inf = -std::numeric_limits<float>::infinity();

ggml_tensor * rms_norm(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, float eps) {
    return ggml_mul(ctx, ggml_rms_norm(ctx, x, eps), w);
}

} // namespace

// ---- sampling --------------------------------------------------------------------------------

// Mirrors sample_warped step by step; where that function works on the whole vocabulary, this
// one works on the tokens top-k keeps (the others have probability exactly 0 there, and adding
// 0.0 to a double sum changes nothing, so every sum and comparison comes out the same).
int32_t cp_sample_row(const float * logits, int32_t n_vocab, float temperature, int32_t top_k, float top_p, float u) {
    if (temperature <= 0.0f) {
        return argmax(logits, n_vocab);
    }
    thread_local std::vector<float>   scaled;
    thread_local std::vector<float>   sorted;
    thread_local std::vector<int32_t> kept;
    thread_local std::vector<double>  p;
    scaled.assign(logits, logits + n_vocab);
    if (temperature != 1.0f) {
        for (float & l : scaled) {
            l /= temperature;
        }
    }
    float kth = k_neg_inf;
    if (top_k > 0 && top_k < n_vocab) {
        sorted = scaled;
        std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<float>());
        kth = sorted[size_t(top_k - 1)];
    }
    kept.clear();
    float max_logit = k_neg_inf;
    for (int32_t i = 0; i < n_vocab; ++i) {
        if (scaled[size_t(i)] >= kth && scaled[size_t(i)] != k_neg_inf) {
            kept.push_back(i);
            max_logit = std::max(max_logit, scaled[size_t(i)]);
        }
    }
    if (kept.empty()) {
        return argmax(scaled.data(), n_vocab);  // every logit is -inf
    }
    const size_t n = kept.size();
    p.resize(n);
    double total = 0.0;
    for (size_t r = 0; r < n; ++r) {
        p[r] = std::exp(double(scaled[size_t(kept[r])]) - double(max_logit));
        total += p[r];
    }
    if (top_p < 1.0f) {
        // ascending by probability, ids breaking ties; `order` holds positions in `kept`, whose
        // ids ascend, so comparing positions compares ids
        thread_local std::vector<int32_t> order;
        order.resize(n);
        for (size_t r = 0; r < n; ++r) {
            order[r] = int32_t(r);
        }
        std::sort(order.begin(), order.end(),
                  [&](int32_t a, int32_t b) { return p[size_t(a)] != p[size_t(b)] ? p[size_t(a)] < p[size_t(b)] : a < b; });
        double cum = 0.0;
        const double drop_below = 1.0 - double(top_p);
        for (size_t r = 0; r + 1 < n; ++r) {  // the most probable token always stays
            const size_t i = size_t(order[r]);
            cum += p[i] / total;
            if (cum <= drop_below) {
                p[i] = 0.0;
            } else {
                break;
            }
        }
        total = 0.0;
        for (double v : p) {
            total += v;
        }
    }
    const double target = double(u) * total;
    double cum = 0.0;
    int32_t last = -1;
    for (size_t r = 0; r < n; ++r) {
        if (p[r] <= 0.0) {
            continue;
        }
        cum += p[r];
        last = kept[r];
        if (cum > target) {
            return kept[r];
        }
    }
    return last;  // rounding left u * total just above the sum
}

namespace {

// ggml custom op: dst (1) i32 = the sampled id of src = { logits (vocab) f32, sampling (3) f32
// (temperature, top_k, top_p), u (1) f32, forced (1) i32 }, or `forced` when it is >= 0. One
// thread: a row is microseconds of work.
void sample_op(ggml_tensor * dst, int ith, int /*nth*/, void * /*userdata*/) {
    if (ith != 0) {
        return;
    }
    const ggml_tensor * logits = dst->src[0];
    const float *       s = static_cast<const float *>(dst->src[1]->data);
    const float         u = *static_cast<const float *>(dst->src[2]->data);
    const int32_t       forced = *static_cast<const int32_t *>(dst->src[3]->data);
    *static_cast<int32_t *>(dst->data) =
        forced >= 0 ? forced
                    : cp_sample_row(static_cast<const float *>(logits->data), int32_t(logits->ne[0]), s[0],
                                    int32_t(s[1]), s[2], u);
}

ggml_tensor * sample(ggml_context * ctx, ggml_tensor * logits, ggml_tensor * sampling, ggml_tensor * u,
                     ggml_tensor * forced) {
    GGML_ASSERT(logits->type == GGML_TYPE_F32 && ggml_is_contiguous(logits) && ggml_nrows(logits) == 1);
    ggml_tensor * args[] = { logits, sampling, u, forced };
    return ggml_custom_4d(ctx, GGML_TYPE_I32, 1, 1, 1, 1, args, 4, sample_op, 1, nullptr);
}

} // namespace

// ---- code_predictor --------------------------------------------------------------------------

void code_predictor::load(model_loader & ml, const talker & model) {
    hp_.hidden = ml.get_size(QT_KEY_CP_HIDDEN);
    hp_.ffn = ml.get_size(QT_KEY_CP_FFN);
    hp_.layers = ml.get_size(QT_KEY_CP_LAYERS);
    hp_.heads = ml.get_size(QT_KEY_CP_HEADS);
    hp_.kv_heads = ml.get_size(QT_KEY_CP_KV_HEADS);
    hp_.head_dim = ml.get_size(QT_KEY_CP_HEAD_DIM);
    hp_.norm_eps = ml.get_f32(QT_KEY_CP_NORM_EPS);
    hp_.rope_theta = ml.get_f32(QT_KEY_CP_ROPE_THETA);
    hp_.vocab = ml.get_size(QT_KEY_CP_VOCAB);
    hp_.talker_hidden = model.hparams().hidden;
    hp_.talker_vocab = model.hparams().vocab;
    hp_.n_codes = ml.get_size(QT_KEY_TALKER_CODE_GROUPS) - 1;

    const bool geometry_ok = hp_.hidden > 0 && hp_.ffn > 0 && hp_.layers > 0 && hp_.heads > 0 && hp_.kv_heads > 0 &&
                             hp_.heads % hp_.kv_heads == 0 && hp_.head_dim > 0 && hp_.head_dim % 2 == 0 &&
                             hp_.vocab > 0 && hp_.n_codes >= 1 && hp_.norm_eps > 0.0f && hp_.rope_theta > 0.0f &&
                             hp_.talker_hidden > 0;
    if (!geometry_ok) {
        throw error(QT_STATUS_INVALID_PARAMS,
                    format("%s: unsupported code predictor geometry (hidden %d, ffn %d, %d layers, %d/%d heads of %d, "
                           "%d codes)",
                           ml.path().c_str(), hp_.hidden, hp_.ffn, hp_.layers, hp_.heads, hp_.kv_heads, hp_.head_dim,
                           hp_.n_codes));
    }

    const int64_t H = hp_.hidden;
    const int64_t Ht = hp_.talker_hidden;
    layers_.clear();
    const qwen3_geometry geometry = { hp_.hidden, hp_.ffn, hp_.heads, hp_.kv_heads, hp_.head_dim };
    for (int i = 0; i < hp_.layers; ++i) {
        layers_.push_back(load_qwen3_layer(ml, "cp.blk." + std::to_string(i) + ".", geometry));
    }
    output_norm_ = ml.require("cp.output_norm.weight", { H });
    heads_.clear();
    codec_embd_.clear();
    for (int q = 0; q < hp_.n_codes; ++q) {
        heads_.push_back(ml.require("cp.head." + std::to_string(q) + ".weight", { H, hp_.vocab }));
        codec_embd_.push_back(ml.require("cp.codec_embd." + std::to_string(q) + ".weight", { Ht, hp_.vocab }));
    }
    // the reference's small_to_mtp_projection: a Linear exactly when the widths differ
    if (H != Ht) {
        in_proj_w_ = ml.require("cp.in_proj.weight", { Ht, H });
        in_proj_b_ = ml.require("cp.in_proj.bias", { H });
    } else {
        in_proj_w_ = in_proj_b_ = nullptr;
    }
    // C, the talker's codec embedding, embeds code0 in the prefill (talker.h keeps its tensor
    // private, so it is looked up by name)
    talker_codec_embd_ = ml.require("talker.codec_embd.weight", { Ht, hp_.talker_vocab });
}

size_t code_predictor::frame_weight_bytes() const {
    size_t pass = ggml_nbytes(output_norm_);
    for (const layer & l : layers_) {
        for (const ggml_tensor * t : { l.attn_norm, l.q, l.k, l.v, l.o, l.q_norm, l.k_norm, l.ffn_norm, l.gate, l.up,
                                       l.down }) {
            pass += ggml_nbytes(t);
        }
    }
    if (in_proj_w_) {
        pass += ggml_nbytes(in_proj_w_) + ggml_nbytes(in_proj_b_);
    }
    size_t n = pass * size_t(hp_.n_codes);
    for (const ggml_tensor * h : heads_) {
        n += ggml_nbytes(h);
    }
    for (const ggml_tensor * e : codec_embd_) {
        n += e->nb[1];  // one row each
    }
    return n + talker_codec_embd_->nb[1];
}

// ---- code_predictor_state --------------------------------------------------------------------

code_predictor_state::code_predictor_state(const code_predictor & model, const cpu_backend & backend,
                                           const cp_sampling & sampling)
    : model_(model), backend_(backend), sampling_(sampling) {
    const code_predictor_hparams & hp = model.hp_;
    const int64_t n_pos = hp.n_codes + 1;  // positions of a frame: h, code0, ..., code14

    const size_t n_tensors = size_t(2 * hp.layers + 9);
    state_ctx_ = new_metadata_context(n_tensors, false, "code predictor state context");
    ggml_context * sctx = state_ctx_.get();
    for (int i = 0; i < hp.layers; ++i) {
        k_rows_.push_back(ggml_new_tensor_3d(sctx, GGML_TYPE_F32, hp.head_dim, n_pos, hp.kv_heads));
        v_rows_.push_back(ggml_new_tensor_3d(sctx, GGML_TYPE_F32, hp.head_dim, n_pos, hp.kv_heads));
        ggml_format_name(k_rows_.back(), "cp_k_%d", i);
        ggml_format_name(v_rows_.back(), "cp_v_%d", i);
    }
    in_hidden_ = ggml_new_tensor_1d(sctx, GGML_TYPE_F32, hp.talker_hidden);
    in_code0_ = ggml_new_tensor_1d(sctx, GGML_TYPE_I32, 1);
    in_uniform_ = ggml_new_tensor_1d(sctx, GGML_TYPE_F32, hp.n_codes);
    in_sampling_ = ggml_new_tensor_1d(sctx, GGML_TYPE_F32, 3);
    in_forced_ = ggml_new_tensor_1d(sctx, GGML_TYPE_I32, hp.n_codes);
    c_pos_ = ggml_new_tensor_1d(sctx, GGML_TYPE_I32, n_pos);
    c_slot_ = ggml_new_tensor_1d(sctx, GGML_TYPE_I64, n_pos);
    c_mask_ = ggml_new_tensor_2d(sctx, GGML_TYPE_F16, 2, 2);
    ggml_set_name(in_hidden_, "cp_talker_hidden");
    ggml_set_name(in_code0_, "cp_code0");
    ggml_set_name(in_uniform_, "cp_uniforms");
    ggml_set_name(in_sampling_, "cp_sampling");
    ggml_set_name(in_forced_, "cp_forced");
    ggml_set_name(c_pos_, "cp_positions");
    ggml_set_name(c_slot_, "cp_slots");
    ggml_set_name(c_mask_, "cp_prefill_mask");
    state_buf_.reset(ggml_backend_alloc_ctx_tensors(sctx, backend.get()));
    if (!state_buf_) {
        throw error(QT_STATUS_OUT_OF_MEMORY, "cannot allocate the code predictor state");
    }
    std::vector<int32_t> pos(static_cast<size_t>(n_pos));
    std::vector<int64_t> slot(static_cast<size_t>(n_pos));
    for (int64_t i = 0; i < n_pos; ++i) {
        pos[size_t(i)] = int32_t(i);
        slot[size_t(i)] = i;
    }
    ggml_backend_tensor_set(c_pos_, pos.data(), 0, ggml_nbytes(c_pos_));
    ggml_backend_tensor_set(c_slot_, slot.data(), 0, ggml_nbytes(c_slot_));
    // query 0 (h) sees key 0; query 1 (code0) sees keys 0 and 1
    const ggml_fp16_t mask[4] = { ggml_fp32_to_fp16(0.0f), ggml_fp32_to_fp16(k_neg_inf), ggml_fp32_to_fp16(0.0f),
                                  ggml_fp32_to_fp16(0.0f) };
    ggml_backend_tensor_set(c_mask_, mask, 0, sizeof(mask));
    const std::vector<int32_t> none(static_cast<size_t>(hp.n_codes), -1);
    ggml_backend_tensor_set(in_forced_, none.data(), 0, ggml_nbytes(in_forced_));
    set_sampling(sampling);
    // Only rows written earlier in the same frame are ever read, so the KV rows need no clearing.
    build_graph();
}

code_predictor_state::~code_predictor_state() = default;

void code_predictor_state::set_sampling(const cp_sampling & sampling) {
    sampling_ = sampling;
    const int32_t k = sampling.top_k > 0 && sampling.top_k < model_.hp_.vocab ? sampling.top_k : 0;
    const float s[3] = { sampling.temperature, float(k), sampling.top_p };
    ggml_backend_tensor_set(in_sampling_, s, 0, sizeof(s));
}

void code_predictor_state::build_graph() {
    const code_predictor &         m = model_;
    const code_predictor_hparams & hp = m.hp_;
    const int                      hd = hp.head_dim;
    const float                    eps = hp.norm_eps;
    const int64_t                  Ht = hp.talker_hidden;
    const size_t max_nodes = size_t(hp.n_codes) * (size_t(hp.layers) * 40 + 32) + 64;
    graph_ctx_ = new_metadata_context(max_nodes, true, "code predictor graph context");
    ggml_context * ctx = graph_ctx_.get();

    auto proj = [&](ggml_tensor * e) {
        return m.in_proj_w_ ? ggml_add(ctx, ggml_mul_mat(ctx, m.in_proj_w_, e), m.in_proj_b_) : e;
    };
    // K or V rows of T positions, (hd, kv_heads, T), to rows `slots` of `cache` (hd, n_pos,
    // kv_heads); the result is a view of the whole cache through which later reads and writes
    // are ordered after this one.
    auto store = [&](ggml_tensor * cache, ggml_tensor * rows, ggml_tensor * slots) {
        const int64_t T = rows->ne[2];
        ggml_tensor * per_head = T == 1 ? ggml_reshape_3d(ctx, rows, hd, 1, hp.kv_heads)
                                        : ggml_permute(ctx, rows, 0, 2, 1, 3);  // (hd, T, kv_heads)
        return ggml_set_rows(ctx, cache, per_head, slots);
    };

    std::vector<ggml_tensor *> kc = k_rows_;
    std::vector<ggml_tensor *> vc = v_rows_;
    out_codes_.clear();
    out_logits_.clear();

    // prefill rows: [h, C(code0)]
    ggml_tensor * c0 = ggml_get_rows(ctx, m.talker_codec_embd_, in_code0_);  // (Ht, 1)
    out_prefill_ = ggml_concat(ctx, ggml_reshape_2d(ctx, in_hidden_, Ht, 1), c0, 1);
    ggml_set_name(out_prefill_, "cp_prefill_embeds");
    ggml_set_output(out_prefill_);
    ggml_tensor * codec_sum = c0;
    ggml_tensor * x = proj(out_prefill_);
    ggml_tensor * code = nullptr;

    for (int q = 1; q <= hp.n_codes; ++q) {  // the pass that predicts code q
        const int64_t T = q == 1 ? 2 : 1;
        const int64_t p0 = q == 1 ? 0 : q;  // its first position
        const int64_t n_kv = p0 + T;
        if (q > 1) {
            ggml_tensor * e = ggml_get_rows(ctx, m.codec_embd_[size_t(q - 2)], code);  // E_{q-1}(code_{q-1})
            codec_sum = ggml_add(ctx, codec_sum, e);
            x = proj(e);
        }
        ggml_tensor * pos = ggml_view_1d(ctx, c_pos_, T, size_t(p0) * c_pos_->nb[0]);
        ggml_tensor * slots = ggml_view_1d(ctx, c_slot_, T, size_t(p0) * c_slot_->nb[0]);
        auto rope = [&](ggml_tensor * t) {
            return ggml_rope_ext(ctx, t, pos, nullptr, hd, GGML_ROPE_TYPE_NEOX, 0, hp.rope_theta, 1.0f, 0.0f, 1.0f,
                                 0.0f, 0.0f);
        };
        for (int il = 0; il < hp.layers; ++il) {
            const code_predictor::layer & l = m.layers_[size_t(il)];
            ggml_tensor * h = rms_norm(ctx, x, l.attn_norm, eps);
            ggml_tensor * qh = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, l.q, h), hd, hp.heads, T);
            ggml_tensor * kh = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, l.k, h), hd, hp.kv_heads, T);
            ggml_tensor * vh = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, l.v, h), hd, hp.kv_heads, T);
            qh = rope(rms_norm(ctx, qh, l.q_norm, eps));
            kh = rope(rms_norm(ctx, kh, l.k_norm, eps));
            kc[size_t(il)] = store(kc[size_t(il)], kh, slots);
            vc[size_t(il)] = store(vc[size_t(il)], vh, slots);
            auto rows = [&](ggml_tensor * c) {  // the first n_kv rows, (hd, n_kv, kv_heads)
                return ggml_view_3d(ctx, c, hd, n_kv, hp.kv_heads, c->nb[1], c->nb[2], 0);
            };
            ggml_tensor * a = ggml_flash_attn_ext(ctx, ggml_permute(ctx, qh, 0, 2, 1, 3), rows(kc[size_t(il)]),
                                                  rows(vc[size_t(il)]), T == 2 ? c_mask_ : nullptr,
                                                  1.0f / std::sqrt(float(hd)), 0.0f, 0.0f);  // (hd, heads, T)
            x = ggml_add(ctx, x, ggml_mul_mat(ctx, l.o, ggml_reshape_2d(ctx, a, int64_t(hd) * hp.heads, T)));
            h = rms_norm(ctx, x, l.ffn_norm, eps);
            h = ggml_swiglu_split(ctx, ggml_mul_mat(ctx, l.gate, h), ggml_mul_mat(ctx, l.up, h));
            x = ggml_add(ctx, x, ggml_mul_mat(ctx, l.down, h));
        }
        ggml_tensor * last = T == 1 ? x : ggml_view_2d(ctx, x, hp.hidden, 1, x->nb[1], size_t(T - 1) * x->nb[1]);
        ggml_tensor * logits = ggml_mul_mat(ctx, m.heads_[size_t(q - 1)], rms_norm(ctx, last, m.output_norm_, eps));
        ggml_format_name(logits, "cp_logits_%d", q);
        ggml_set_output(logits);
        out_logits_.push_back(logits);
        code = sample(ctx, logits, in_sampling_, ggml_view_1d(ctx, in_uniform_, 1, size_t(q - 1) * sizeof(float)),
                      ggml_view_1d(ctx, in_forced_, 1, size_t(q - 1) * sizeof(int32_t)));
        ggml_format_name(code, "cp_code_%d", q);
        ggml_set_output(code);
        out_codes_.push_back(code);
    }
    codec_sum = ggml_add(ctx, codec_sum, ggml_get_rows(ctx, m.codec_embd_[size_t(hp.n_codes - 1)], code));
    out_codec_ = ggml_reshape_1d(ctx, codec_sum, Ht);
    ggml_set_name(out_codec_, "cp_next_codec");
    ggml_set_output(out_codec_);

    graph_ = ggml_new_graph_custom(ctx, max_nodes, false);
    ggml_build_forward_expand(graph_, out_prefill_);
    for (size_t i = 0; i < out_codes_.size(); ++i) {
        ggml_build_forward_expand(graph_, out_logits_[i]);
        ggml_build_forward_expand(graph_, out_codes_[i]);
    }
    ggml_build_forward_expand(graph_, out_codec_);
    alloc_.reset(ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend_.get())));
    if (!alloc_ || !ggml_gallocr_alloc_graph(alloc_.get(), graph_)) {
        throw error(QT_STATUS_OUT_OF_MEMORY, "not enough memory for the code predictor graph");
    }
}

void code_predictor_state::predict(const float * talker_hidden, int32_t code0, uint64_t frame_index, int32_t * codes,
                                   float * next_codec, const stage_dumper * dump, const int32_t * forced) {
    const code_predictor_hparams & hp = model_.hp_;
    if (code0 < 0 || code0 >= hp.talker_vocab) {
        throw error(QT_STATUS_INVALID_PARAMS,
                    format("code predictor: code0 %d is out of range [0, %d)", code0, hp.talker_vocab));
    }
    if (forced) {
        for (int q = 0; q < hp.n_codes; ++q) {
            if (forced[q] < 0 || forced[q] >= hp.vocab) {
                throw error(QT_STATUS_INVALID_PARAMS,
                            format("code predictor: forced code %d of codebook %d is out of range [0, %d)", forced[q],
                                   q + 1, hp.vocab));
            }
        }
        ggml_backend_tensor_set(in_forced_, forced, 0, ggml_nbytes(in_forced_));
        forcing_ = true;
    } else if (forcing_) {
        const std::vector<int32_t> none(static_cast<size_t>(hp.n_codes), -1);
        ggml_backend_tensor_set(in_forced_, none.data(), 0, ggml_nbytes(in_forced_));
        forcing_ = false;
    }
    std::vector<float> u(static_cast<size_t>(hp.n_codes));
    for (int q = 0; q < hp.n_codes; ++q) {
        u[size_t(q)] = rng_uniform_f32(sampling_.seed, 1, frame_index * uint64_t(hp.n_codes) + uint64_t(q));
    }
    ggml_backend_tensor_set(in_hidden_, talker_hidden, 0, ggml_nbytes(in_hidden_));
    ggml_backend_tensor_set(in_code0_, &code0, 0, sizeof(code0));
    ggml_backend_tensor_set(in_uniform_, u.data(), 0, ggml_nbytes(in_uniform_));
    backend_.compute(graph_, "code predictor computation");
    for (int q = 0; q < hp.n_codes; ++q) {
        ggml_backend_tensor_get(out_codes_[size_t(q)], &codes[q], 0, sizeof(int32_t));
    }
    if (next_codec) {
        ggml_backend_tensor_get(out_codec_, next_codec, 0, ggml_nbytes(out_codec_));
    }
    if (dump && dump->enabled()) {
        dump->write("cp_step0_prefill_embeds", out_prefill_);
        const std::vector<float> logits = last_logits();
        dump->write("cp_step0_logits", logits.data(), { int64_t(hp.n_codes), int64_t(hp.vocab) });
    }
}

std::vector<float> code_predictor_state::last_logits() const {
    const size_t vocab = size_t(model_.hp_.vocab);
    std::vector<float> out(out_logits_.size() * vocab);
    for (size_t q = 0; q < out_logits_.size(); ++q) {
        ggml_backend_tensor_get(out_logits_[q], &out[q * vocab], 0, vocab * sizeof(float));
    }
    return out;
}

} // namespace qt
