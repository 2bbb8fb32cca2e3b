#include "talker.h"

#include "cpu-ops.h"
#include "gguf-names.h"
#include "log.h"
#include "mat-vecs.h"

#include "ggml-alloc.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#    include <immintrin.h>
#    define QT_TALKER_X86  1
#    define QT_TALKER_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif

namespace qt {

namespace {

ggml_tensor * rms_norm(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, float eps) {
    return ggml_mul(ctx, ggml_rms_norm(ctx, x, eps), w);
}

} // namespace

void talker::load(model_loader & ml) {
    static_cast<qwen3_hparams &>(hp_) = read_qwen3_hparams(ml, QT_STACK_TALKER, "talker");
    hp_.vocab = ml.get_size(QT_KEY_TALKER_VOCAB);
    hp_.text_hidden = ml.get_size(QT_KEY_TALKER_TEXT_HIDDEN);
    hp_.text_vocab = ml.get_size(QT_KEY_TALKER_TEXT_VOCAB);

    const int64_t H = hp_.hidden;
    interleaved_ = interleaved_weights();
    layers_ = load_qwen3_layers(ml, "talker.", hp_, interleaved_);
    output_norm_ = ml.require("talker.output_norm.weight", { H });
    codec_embd_ = ml.require_table("talker.codec_embd.weight", { H, hp_.vocab });
    text_embd_ = ml.require_table("talker.text_embd.weight", { hp_.text_hidden, hp_.text_vocab });
    text_proj1_w_ = ml.require("talker.text_proj1.weight", { hp_.text_hidden, hp_.text_hidden });
    text_proj1_b_ = ml.require("talker.text_proj1.bias", { hp_.text_hidden });
    text_proj2_w_ = ml.require("talker.text_proj2.weight", { hp_.text_hidden, H });
    text_proj2_b_ = ml.require("talker.text_proj2.bias", { H });
    codec_head_ = interleaved_.adopt(ml, ml.require("talker.codec_head.weight", { H, hp_.vocab }));
    interleaved_.commit(ml);
}

size_t talker::step_weight_bytes() const {
    return ggml_nbytes(output_norm_) + ggml_nbytes(codec_head_) + qwen3_layers_bytes(layers_);
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

std::vector<float> talker::text_embed(const compute_backend & backend, const int32_t * ids, int64_t n) const {
    if (n <= 0) {
        return {};
    }
    check_ids(ids, n, hp_.text_vocab, "text token");
    stage_dumper no_dump;
    graph_run run(backend, no_dump, 64);
    ggml_context * ctx = run.ctx();
    ggml_tensor * x = text_embd_.get(ctx, run.input_i32("text_ids", ids, { n }));  // (text_hidden, n)
    x = ggml_silu(ctx, dense(ctx, text_proj1_w_, x, text_proj1_b_));
    x = dense(ctx, text_proj2_w_, x, text_proj2_b_);
    run.compute(x);
    return run.read_f32(x);
}

std::vector<float> talker::codec_embed(const compute_backend & backend, const int32_t * ids, int64_t n) const {
    if (n <= 0) {
        return {};
    }
    check_ids(ids, n, hp_.vocab, "codec");
    stage_dumper no_dump;
    graph_run run(backend, no_dump, 16);
    ggml_tensor * x = codec_embd_.get(run.ctx(), run.input_i32("codec_ids", ids, { n }));
    run.compute(x);
    return run.read_f32(x);
}

// A step's matrix-vector products are bound by the bandwidth of reading the weight, which
// mat_vecs() streams once for all the sequences; the packed GEMM of dense() pays off over the
// many positions of a prefill, for the weight types it packs. Other types (q4_K) would go to
// ggml_mul_mat, which unpacks each weight block once per position: mat_vecs() unpacks it once for
// all of them. Interleaved matrices (q4_K and q8_0 on x86) take no other path; their integer dots
// outrun the packed f32 GEMM there too.
ggml_tensor * talker::linear(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, bool prefill) const {
    const bool packed = !is_interleaved(w) &&
                        (w->type == GGML_TYPE_F32 || w->type == GGML_TYPE_F16 || w->type == GGML_TYPE_Q8_0);
    return prefill && packed ? dense(ctx, w, x) : mat_vecs(ctx, w, x);
}

template <typename Attend>
ggml_tensor * talker::layer_forward(ggml_context * ctx, ggml_tensor * x, const layer & l, ggml_tensor * pos,
                                    bool prefill, Attend && attend) const {
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
    ggml_tensor * q = ggml_reshape_3d(ctx, linear(ctx, l.q, h, prefill), hd, hp_.heads, T);
    ggml_tensor * k = ggml_reshape_3d(ctx, linear(ctx, l.k, h, prefill), hd, hp_.kv_heads, T);
    ggml_tensor * v = linear(ctx, l.v, h, prefill);  // (kv_heads * hd, T)
    q = rope(rms_norm(ctx, q, l.q_norm, eps));
    k = rope(rms_norm(ctx, k, l.k_norm, eps));
    ggml_tensor * a = attend(q, k, v);  // (heads * hd, T)
    x = ggml_add(ctx, x, linear(ctx, l.o, a, prefill));

    h = rms_norm(ctx, x, l.ffn_norm, eps);
    h = ggml_swiglu_split(ctx, linear(ctx, l.gate, h, prefill), linear(ctx, l.up, h, prefill));
    return ggml_add(ctx, x, linear(ctx, l.down, h, prefill));
}

// ---- decode attention ------------------------------------------------------------------------

namespace {

// Writes the keys or values of T positions, (head_dim, kv_heads, T) (contiguous), to cache rows
// `slots` of `cache` (head_dim, capacity, kv_heads) and returns the ggml_set_rows result: a view
// of the whole cache through which later reads are ordered after the write.
ggml_tensor * store_rows(ggml_context * ctx, ggml_tensor * cache, ggml_tensor * rows, ggml_tensor * slots) {
    const int64_t T = rows->ne[2];
    ggml_tensor * per_head = T == 1 ? ggml_reshape_3d(ctx, rows, rows->ne[0], 1, rows->ne[1])
                                    : ggml_permute(ctx, rows, 0, 2, 1, 3);  // (head_dim, T, kv_heads)
    return ggml_set_rows(ctx, cache, per_head, slots);
}

float load_elem(const float * p, int64_t i) { return p[i]; }
float load_elem(const ggml_fp16_t * p, int64_t i) { return ggml_fp16_to_fp32(p[i]); }

// Portable kernel: scores of rep query heads against n cache rows, softmax, weighted sum of the
// value rows; s holds rep * n floats.
template <typename T>
void attend_rows_ref(const float * const * q, int rep, int64_t hd, const char * k, const char * v, size_t row_bytes,
                     int64_t n, float scale, float * s, float * const * out) {
    for (int64_t j = 0; j < n; ++j) {
        const T * kr = reinterpret_cast<const T *>(k + size_t(j) * row_bytes);
        for (int r = 0; r < rep; ++r) {
            float acc = 0.0f;
            for (int64_t d = 0; d < hd; ++d) {
                acc += q[r][d] * load_elem(kr, d);
            }
            s[r * n + j] = acc * scale;
        }
    }
    for (int r = 0; r < rep; ++r) {
        float * sr = s + r * n;
        const float m = *std::max_element(sr, sr + n);
        float sum = 0.0f;
        for (int64_t j = 0; j < n; ++j) {
            sr[j] = std::exp(sr[j] - m);
            sum += sr[j];
        }
        std::fill(out[r], out[r] + hd, 0.0f);
        for (int64_t j = 0; j < n; ++j) {
            const T * vr = reinterpret_cast<const T *>(v + size_t(j) * row_bytes);
            const float p = sr[j] / sum;
            for (int64_t d = 0; d < hd; ++d) {
                out[r][d] += p * load_elem(vr, d);
            }
        }
    }
}

#ifdef QT_TALKER_X86

// As cpu-ops' kernels: what the processor and the loaded ggml variant both support.
bool has_avx2() { return cpu_kernels_active() >= cpu_kernels::avx2; }

QT_TALKER_AVX2 inline __m256 load8(const float * p) { return _mm256_loadu_ps(p); }
QT_TALKER_AVX2 inline __m256 load8(const ggml_fp16_t * p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
}

QT_TALKER_AVX2 inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// exp(x) for x <= 0 (Cephes' single-precision polynomial after reduction by ln 2; relative error
// about 2e-7), flushing to 0 below -87.
QT_TALKER_AVX2 inline __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.0f);
    const __m256 too_small = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(too_small, y);
}

constexpr int k_max_rep = 8;  // query heads per KV head handled in registers

// AVX2 kernel for head_dim % 8 == 0 and rep <= k_max_rep: every key and value row is read once
// for all rep query heads.
template <typename T>
QT_TALKER_AVX2 void attend_rows_avx2(const float * const * q, int rep, int64_t hd, const char * k, const char * v,
                                     size_t row_bytes, int64_t n, float scale, float * s, float * const * out) {
    for (int64_t j = 0; j < n; ++j) {
        const T * kr = reinterpret_cast<const T *>(k + size_t(j) * row_bytes);
        __m256 acc[k_max_rep];
        for (int r = 0; r < rep; ++r) {
            acc[r] = _mm256_setzero_ps();
        }
        for (int64_t d = 0; d < hd; d += 8) {
            const __m256 kv = load8(kr + d);
            for (int r = 0; r < rep; ++r) {
                acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q[r] + d), kv, acc[r]);
            }
        }
        for (int r = 0; r < rep; ++r) {
            s[r * n + j] = hsum(acc[r]) * scale;
        }
    }
    float inv_sum[k_max_rep];
    for (int r = 0; r < rep; ++r) {
        float * sr = s + r * n;
        const float m = *std::max_element(sr, sr + n);
        const __m256 vm = _mm256_set1_ps(m);
        __m256 vsum = _mm256_setzero_ps();
        int64_t j = 0;
        for (; j + 8 <= n; j += 8) {
            const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sr + j), vm));
            _mm256_storeu_ps(sr + j, e);
            vsum = _mm256_add_ps(vsum, e);
        }
        float sum = hsum(vsum);
        for (; j < n; ++j) {
            sr[j] = std::exp(sr[j] - m);
            sum += sr[j];
        }
        inv_sum[r] = 1.0f / sum;
        std::fill(out[r], out[r] + hd, 0.0f);
    }
    for (int64_t j = 0; j < n; ++j) {
        const T * vr = reinterpret_cast<const T *>(v + size_t(j) * row_bytes);
        for (int64_t d = 0; d < hd; d += 8) {
            const __m256 vv = load8(vr + d);
            for (int r = 0; r < rep; ++r) {
                __m256 o = _mm256_loadu_ps(out[r] + d);
                o = _mm256_fmadd_ps(_mm256_set1_ps(s[r * n + j]), vv, o);
                _mm256_storeu_ps(out[r] + d, o);
            }
        }
    }
    for (int r = 0; r < rep; ++r) {
        const __m256 f = _mm256_set1_ps(inv_sum[r]);
        for (int64_t d = 0; d < hd; d += 8) {
            _mm256_storeu_ps(out[r] + d, _mm256_mul_ps(_mm256_loadu_ps(out[r] + d), f));
        }
    }
}

