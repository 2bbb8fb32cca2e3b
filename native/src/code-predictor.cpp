#include "code-predictor.h"

#include "gguf-names.h"
#include "log.h"
#include "mat-vecs.h"
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
    if (const int32_t best = argmax(logits, n_vocab); std::isinf(logits[best] / temperature)) {
        return best;  // as sample_warped: too cold for a float, greedy
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

// ggml custom op: dst (B) i32 = the sampled ids of src = { logits (vocab, B) f32, sampling (3, B)
// f32 (temperature, top_k, top_p), u (B) f32, forced (B) i32 }, or `forced` where it is >= 0.
// Threads split the rows: one is microseconds of work.
void sample_op(ggml_tensor * dst, int ith, int nth, void * /*userdata*/) {
    const ggml_tensor * logits = dst->src[0];
    const ggml_tensor * sampling = dst->src[1];
    const float *       u = static_cast<const float *>(dst->src[2]->data);
    const int32_t *     forced = static_cast<const int32_t *>(dst->src[3]->data);
    for (int64_t b = ith; b < dst->ne[0]; b += nth) {
        const float * s = reinterpret_cast<const float *>(static_cast<const char *>(sampling->data) + b * sampling->nb[1]);
        const float * row = reinterpret_cast<const float *>(static_cast<const char *>(logits->data) + b * logits->nb[1]);
        static_cast<int32_t *>(dst->data)[b] =
            forced[b] >= 0 ? forced[b] : cp_sample_row(row, int32_t(logits->ne[0]), s[0], int32_t(s[1]), s[2], u[b]);
    }
}

ggml_tensor * sample(ggml_context * ctx, ggml_tensor * logits, ggml_tensor * sampling, ggml_tensor * u,
                     ggml_tensor * forced) {
    GGML_ASSERT(logits->type == GGML_TYPE_F32 && ggml_is_contiguous(logits) && sampling->ne[1] == logits->ne[1] &&
                u->ne[0] == logits->ne[1] && forced->ne[0] == logits->ne[1]);
    ggml_tensor * args[] = { logits, sampling, u, forced };
    return ggml_custom_4d(ctx, GGML_TYPE_I32, logits->ne[1], 1, 1, 1, args, 4, sample_op, GGML_N_TASKS_MAX, nullptr);
}

} // namespace

// ---- code_predictor --------------------------------------------------------------------------

void code_predictor::load(model_loader & ml, const talker & model) {
    static_cast<qwen3_hparams &>(hp_) = read_qwen3_hparams(ml, QT_STACK_CP, "code predictor");
    hp_.vocab = ml.get_size(QT_KEY_CP_VOCAB);
    hp_.talker_hidden = model.hparams().hidden;
    hp_.talker_vocab = model.hparams().vocab;
    hp_.n_codes = ml.get_size(QT_KEY_TALKER_CODE_GROUPS) - 1;
    if (hp_.n_codes < 1) {
        throw error(QT_STATUS_INVALID_PARAMS, format("%s: the model has no acoustic codebooks to predict (%d code "
                                                     "groups)", ml.path().c_str(), hp_.n_codes + 1));
    }

    const int64_t H = hp_.hidden;
    const int64_t Ht = hp_.talker_hidden;
    interleaved_ = interleaved_weights();
    layers_ = load_qwen3_layers(ml, "cp.", hp_, interleaved_);
    output_norm_ = ml.require("cp.output_norm.weight", { H });
    heads_.clear();
    codec_embd_.clear();
    for (int q = 0; q < hp_.n_codes; ++q) {
        heads_.push_back(interleaved_.adopt(ml, ml.require("cp.head." + std::to_string(q) + ".weight", { H, hp_.vocab })));
        codec_embd_.push_back(ml.require_table("cp.codec_embd." + std::to_string(q) + ".weight", { Ht, hp_.vocab }));
    }
    // the reference's small_to_mtp_projection: a Linear exactly when the widths differ
    if (H != Ht) {
        in_proj_w_ = interleaved_.adopt(ml, ml.require("cp.in_proj.weight", { Ht, H }));
        in_proj_b_ = ml.require("cp.in_proj.bias", { H });
    } else {
        in_proj_w_ = in_proj_b_ = nullptr;
    }
    // C, the talker's codec embedding, embeds code0 in the prefill (talker.h keeps its tensor
    // private, so it is looked up by name)
    talker_codec_embd_ = ml.require_table("talker.codec_embd.weight", { Ht, hp_.talker_vocab });
    interleaved_.commit(ml);
}