#endif  // QT_TALKER_X86

// ggml custom op: dst (hd, heads, B) = softmax(q k^T / sqrt(hd)) v for each of B sequences, over
// its cache rows [base, base + pos] for src = { q (hd, heads, B) f32 contiguous, k, v (hd, rows,
// kv_heads) f32 or f16, pos (B) i32, base (B) i32 }. Query head h uses KV head h / (heads /
// kv_heads), as the reference's repeat_kv. Threads split the (sequence, KV head) pairs.
void decode_attention_op(ggml_tensor * dst, int ith, int nth, void * /*userdata*/) {
    const ggml_tensor * q = dst->src[0];
    const ggml_tensor * k = dst->src[1];
    const ggml_tensor * v = dst->src[2];
    const int32_t *     pos = static_cast<const int32_t *>(dst->src[3]->data);
    const int32_t *     base = static_cast<const int32_t *>(dst->src[4]->data);
    const int64_t       hd = q->ne[0];
    const int64_t       kv_heads = k->ne[2];
    const int64_t       n_seqs = q->ne[2];
    const int           rep = int(q->ne[1] / kv_heads);
    const float         scale = 1.0f / std::sqrt(float(hd));
    const bool          f16 = k->type == GGML_TYPE_F16;

    thread_local std::vector<float> scores;
    std::vector<const float *> qs(static_cast<size_t>(rep));
    std::vector<float *>       outs(static_cast<size_t>(rep));
    const int64_t n_pairs = n_seqs * kv_heads;
    for (int64_t pair = n_pairs * ith / nth; pair < n_pairs * (ith + 1) / nth; ++pair) {
        const int64_t b = pair / kv_heads, g = pair % kv_heads;
        const int64_t n = int64_t(pos[b]) + 1;
        scores.resize(size_t(rep) * size_t(n));
        for (int r = 0; r < rep; ++r) {
            const int64_t h = g * rep + r;
            qs[size_t(r)] = reinterpret_cast<const float *>(static_cast<const char *>(q->data) + size_t(h) * q->nb[1] +
                                                            size_t(b) * q->nb[2]);
            outs[size_t(r)] = reinterpret_cast<float *>(static_cast<char *>(dst->data) + size_t(h) * dst->nb[1] +
                                                        size_t(b) * dst->nb[2]);
        }
        const size_t first = size_t(base[b]) * k->nb[1];
        const char * kg = static_cast<const char *>(k->data) + size_t(g) * k->nb[2] + first;
        const char * vg = static_cast<const char *>(v->data) + size_t(g) * v->nb[2] + first;
#ifdef QT_TALKER_X86
        if (has_avx2() && hd % 8 == 0 && rep <= k_max_rep) {
            if (f16) {
                attend_rows_avx2<ggml_fp16_t>(qs.data(), rep, hd, kg, vg, k->nb[1], n, scale, scores.data(), outs.data());
            } else {
                attend_rows_avx2<float>(qs.data(), rep, hd, kg, vg, k->nb[1], n, scale, scores.data(), outs.data());
            }
            continue;
        }
#endif
        if (f16) {
            attend_rows_ref<ggml_fp16_t>(qs.data(), rep, hd, kg, vg, k->nb[1], n, scale, scores.data(), outs.data());
        } else {
            attend_rows_ref<float>(qs.data(), rep, hd, kg, vg, k->nb[1], n, scale, scores.data(), outs.data());
        }
    }
}

ggml_tensor * decode_attention(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                               ggml_tensor * pos, ggml_tensor * base) {
    GGML_ASSERT(ggml_is_contiguous(q) && k->nb[0] == ggml_type_size(k->type) && pos->ne[0] == q->ne[2] &&
                base->ne[0] == q->ne[2]);
    GGML_ASSERT(k->type == v->type && k->nb[1] == v->nb[1] && k->nb[2] == v->nb[2] && q->ne[1] % k->ne[2] == 0);
    ggml_tensor * args[] = { q, k, v, pos, base };
    return ggml_custom_4d(ctx, GGML_TYPE_F32, q->ne[0], q->ne[1], q->ne[2], 1, args, 5, decode_attention_op,
                          GGML_N_TASKS_MAX, nullptr);
}

} // namespace

// ---- talker_state ----------------------------------------------------------------------------

talker_state::talker_state(const talker & model, const compute_backend & backend, int64_t max_positions,
                           ggml_type kv_type, int n_seqs)
    : model_(model), backend_(backend), capacity_(max_positions), n_past_(size_t(std::max(n_seqs, 0)), 0) {
    const talker_hparams & hp = model.hp_;
    if (backend.runs_cpu_kernels()) {
        model.fill_interleaved();
    }
    if (max_positions <= 0 || n_seqs <= 0) {
        throw error(QT_STATUS_INVALID_PARAMS, format("talker: KV cache of %lld positions for %d sequences",
                                                     (long long) max_positions, n_seqs));
    }
    if (kv_type != GGML_TYPE_F32 && kv_type != GGML_TYPE_F16) {
        throw error(QT_STATUS_INVALID_PARAMS, format("talker: KV cache type %s (f32 or f16)", ggml_type_name(kv_type)));
    }

    const size_t n_tensors = size_t(2 * hp.layers);
    cache_ctx_ = new_metadata_context(n_tensors, false, "KV cache context");
    ggml_context * cctx = cache_ctx_.get();
    for (int i = 0; i < hp.layers; ++i) {
        k_cache_.push_back(ggml_new_tensor_3d(cctx, kv_type, hp.head_dim, capacity_ * n_seqs, hp.kv_heads));
        v_cache_.push_back(ggml_new_tensor_3d(cctx, kv_type, hp.head_dim, capacity_ * n_seqs, hp.kv_heads));
        ggml_format_name(k_cache_.back(), "k_cache_%d", i);
        ggml_format_name(v_cache_.back(), "v_cache_%d", i);
    }
    cache_buf_.reset(ggml_backend_alloc_ctx_tensors(cctx, backend.get()));
    if (!cache_buf_) {
        throw error(QT_STATUS_OUT_OF_MEMORY,
                    format("cannot allocate a KV cache of %lld positions (%.1f MiB)", (long long) capacity_ * n_seqs,
                           2.0 * hp.layers * hp.kv_heads * hp.head_dim * double(capacity_) * n_seqs *
                               double(ggml_type_size(kv_type)) / (1024.0 * 1024.0)));
    }
    // On the CPU only written rows are ever read (the prefill's mask and the step kernel's
    // lengths stop at the last one of each sequence), so the cache needs no clearing. A device's
    // step attends over every row, masked: a row never written must still hold a number (a
    // masked NaN poisons the sum), so its cache starts at zero.
    if (!backend.runs_cpu_kernels()) {
        ggml_backend_buffer_clear(cache_buf_.get(), 0);
    }
    steps_.resize(size_t(n_seqs));
    graph_for(1);  // the single step, so that a request fails here rather than mid-way
}