size_t code_predictor::frame_weight_bytes() const {
    size_t pass = ggml_nbytes(output_norm_) + qwen3_layers_bytes(layers_);
    if (in_proj_w_) {
        pass += ggml_nbytes(in_proj_w_) + ggml_nbytes(in_proj_b_);
    }
    size_t n = pass * size_t(hp_.n_codes);
    for (const ggml_tensor * h : heads_) {
        n += ggml_nbytes(h);
    }
    for (const table_rows & e : codec_embd_) {
        n += e.table()->nb[1];  // one row each
    }
    return n + talker_codec_embd_.table()->nb[1];
}

// ---- code_predictor_state --------------------------------------------------------------------

code_predictor_state::code_predictor_state(const code_predictor & model, const compute_backend & backend,
                                           const cp_sampling & sampling, int max_batch)
    : model_(model), backend_(backend), sampling_(sampling), max_batch_(max_batch) {
    const code_predictor_hparams & hp = model.hp_;
    if (backend.runs_cpu_kernels()) {
        model.fill_interleaved();
    }
    if (max_batch < 1) {
        throw error(QT_STATUS_INVALID_PARAMS, format("code predictor: a batch of %d", max_batch));
    }
    const int64_t n_pos = hp.n_codes + 1;  // positions of a frame: h, code0, ..., code14
    const int64_t B = max_batch;

    const size_t n_tensors = size_t(2 * hp.layers + 7 + 2 * hp.n_codes);
    state_ctx_ = new_metadata_context(n_tensors, false, "code predictor state context");
    ggml_context * sctx = state_ctx_.get();
    for (int i = 0; i < hp.layers; ++i) {
        k_rows_.push_back(ggml_new_tensor_4d(sctx, GGML_TYPE_F32, hp.head_dim, n_pos, hp.kv_heads, B));
        v_rows_.push_back(ggml_new_tensor_4d(sctx, GGML_TYPE_F32, hp.head_dim, n_pos, hp.kv_heads, B));
        ggml_format_name(k_rows_.back(), "cp_k_%d", i);
        ggml_format_name(v_rows_.back(), "cp_v_%d", i);
    }
    in_hidden_ = ggml_new_tensor_2d(sctx, GGML_TYPE_F32, hp.talker_hidden, B);
    in_code0_ = ggml_new_tensor_1d(sctx, GGML_TYPE_I32, B);
    in_uniform_ = ggml_new_tensor_2d(sctx, GGML_TYPE_F32, B, hp.n_codes);
    in_sampling_ = ggml_new_tensor_2d(sctx, GGML_TYPE_F32, 3, B);
    in_forced_ = ggml_new_tensor_2d(sctx, GGML_TYPE_I32, B, hp.n_codes);
    for (int q = 1; q <= hp.n_codes; ++q) {
        const int64_t T = q == 1 ? 2 : 1;
        c_pass_pos_.push_back(ggml_new_tensor_1d(sctx, GGML_TYPE_I32, T * B));
        c_pass_slots_.push_back(ggml_new_tensor_1d(sctx, GGML_TYPE_I64, T));
        ggml_format_name(c_pass_pos_.back(), "cp_positions_%d", q);
        ggml_format_name(c_pass_slots_.back(), "cp_slots_%d", q);
    }
    c_mask_ = ggml_new_tensor_2d(sctx, GGML_TYPE_F16, 2, 2);
    ggml_set_name(in_hidden_, "cp_talker_hidden");
    ggml_set_name(in_code0_, "cp_code0");
    ggml_set_name(in_uniform_, "cp_uniforms");
    ggml_set_name(in_sampling_, "cp_sampling");
    ggml_set_name(in_forced_, "cp_forced");
    ggml_set_name(c_mask_, "cp_prefill_mask");
    state_buf_.reset(ggml_backend_alloc_ctx_tensors(sctx, backend.get()));
    if (!state_buf_) {
        throw error(QT_STATUS_OUT_OF_MEMORY, "cannot allocate the code predictor state");
    }
    // the positions of each pass, request after request: 0, 1 for the prefill, then q for pass q
    for (int q = 1; q <= hp.n_codes; ++q) {
        std::vector<int32_t> pos;
        std::vector<int64_t> slots;
        if (q == 1) {
            for (int64_t b = 0; b < B; ++b) {
                pos.insert(pos.end(), { 0, 1 });
            }
            slots = { 0, 1 };
        } else {
            pos.assign(size_t(B), q);
            slots = { int64_t(q) };
        }
        ggml_backend_tensor_set(c_pass_pos_[size_t(q - 1)], pos.data(), 0, pos.size() * sizeof(int32_t));
        ggml_backend_tensor_set(c_pass_slots_[size_t(q - 1)], slots.data(), 0, slots.size() * sizeof(int64_t));
    }
    // query 0 (h) sees key 0; query 1 (code0) sees keys 0 and 1
    const ggml_fp16_t mask[4] = { ggml_fp32_to_fp16(0.0f), ggml_fp32_to_fp16(k_neg_inf), ggml_fp32_to_fp16(0.0f),
                                  ggml_fp32_to_fp16(0.0f) };
    ggml_backend_tensor_set(c_mask_, mask, 0, sizeof(mask));
    const std::vector<int32_t> none(size_t(B * hp.n_codes), -1);
    ggml_backend_tensor_set(in_forced_, none.data(), 0, ggml_nbytes(in_forced_));
    // Only rows written earlier in the same frame are ever read, so the KV rows need no clearing.
    graphs_.resize(size_t(max_batch));
    graph_for(1);
}