talker_state::~talker_state() {
    ggml_backend_synchronize(backend_.get());  // a device may still be reading the cache being freed
}

talker_state::step_graph & talker_state::graph_for(int width) {
    std::unique_ptr<step_graph> & slot = steps_[size_t(width - 1)];
    if (slot) {
        return *slot;
    }
    auto sg = std::make_unique<step_graph>();
    const talker_hparams & hp = model_.hp_;
    const bool         device = !backend_.runs_cpu_kernels();
    standard_ops_scope standard_ops(device);
    const int64_t      cache_rows = k_cache_.front()->ne[1];
    sg->inputs_ctx = new_metadata_context(5, false, "talker step inputs context");
    ggml_context * ictx = sg->inputs_ctx.get();
    sg->embed = ggml_new_tensor_2d(ictx, GGML_TYPE_F32, hp.hidden, width);
    sg->pos = ggml_new_tensor_1d(ictx, GGML_TYPE_I32, width);
    sg->slot = ggml_new_tensor_1d(ictx, GGML_TYPE_I64, width);
    sg->base = ggml_new_tensor_1d(ictx, GGML_TYPE_I32, width);
    ggml_set_name(sg->embed, "step_embed");
    ggml_set_name(sg->pos, "step_pos");
    ggml_set_name(sg->slot, "step_slot");
    ggml_set_name(sg->base, "step_base");
    if (device) {
        sg->mask = ggml_new_tensor_2d(ictx, GGML_TYPE_F16, cache_rows, width);
        ggml_set_name(sg->mask, "step_mask");
    }
    sg->inputs_buf.reset(ggml_backend_alloc_ctx_tensors(ictx, backend_.get()));
    if (!sg->inputs_buf) {
        throw error(QT_STATUS_OUT_OF_MEMORY, "not enough memory for the talker step inputs");
    }

    const size_t max_nodes = size_t(hp.layers) * 48 + 64;
    sg->ctx = new_metadata_context(max_nodes, true, "talker step graph context");
    ggml_context * ctx = sg->ctx.get();
    ggml_tensor * x = sg->embed;
    for (int il = 0; il < hp.layers; ++il) {
        auto attend = [&](ggml_tensor * q, ggml_tensor * k, ggml_tensor * v) {
            ggml_tensor * kc = store_rows(ctx, k_cache_[size_t(il)], k, sg->slot);
            ggml_tensor * vc = store_rows(ctx, v_cache_[size_t(il)],
                                          ggml_reshape_3d(ctx, v, hp.head_dim, hp.kv_heads, width), sg->slot);
            if (device) {  // every cache row, those of other sequences and past the position masked
                ggml_tensor * a = ggml_flash_attn_ext(ctx, ggml_permute(ctx, q, 0, 2, 1, 3), kc, vc, sg->mask,
                                                      1.0f / std::sqrt(float(hp.head_dim)), 0.0f, 0.0f);
                ggml_flash_attn_ext_set_prec(a, GGML_PREC_F32);  // f32 accumulation, as the CPU's
                return ggml_reshape_2d(ctx, a, int64_t(hp.head_dim) * hp.heads, width);  // a is (hd, heads, width)
            }
            ggml_tensor * a = decode_attention(ctx, q, kc, vc, sg->pos, sg->base);
            return ggml_reshape_2d(ctx, a, int64_t(hp.head_dim) * hp.heads, width);
        };
        x = model_.layer_forward(ctx, x, model_.layers_[size_t(il)], sg->pos, false, attend);
    }
    sg->hidden = rms_norm(ctx, x, model_.output_norm_, hp.norm_eps);
    sg->logits = mat_vecs(ctx, model_.codec_head_, sg->hidden);
    ggml_set_name(sg->hidden, "talker_hidden");
    ggml_set_name(sg->logits, "talker_logits");
    ggml_set_output(sg->hidden);
    ggml_set_output(sg->logits);

    sg->graph = ggml_new_graph_custom(ctx, max_nodes, false);
    ggml_build_forward_expand(sg->graph, sg->logits);
    sg->alloc.reset(ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend_.get())));
    if (!sg->alloc || !ggml_gallocr_alloc_graph(sg->alloc.get(), sg->graph)) {
        throw error(QT_STATUS_OUT_OF_MEMORY, "not enough memory for the talker step graph");
    }
    slot = std::move(sg);
    return *slot;
}

size_t talker_prefix::bytes() const {
    size_t total = embeds.size() * sizeof(float) + (out.logits.size() + out.hidden.size()) * sizeof(float);
    for (const auto * rows : { &k, &v }) {
        for (const auto & layer : *rows) {
            total += layer.size();
        }
    }
    return total;
}

talker_prefix talker_state::save_prefix(const float * embeds, const talker_output & out, int seq) const {
    const talker_hparams & hp = model_.hp_;
    talker_prefix          prefix;
    prefix.n = n_past(seq);
    prefix.embeds.assign(embeds, embeds + prefix.n * hp.hidden);
    prefix.out = out;
    for (auto [cache, rows] : { std::pair{ &k_cache_, &prefix.k }, std::pair{ &v_cache_, &prefix.v } }) {
        for (ggml_tensor * t : *cache) {
            const size_t head_block = t->nb[2], used = size_t(prefix.n) * t->nb[1];  // rows of one kv head
            const size_t first = size_t(first_row(seq)) * t->nb[1];
            std::vector<uint8_t> & out_rows = rows->emplace_back(used * size_t(hp.kv_heads));
            for (int64_t h = 0; h < hp.kv_heads; ++h) {
                ggml_backend_tensor_get(t, out_rows.data() + size_t(h) * used, size_t(h) * head_block + first, used);
            }
        }
    }
    return prefix;
}