code_predictor_state::~code_predictor_state() {
    ggml_backend_synchronize(backend_.get());  // a device may still be reading the buffers being freed
}

void code_predictor_state::set_sampling(const cp_sampling & sampling) { sampling_ = sampling; }

code_predictor_state::frame_graph & code_predictor_state::graph_for(int width) {
    std::unique_ptr<frame_graph> & slot = graphs_[size_t(width - 1)];
    if (slot) {
        return *slot;
    }
    auto fg = std::make_unique<frame_graph>();
    standard_ops_scope             standard_ops(!backend_.runs_cpu_kernels());
    const code_predictor &         m = model_;
    const code_predictor_hparams & hp = m.hp_;
    const int                      hd = hp.head_dim;
    const float                    eps = hp.norm_eps;
    const int64_t                  Ht = hp.talker_hidden;
    const int64_t                  B = width;
    const size_t max_nodes = size_t(hp.n_codes) * (size_t(hp.layers) * 44 + 32) + 64;
    fg->ctx = new_metadata_context(max_nodes, true, "code predictor graph context");
    ggml_context * ctx = fg->ctx.get();

    auto proj = [&](ggml_tensor * e) {
        return m.in_proj_w_ ? ggml_add(ctx, mat_vecs(ctx, m.in_proj_w_, e), m.in_proj_b_) : e;
    };
    // The first B requests' part of a state tensor whose last dimension is the request.
    auto requests = [&](ggml_tensor * t) {
        return ggml_view_4d(ctx, t, t->ne[0], t->ne[1], t->ne[2], B, t->nb[1], t->nb[2], t->nb[3], 0);
    };
    // B values of row r of a (max_batch, rows) input.
    auto row = [&](ggml_tensor * t, int64_t r) { return ggml_view_1d(ctx, t, B, size_t(r) * t->nb[1]); };
    // K or V rows of T positions of each request, (hd, kv_heads, T * B), to rows `slots` of
    // `cache` (hd, n_pos, kv_heads, B); the result is a view of the whole cache through which
    // later reads and writes are ordered after this one.
    auto store = [&](ggml_tensor * cache, ggml_tensor * rows, ggml_tensor * slots) {
        const int64_t T = rows->ne[2] / B;
        ggml_tensor * per_head = ggml_permute(ctx, ggml_reshape_4d(ctx, rows, hd, hp.kv_heads, T, B), 0, 2, 1, 3);
        return ggml_set_rows(ctx, cache, per_head, slots);  // per_head (hd, T, kv_heads, B)
    };

    std::vector<ggml_tensor *> kc, vc;
    for (int il = 0; il < hp.layers; ++il) {
        kc.push_back(requests(k_rows_[size_t(il)]));
        vc.push_back(requests(v_rows_[size_t(il)]));
    }

    // prefill rows of each request: [h, C(code0)]
    ggml_tensor * hidden = ggml_view_2d(ctx, in_hidden_, Ht, B, in_hidden_->nb[1], 0);
    ggml_tensor * c0 = m.talker_codec_embd_.get(ctx, ggml_view_1d(ctx, in_code0_, B, 0));  // (Ht, B)
    fg->prefill = ggml_concat(ctx, ggml_reshape_3d(ctx, hidden, Ht, 1, B), ggml_reshape_3d(ctx, c0, Ht, 1, B), 1);
    ggml_set_name(fg->prefill, "cp_prefill_embeds");
    ggml_set_output(fg->prefill);
    ggml_tensor * codec_sum = c0;
    ggml_tensor * x = proj(ggml_reshape_2d(ctx, fg->prefill, Ht, 2 * B));
    ggml_tensor * sampling = ggml_view_2d(ctx, in_sampling_, 3, B, in_sampling_->nb[1], 0);
    ggml_tensor * code = nullptr;

    for (int q = 1; q <= hp.n_codes; ++q) {  // the pass that predicts code q
        const int64_t T = q == 1 ? 2 : 1;
        const int64_t p0 = q == 1 ? 0 : q;  // its first position
        const int64_t n_kv = p0 + T;
        if (q > 1) {
            ggml_tensor * e = m.codec_embd_[size_t(q - 2)].get(ctx, code);  // E_{q-1}(code_{q-1})
            codec_sum = ggml_add(ctx, codec_sum, e);
            x = proj(e);
        }
        ggml_tensor * pos = ggml_view_1d(ctx, c_pass_pos_[size_t(q - 1)], T * B, 0);  // the first B requests'
        ggml_tensor * slots = c_pass_slots_[size_t(q - 1)];
        auto rope = [&](ggml_tensor * t) {
            return ggml_rope_ext(ctx, t, pos, nullptr, hd, GGML_ROPE_TYPE_NEOX, 0, hp.rope_theta, 1.0f, 0.0f, 1.0f,
                                 0.0f, 0.0f);
        };
        for (int il = 0; il < hp.layers; ++il) {
            const code_predictor::layer & l = m.layers_[size_t(il)];
            ggml_tensor * h = rms_norm(ctx, x, l.attn_norm, eps);
            ggml_tensor * qh = ggml_reshape_3d(ctx, mat_vecs(ctx, l.q, h), hd, hp.heads, T * B);
            ggml_tensor * kh = ggml_reshape_3d(ctx, mat_vecs(ctx, l.k, h), hd, hp.kv_heads, T * B);
            ggml_tensor * vh = ggml_reshape_3d(ctx, mat_vecs(ctx, l.v, h), hd, hp.kv_heads, T * B);
            qh = rope(rms_norm(ctx, qh, l.q_norm, eps));
            kh = rope(rms_norm(ctx, kh, l.k_norm, eps));
            kc[size_t(il)] = store(kc[size_t(il)], kh, slots);
            vc[size_t(il)] = store(vc[size_t(il)], vh, slots);
            auto rows = [&](ggml_tensor * c) {  // each request's first n_kv rows, (hd, n_kv, kv_heads, B)
                return ggml_view_4d(ctx, c, hd, n_kv, hp.kv_heads, B, c->nb[1], c->nb[2], c->nb[3], 0);
            };
            ggml_tensor * queries = ggml_permute(ctx, ggml_reshape_4d(ctx, qh, hd, hp.heads, T, B), 0, 2, 1, 3);
            ggml_tensor * a = ggml_flash_attn_ext(ctx, queries, rows(kc[size_t(il)]), rows(vc[size_t(il)]),
                                                  T == 2 ? c_mask_ : nullptr, 1.0f / std::sqrt(float(hd)), 0.0f,
                                                  0.0f);  // (hd, heads, T, B)
            if (standard_ops_only()) {  // a device: f32 accumulation, as the CPU's
                ggml_flash_attn_ext_set_prec(a, GGML_PREC_F32);
            }
            x = ggml_add(ctx, x, mat_vecs(ctx, l.o, ggml_reshape_2d(ctx, a, int64_t(hd) * hp.heads, T * B)));
            h = rms_norm(ctx, x, l.ffn_norm, eps);
            h = ggml_swiglu_split(ctx, mat_vecs(ctx, l.gate, h), mat_vecs(ctx, l.up, h));
            x = ggml_add(ctx, x, mat_vecs(ctx, l.down, h));
        }
        // each request's last position
        ggml_tensor * last = T == 1 ? x : ggml_view_2d(ctx, x, hp.hidden, B, size_t(T) * x->nb[1], size_t(T - 1) * x->nb[1]);
        ggml_tensor * logits = mat_vecs(ctx, m.heads_[size_t(q - 1)], rms_norm(ctx, last, m.output_norm_, eps));
        ggml_format_name(logits, "cp_logits_%d", q);
        ggml_set_output(logits);
        fg->logits.push_back(logits);
        code = sample(ctx, logits, sampling, row(in_uniform_, q - 1), row(in_forced_, q - 1));
        ggml_format_name(code, "cp_code_%d", q);
        ggml_set_output(code);
        fg->codes.push_back(code);
    }
    fg->codec = ggml_add(ctx, codec_sum, m.codec_embd_[size_t(hp.n_codes - 1)].get(ctx, code));
    ggml_set_name(fg->codec, "cp_next_codec");
    ggml_set_output(fg->codec);

    fg->graph = ggml_new_graph_custom(ctx, max_nodes, false);
    ggml_build_forward_expand(fg->graph, fg->prefill);
    for (size_t i = 0; i < fg->codes.size(); ++i) {
        ggml_build_forward_expand(fg->graph, fg->logits[i]);
        ggml_build_forward_expand(fg->graph, fg->codes[i]);
    }
    ggml_build_forward_expand(fg->graph, fg->codec);
    fg->sched = backend_.new_scheduler(max_nodes);
    if (fg->sched) {
        alloc_scheduled(fg->sched.get(), fg->graph, "code predictor graph");
    } else {
        fg->alloc.reset(ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend_.get())));
        if (!fg->alloc || !ggml_gallocr_alloc_graph(fg->alloc.get(), fg->graph)) {
            throw error(QT_STATUS_OUT_OF_MEMORY, "not enough memory for the code predictor graph");
        }
    }
    slot = std::move(fg);
    return *slot;
}