void talker_state::load_prefix(const talker_prefix & prefix, int seq) {
    const talker_hparams & hp = model_.hp_;
    if (n_past(seq) != 0 || prefix.n < 1 || prefix.n > capacity_ || prefix.k.size() != k_cache_.size()) {
        throw error(QT_STATUS_FAILED, format("talker: cannot restore %lld cached positions at %lld",
                                             (long long) prefix.n, (long long) n_past(seq)));
    }
    for (auto [cache, rows] : { std::pair{ &k_cache_, &prefix.k }, std::pair{ &v_cache_, &prefix.v } }) {
        for (size_t il = 0; il < cache->size(); ++il) {
            ggml_tensor * t = (*cache)[il];
            const size_t  head_block = t->nb[2], used = size_t(prefix.n) * t->nb[1];
            const size_t  first = size_t(first_row(seq)) * t->nb[1];
            for (int64_t h = 0; h < hp.kv_heads; ++h) {
                ggml_backend_tensor_set(t, (*rows)[il].data() + size_t(h) * used, size_t(h) * head_block + first, used);
            }
        }
    }
    n_past_[size_t(seq)] = prefix.n;
}

void talker_state::prefill(const stage_dumper & dumper, const float * embeds, int64_t n, talker_output & out,
                           int seq) {
    const talker_hparams & hp = model_.hp_;
    const int64_t          past = n_past(seq);
    if (n <= 0 || past + n > capacity_) {
        throw error(QT_STATUS_INVALID_PARAMS, format("talker prefill of %lld positions at %lld exceeds the cache (%lld)",
                                                     (long long) n, (long long) past, (long long) capacity_));
    }
    const int64_t n_kv = past + n;
    std::vector<int32_t> pos(static_cast<size_t>(n));
    std::vector<int64_t> slots(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
        pos[size_t(i)] = int32_t(past + i);
        slots[size_t(i)] = first_row(seq) + past + i;
    }
    // causal mask (n_kv, n): query i (absolute position past + i) sees cache rows <= past + i
    std::vector<float> mask(size_t(n_kv * n));
    for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < n_kv; ++j) {
            mask[size_t(i * n_kv + j)] = j <= past + i ? 0.0f : -INFINITY;
        }
    }
    const bool from_start = past == 0;

    graph_run run(backend_, dumper, size_t(hp.layers) * 48 + 64);
    ggml_context * ctx = run.ctx();
    ggml_tensor * x = run.input_f32("prefill_embeds", embeds, { hp.hidden, n });
    ggml_tensor * gpos = run.input_i32("prefill_pos", pos.data(), { n });
    ggml_tensor * gslots = run.input("prefill_slots", GGML_TYPE_I64, slots.data(), { n });
    ggml_tensor * gmask = ggml_cast(ctx, run.input_f32("prefill_mask", mask.data(), { n_kv, n }), GGML_TYPE_F16);
    for (int il = 0; il < hp.layers; ++il) {
        auto attend = [&](ggml_tensor * q, ggml_tensor * k, ggml_tensor * v) {
            ggml_tensor * kc = store_rows(ctx, k_cache_[size_t(il)], k, gslots);
            ggml_tensor * vc = store_rows(ctx, v_cache_[size_t(il)], ggml_reshape_3d(ctx, v, hp.head_dim, hp.kv_heads, n),
                                          gslots);
            auto rows = [&](ggml_tensor * c) {  // the sequence's first n_kv rows, (hd, n_kv, kv_heads)
                return ggml_view_3d(ctx, c, hp.head_dim, n_kv, hp.kv_heads, c->nb[1], c->nb[2],
                                    size_t(first_row(seq)) * c->nb[1]);
            };
            ggml_tensor * a = ggml_flash_attn_ext(ctx, ggml_permute(ctx, q, 0, 2, 1, 3), rows(kc), rows(vc), gmask,
                                                  1.0f / std::sqrt(float(hp.head_dim)), 0.0f, 0.0f);
            if (standard_ops_only()) {  // a device: f32 accumulation, as the CPU's
                ggml_flash_attn_ext_set_prec(a, GGML_PREC_F32);
            }
            return ggml_reshape_2d(ctx, a, int64_t(hp.head_dim) * hp.heads, n);  // result is (hd, heads, n)
        };
        x = model_.layer_forward(ctx, x, model_.layers_[size_t(il)], gpos, true, attend);
        if (from_start) {
            x = run.stage(x, "talker_hidden_layer" + std::to_string(il));
        }
    }
    ggml_tensor * hn = rms_norm(ctx, x, model_.output_norm_, hp.norm_eps);
    if (from_start) {
        hn = run.stage(hn, "talker_hidden_norm");
    }
    ggml_tensor * last = ggml_view_2d(ctx, hn, hp.hidden, 1, hn->nb[1], size_t(n - 1) * hn->nb[1]);
    ggml_tensor * logits = mat_vecs(ctx, model_.codec_head_, last);
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
    n_past_[size_t(seq)] = n_kv;
}

void talker_state::step(const float * embed, talker_output & out) {
    const int seq = 0;
    step_batch(&seq, 1, embed, &out);
}

void talker_state::step_batch(const int * seqs, int n, const float * embeds, talker_output * outs) {
    const talker_hparams & hp = model_.hp_;
    if (n < 1 || n > n_seqs()) {
        throw error(QT_STATUS_INVALID_PARAMS, format("talker step of %d sequences (the state holds %d)", n, n_seqs()));
    }
    std::vector<int32_t> pos(static_cast<size_t>(n)), base(static_cast<size_t>(n));
    std::vector<int64_t> slot(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
        const int seq = seqs[i];
        if (seq < 0 || seq >= n_seqs() || std::count(seqs, seqs + i, seq) != 0) {
            throw error(QT_STATUS_INVALID_PARAMS, format("talker step: sequence %d is not a distinct one of %d", seq,
                                                         n_seqs()));
        }
        if (n_past(seq) >= capacity_) {
            throw error(QT_STATUS_INVALID_PARAMS,
                        format("talker step at position %lld: the KV cache holds %lld", (long long) n_past(seq),
                               (long long) capacity_));
        }
        pos[size_t(i)] = int32_t(n_past(seq));
        base[size_t(i)] = int32_t(first_row(seq));
        slot[size_t(i)] = first_row(seq) + n_past(seq);
    }
    step_graph & g = graph_for(n);
    if (g.mask) {
        const int64_t rows = g.mask->ne[0];
        std::vector<ggml_fp16_t> mask(size_t(rows * n), ggml_fp32_to_fp16(-INFINITY));
        for (int i = 0; i < n; ++i) {
            std::fill_n(mask.begin() + i * rows + base[size_t(i)], pos[size_t(i)] + 1, ggml_fp32_to_fp16(0.0f));
        }
        ggml_backend_tensor_set(g.mask, mask.data(), 0, ggml_nbytes(g.mask));
    }
    ggml_backend_tensor_set(g.embed, embeds, 0, ggml_nbytes(g.embed));
    ggml_backend_tensor_set(g.pos, pos.data(), 0, ggml_nbytes(g.pos));
    ggml_backend_tensor_set(g.base, base.data(), 0, ggml_nbytes(g.base));
    ggml_backend_tensor_set(g.slot, slot.data(), 0, ggml_nbytes(g.slot));
    backend_.compute(g.graph, "talker step computation");
    for (int i = 0; i < n; ++i) {
        outs[i].logits.resize(size_t(hp.vocab));
        outs[i].hidden.resize(size_t(hp.hidden));
        ggml_backend_tensor_get(g.logits, outs[i].logits.data(), size_t(i) * g.logits->nb[1],
                                outs[i].logits.size() * sizeof(float));
        ggml_backend_tensor_get(g.hidden, outs[i].hidden.data(), size_t(i) * g.hidden->nb[1],
                                outs[i].hidden.size() * sizeof(float));
        n_past_[size_t(seqs[i])] += 1;
    }
}

} // namespace qt