void code_predictor_state::run(const cp_frame * frames, int n, const int32_t * forced) {
    const code_predictor_hparams & hp = model_.hp_;
    if (n < 1 || n > max_batch_) {
        throw error(QT_STATUS_INVALID_PARAMS, format("code predictor: %d frames at once (at most %d)", n, max_batch_));
    }
    const size_t B = size_t(max_batch_);
    std::vector<float>   hidden(size_t(hp.talker_hidden) * size_t(n)), u(B * size_t(hp.n_codes), 0.0f);
    std::vector<float>   sampling(3 * size_t(n));
    std::vector<int32_t> code0(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
        const cp_frame & f = frames[i];
        if (f.code0 < 0 || f.code0 >= hp.talker_vocab) {
            throw error(QT_STATUS_INVALID_PARAMS,
                        format("code predictor: code0 %d is out of range [0, %d)", f.code0, hp.talker_vocab));
        }
        std::copy(f.talker_hidden, f.talker_hidden + hp.talker_hidden, hidden.begin() + size_t(i) * size_t(hp.talker_hidden));
        code0[size_t(i)] = f.code0;
        for (int q = 0; q < hp.n_codes; ++q) {
            u[size_t(q) * B + size_t(i)] =
                rng_uniform_f32(f.sampling.seed, 1, f.frame_index * uint64_t(hp.n_codes) + uint64_t(q));
        }
        const int32_t k = f.sampling.top_k > 0 && f.sampling.top_k < hp.vocab ? f.sampling.top_k : 0;
        sampling[size_t(3 * i)] = f.sampling.temperature;
        sampling[size_t(3 * i + 1)] = float(k);
        sampling[size_t(3 * i + 2)] = f.sampling.top_p;
    }
    if (forced) {  // only ever for one frame
        for (int q = 0; q < hp.n_codes; ++q) {
            if (forced[q] < 0 || forced[q] >= hp.vocab) {
                throw error(QT_STATUS_INVALID_PARAMS,
                            format("code predictor: forced code %d of codebook %d is out of range [0, %d)", forced[q],
                                   q + 1, hp.vocab));
            }
        }
        std::vector<int32_t> rows(B * size_t(hp.n_codes), -1);
        for (int q = 0; q < hp.n_codes; ++q) {
            rows[size_t(q) * B] = forced[q];
        }
        ggml_backend_tensor_set(in_forced_, rows.data(), 0, ggml_nbytes(in_forced_));
        forcing_ = true;
    } else if (forcing_) {
        const std::vector<int32_t> none(B * size_t(hp.n_codes), -1);
        ggml_backend_tensor_set(in_forced_, none.data(), 0, ggml_nbytes(in_forced_));
        forcing_ = false;
    }
    ggml_backend_tensor_set(in_hidden_, hidden.data(), 0, hidden.size() * sizeof(float));
    ggml_backend_tensor_set(in_code0_, code0.data(), 0, code0.size() * sizeof(int32_t));
    ggml_backend_tensor_set(in_uniform_, u.data(), 0, ggml_nbytes(in_uniform_));
    ggml_backend_tensor_set(in_sampling_, sampling.data(), 0, sampling.size() * sizeof(float));
    frame_graph & g = graph_for(n);
    if (g.sched) {
        compute_scheduled(g.sched.get(), g.graph, "code predictor computation");
    } else {
        backend_.compute(g.graph, "code predictor computation");
    }
    for (int i = 0; i < n; ++i) {
        for (int q = 0; q < hp.n_codes; ++q) {
            ggml_backend_tensor_get(g.codes[size_t(q)], &frames[i].codes[q], size_t(i) * sizeof(int32_t), sizeof(int32_t));
        }
        if (frames[i].next_codec) {
            ggml_backend_tensor_get(g.codec, frames[i].next_codec, size_t(i) * g.codec->nb[1],
                                    size_t(hp.talker_hidden) * sizeof(float));
        }
    }
}

void code_predictor_state::predict(const float * talker_hidden, int32_t code0, uint64_t frame_index, int32_t * codes,
                                   float * next_codec, const stage_dumper * dump, const int32_t * forced) {
    const code_predictor_hparams & hp = model_.hp_;
    const cp_frame frame = { talker_hidden, code0, frame_index, sampling_, codes, next_codec };
    run(&frame, 1, forced);
    if (dump && dump->enabled()) {
        dump->write("cp_step0_prefill_embeds", graph_for(1).prefill);
        const std::vector<float> logits = last_logits();
        dump->write("cp_step0_logits", logits.data(), { int64_t(hp.n_codes), int64_t(hp.vocab) });
    }
}

void code_predictor_state::predict_batch(const cp_frame * frames, int n) { run(frames, n, nullptr); }

std::vector<float> code_predictor_state::last_logits() const {
    const size_t vocab = size_t(model_.hp_.vocab);
    const frame_graph & g = *graphs_.front();
    std::vector<float> out(g.logits.size() * vocab);
    for (size_t q = 0; q < g.logits.size(); ++q) {
        ggml_backend_tensor_get(g.logits[q], &out[q * vocab], 0, vocab * sizeof(float));
    }
    return out;
}

} // namespace qt
