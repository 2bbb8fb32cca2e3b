#include "codec-encoder.h"

#include "gguf-names.h"
#include "log.h"

#include "ggml-alloc.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#    include <immintrin.h>
#    define QT_ENC_X86 1
#    define QT_AVX2    __attribute__((target("avx2,fma")))
#endif

namespace qt {

namespace {

// A weight as f32 host values, whatever its stored type.
std::vector<float> weight_f32(const ggml_tensor * t) {
    const int64_t n = ggml_nelements(t);
    std::vector<float> out(size_t(n), 0.0f);
    if (t->type == GGML_TYPE_F32) {
        ggml_backend_tensor_get(t, out.data(), 0, size_t(n) * sizeof(float));
        return out;
    }
    const ggml_type_traits * traits = ggml_get_type_traits(t->type);
    if (!traits->to_float) {
        throw error(QT_STATUS_INVALID_PARAMS,
                    format("codec encoder: tensor '%s' has unsupported type %s", t->name, ggml_type_name(t->type)));
    }
    std::vector<uint8_t> raw(ggml_nbytes(t));
    ggml_backend_tensor_get(t, raw.data(), 0, raw.size());
    traits->to_float(raw.data(), out.data(), n);
    return out;
}

pad_mode parse_pad_mode(const std::string & path, const std::string & mode) {
    if (mode == "constant") {
        return pad_mode::zeros;
    }
    if (mode == "replicate") {
        return pad_mode::replicate;
    }
    if (mode == "reflect") {
        return pad_mode::reflect;
    }
    throw error(QT_STATUS_INVALID_PARAMS, format("%s: unsupported codec encoder pad mode '%s'", path.c_str(), mode.c_str()));
}

// ---- CPU kernels ------------------------------------------------------------------------------
// The wheel's ggml computes f32 matrix products with one dot product per output (no llamafile
// sgemm), about a quarter of what the FPU can do, and ELU with scalar expm1f. The SEANet runs at
// up to 24 kHz with 64 channels, so both dominate; these two custom ops replace them when the
// CPU has AVX2 and FMA (checked at run time), and plain ggml ops are used otherwise.

bool use_avx2() {
#ifdef QT_ENC_X86
    static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return ok;
#else
    return false;
#endif
}

// Row range [first, last) of n rows for thread ith of nth.
void split_rows(int64_t n, int ith, int nth, int64_t * first, int64_t * last) {
    *first = n * ith / nth;
    *last = n * (ith + 1) / nth;
}

#ifdef QT_ENC_X86

constexpr int k_mr = 6;    // output frames per register tile
constexpr int k_nr = 16;   // output channels per register tile (two 8-float vectors)
constexpr int k_kc = 256;  // depth of a packed weight panel (16 KiB)
constexpr int k_tc = 96;   // output frames per work item (its tiles stay in L1)

// y[i][0..nv) += x[i] . wp over kc for MR frames; x rows at stride ldx, wp packed [kc][16].
template <int MR>
QT_AVX2 inline void gemm_tile(int kc, const float * x, size_t ldx, const float * wp, float * y, size_t ldy, int nv) {
    __m256 c0[MR], c1[MR];
#    pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
        c0[i] = _mm256_setzero_ps();
        c1[i] = _mm256_setzero_ps();
    }
    for (int k = 0; k < kc; ++k) {
        const __m256 w0 = _mm256_load_ps(wp + k * k_nr);
        const __m256 w1 = _mm256_load_ps(wp + k * k_nr + 8);
#    pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
            const __m256 xb = _mm256_broadcast_ss(x + i * ldx + k);
            c0[i] = _mm256_fmadd_ps(xb, w0, c0[i]);
            c1[i] = _mm256_fmadd_ps(xb, w1, c1[i]);
        }
    }
#    pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
        float * yr = y + i * ldy;
        if (nv == k_nr) {
            _mm256_storeu_ps(yr, _mm256_add_ps(_mm256_loadu_ps(yr), c0[i]));
            _mm256_storeu_ps(yr + 8, _mm256_add_ps(_mm256_loadu_ps(yr + 8), c1[i]));
        } else {
            alignas(32) float tmp[k_nr];
            _mm256_store_ps(tmp, c0[i]);
            _mm256_store_ps(tmp + 8, c1[i]);
            for (int j = 0; j < nv; ++j) {
                yr[j] += tmp[j];
            }
        }
    }
}

// y (N, T, B) = W^T x (+ b) (+ r) per batch: x (K, T, B) with rows at any stride (overlapping
// sliding windows included), W (K, N, Bw) f32 with B % Bw == 0 (batch i uses W batch
// i / (B / Bw), as ggml_mul_mat broadcasts), optional b (N) and r (N, T, B) contiguous.
// r may be y itself (accumulate in place).
struct gemm_args {
    const ggml_tensor * x;
    const ggml_tensor * w;
    const ggml_tensor * b;
    const ggml_tensor * r;
    ggml_tensor *       y;
};

QT_AVX2 void gemm_run(const gemm_args & g, int ith, int nth) {
    const int64_t K = g.x->ne[0];
    const int64_t T = g.x->ne[1];
    const int64_t B = g.x->ne[2];
    const int64_t N = g.w->ne[1];
    const int64_t group = B / g.w->ne[2];
    const size_t  ldx = g.x->nb[1] / sizeof(float);
    const size_t  ldw = g.w->nb[1] / sizeof(float);
    const size_t  ldy = size_t(N);
    const bool    in_place = g.r && g.r->data == g.y->data;

    const int64_t n_panels = (N + k_nr - 1) / k_nr;
    const int64_t n_chunks = (T + k_tc - 1) / k_tc;
    int64_t       first = 0, last = 0;
    split_rows(B * n_chunks * n_panels, ith, nth, &first, &last);
    alignas(32) float wp[k_kc * k_nr];
    for (int64_t item = first; item < last; ++item) {
        const int64_t bi = item / (n_chunks * n_panels);
        const int64_t t0 = (item / n_panels % n_chunks) * k_tc;
        const int64_t t1 = std::min(T, t0 + k_tc);
        const int64_t o0 = (item % n_panels) * k_nr;
        const int     nv = int(std::min<int64_t>(k_nr, N - o0));
        const float * xd = reinterpret_cast<const float *>(static_cast<const char *>(g.x->data) + bi * g.x->nb[2]);
        const float * wd = reinterpret_cast<const float *>(static_cast<const char *>(g.w->data) + bi / group * g.w->nb[2]);
        float *       yd = reinterpret_cast<float *>(static_cast<char *>(g.y->data) + bi * g.y->nb[2]);
        const float * rd = g.r ? reinterpret_cast<const float *>(static_cast<const char *>(g.r->data) + bi * g.r->nb[2])
                               : nullptr;
        // start from bias + residual; separate loops, as a vectorised select of a null pointer
        // becomes a masked load from address 0, which AMD CPUs serve very slowly
        const float * br = g.b ? static_cast<const float *>(g.b->data) + o0 : nullptr;
        for (int64_t t = t0; t < t1; ++t) {
            float * yr = yd + t * ldy + o0;
            if (!in_place) {
                if (rd) {
                    memcpy(yr, rd + t * ldy + o0, size_t(nv) * sizeof(float));
                } else {
                    memset(yr, 0, size_t(nv) * sizeof(float));
                }
            }
            if (br) {
                for (int j = 0; j < nv; ++j) {
                    yr[j] += br[j];
                }
            }
        }
        for (int64_t kb = 0; kb < K; kb += k_kc) {
            const int kc = int(std::min<int64_t>(k_kc, K - kb));
            for (int j = 0; j < k_nr; ++j) {
                const float * wr = wd + (o0 + std::min(j, nv - 1)) * ldw + kb;
                for (int k = 0; k < kc; ++k) {
                    wp[k * k_nr + j] = j < nv ? wr[k] : 0.0f;
                }
            }
            for (int64_t t = t0; t < t1; t += k_mr) {
                const float * xt = xd + t * ldx + kb;
                float *       yt = yd + t * ldy + o0;
                switch (std::min<int64_t>(k_mr, t1 - t)) {
                    case 6: gemm_tile<6>(kc, xt, ldx, wp, yt, ldy, nv); break;
                    case 5: gemm_tile<5>(kc, xt, ldx, wp, yt, ldy, nv); break;
                    case 4: gemm_tile<4>(kc, xt, ldx, wp, yt, ldy, nv); break;
                    case 3: gemm_tile<3>(kc, xt, ldx, wp, yt, ldy, nv); break;
                    case 2: gemm_tile<2>(kc, xt, ldx, wp, yt, ldy, nv); break;
                    default: gemm_tile<1>(kc, xt, ldx, wp, yt, ldy, nv); break;
                }
            }
        }
    }
}

// ggml_custom_4d: src = { x, w, b, r }
void gemm_op(ggml_tensor * dst, int ith, int nth, void *) {
    gemm_run({ dst->src[0], dst->src[1], dst->src[2], dst->src[3], dst }, ith, nth);
}

// ggml_custom_inplace on r: src = { r, x, w, b }
void gemm_acc_op(ggml_tensor * dst, int ith, int nth, void *) {
    gemm_run({ dst->src[1], dst->src[2], dst->src[3], dst->src[0], dst }, ith, nth);
}

// expm1 for x <= 0, 8 lanes: x = n ln2 + r, |r| <= ln2 / 2, expm1(x) = 2^n expm1(r) + 2^n - 1
// with a degree-8 Taylor polynomial for expm1(r) (relative error < 1e-7 near 0).
QT_AVX2 inline __m256 expm1_neg(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 40320.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 5040.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_mul_ps(p, r);  // expm1(r)
    const __m256 scale = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
    return _mm256_fmadd_ps(scale, p, _mm256_sub_ps(scale, _mm256_set1_ps(1.0f)));
}

QT_AVX2 void elu_row_avx2(const float * x, float * y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256 neg = expm1_neg(_mm256_min_ps(v, _mm256_setzero_ps()));
        _mm256_storeu_ps(y + i, _mm256_blendv_ps(neg, v, _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_GT_OQ)));
    }
    for (; i < n; ++i) {
        y[i] = x[i] > 0.0f ? x[i] : std::expm1(x[i]);
    }
}

#endif  // QT_ENC_X86

// dst (C, left + T + right) = zero-padded ELU of src[0] (C, T); userdata = left.
void elu_pad_op(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const ggml_tensor * x = dst->src[0];
    const int64_t       C = x->ne[0];
    const int64_t       T = x->ne[1];
    const int64_t       left = int64_t(reinterpret_cast<intptr_t>(userdata));
    int64_t             first = 0, last = 0;
    split_rows(dst->ne[1], ith, nth, &first, &last);
    for (int64_t t = first; t < last; ++t) {
        float * y = reinterpret_cast<float *>(static_cast<char *>(dst->data) + t * dst->nb[1]);
        const int64_t src = t - left;
        if (src < 0 || src >= T) {
            memset(y, 0, size_t(C) * sizeof(float));
            continue;
        }
        const float * xr = reinterpret_cast<const float *>(static_cast<const char *>(x->data) + src * x->nb[1]);
#ifdef QT_ENC_X86
        if (use_avx2()) {
            elu_row_avx2(xr, y, C);
            continue;
        }
#endif
        for (int64_t c = 0; c < C; ++c) {
            y[c] = xr[c] > 0.0f ? xr[c] : std::expm1(xr[c]);
        }
    }
}

// ELU(x) (alpha 1) with `left` / `right` zero frames around it; ELU(0) = 0, so this is also
// the zero padding of ELU(x) that the causal conv after it needs.
ggml_tensor * elu_pad(ggml_context * ctx, ggml_tensor * x, int64_t left, int64_t right) {
    GGML_ASSERT(x->type == GGML_TYPE_F32 && x->nb[0] == sizeof(float) && x->ne[2] == 1 && x->ne[3] == 1);
    ggml_tensor * args[] = { x };
    return ggml_custom_4d(ctx, GGML_TYPE_F32, x->ne[0], left + x->ne[1] + right, 1, 1, args, 1, elu_pad_op,
                          GGML_N_TASKS_MAX, reinterpret_cast<void *>(intptr_t(left)));
}

// y (N, T, B) = W^T x (+ b) (+ r) for x = (K, T, B), W = (K, N, Bw): matrix products with the
// bias and a residual folded in. With `r_in_place`, y overwrites r (r must have no later use).
ggml_tensor * dense(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, ggml_tensor * b = nullptr,
                    ggml_tensor * r = nullptr, bool r_in_place = false) {
    GGML_ASSERT(w->ne[0] == x->ne[0] && x->ne[2] % w->ne[2] == 0 && x->ne[3] == 1 && w->ne[3] == 1);
    GGML_ASSERT(!r || (r->ne[0] == w->ne[1] && r->ne[1] == x->ne[1] && r->ne[2] == x->ne[2]));
#ifdef QT_ENC_X86
    if (use_avx2() && w->type == GGML_TYPE_F32 && x->type == GGML_TYPE_F32 && w->nb[0] == sizeof(float) &&
        x->nb[0] == sizeof(float) && (!b || ggml_is_contiguous(b)) && (!r || ggml_is_contiguous(r))) {
        if (r && r_in_place) {
            ggml_tensor * args[] = { x, w, b };
            return ggml_custom_inplace(ctx, r, args, 3, gemm_acc_op, GGML_N_TASKS_MAX, nullptr);
        }
        ggml_tensor * args[] = { x, w, b, r };
        return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], x->ne[1], x->ne[2], 1, args, 4, gemm_op, GGML_N_TASKS_MAX,
                              nullptr);
    }
#endif
    ggml_tensor * y = ggml_mul_mat(ctx, w, x);
    if (b) {
        y = ggml_add(ctx, y, b);
    }
    return r ? ggml_add(ctx, y, r) : y;
}

} // namespace

codec_encoder::conv codec_encoder::load_conv(model_loader & ml, const std::string & name, int64_t c_in, int64_t c_out,
                                             int kernel, int stride, int dilation, pad_mode pad, bool bias) {
    conv c;
    c.w = ml.require(name + ".weight", { c_in, c_out, kernel });
    c.b = bias ? ml.require(name + ".bias", { c_out }) : nullptr;
    c.kernel = kernel;
    c.stride = stride;
    c.dilation = dilation;
    c.pad = pad;
    return c;
}

void codec_encoder::load(model_loader & ml) {
    const std::string & path = ml.path();
    hp_.sample_rate = int(ml.get_u32(QT_KEY_CENC_SAMPLE_RATE));
    hp_.frame_samples = int(ml.get_u32(QT_KEY_CENC_FRAME_SAMPLES));
    hp_.hidden = int(ml.get_u32(QT_KEY_CENC_HIDDEN));
    hp_.num_filters = int(ml.get_u32(QT_KEY_CENC_NUM_FILTERS));
    hp_.residual_layers = int(ml.get_u32(QT_KEY_CENC_RES_LAYERS));
    hp_.ratios = ml.get_i32_array(QT_KEY_CENC_RATIOS);
    hp_.kernel_size = int(ml.get_u32(QT_KEY_CENC_KERNEL));
    hp_.last_kernel_size = int(ml.get_u32(QT_KEY_CENC_LAST_KERNEL));
    hp_.residual_kernel_size = int(ml.get_u32(QT_KEY_CENC_RES_KERNEL));
    hp_.dilation_growth = int(ml.get_u32(QT_KEY_CENC_DILATION_GROWTH));
    hp_.compress = int(ml.get_u32(QT_KEY_CENC_COMPRESS));
    hp_.layers = int(ml.get_u32(QT_KEY_CENC_LAYERS));
    hp_.heads = int(ml.get_u32(QT_KEY_CENC_HEADS));
    hp_.kv_heads = int(ml.get_u32(QT_KEY_CENC_KV_HEADS));
    hp_.head_dim = int(ml.get_u32(QT_KEY_CENC_HEAD_DIM));
    hp_.ffn = int(ml.get_u32(QT_KEY_CENC_FFN));
    hp_.norm_eps = ml.get_f32(QT_KEY_CENC_NORM_EPS);
    hp_.rope_theta = ml.get_f32(QT_KEY_CENC_ROPE_THETA);
    hp_.sliding_window = int(ml.get_u32(QT_KEY_CENC_SLIDING_WINDOW));
    hp_.codebook_size = int(ml.get_u32(QT_KEY_CENC_CODEBOOK_SIZE));
    hp_.codebook_dim = int(ml.get_u32(QT_KEY_CENC_CODEBOOK_DIM));
    hp_.semantic_quantizers = int(ml.get_u32(QT_KEY_CENC_SEMANTIC_Q));
    hp_.valid_quantizers = int(ml.get_u32(QT_KEY_CENC_VALID_Q));
    hp_.pad = parse_pad_mode(path, ml.get_str(QT_KEY_CENC_PAD_MODE));
    const float frame_rate = ml.get_f32(QT_KEY_CENC_FRAME_RATE);
    const float encoder_frame_rate = ml.get_f32(QT_KEY_CENC_ENCODER_FRAME_RATE);

    // MimiModel's downsample: kernel 2 * int(encodec_frame_rate / frame_rate), stride 2 (fixed)
    hp_.downsample_kernel = frame_rate > 0.0f ? 2 * int(encoder_frame_rate / frame_rate) : 0;
    hp_.downsample_stride = 2;

    int64_t hop = 1;
    for (int32_t r : hp_.ratios) {
        hop *= r > 0 ? r : 0;
    }
    const bool geometry_ok =
        !hp_.ratios.empty() && hop > 0 && hp_.num_filters > 0 && hp_.hidden > 0 && hp_.kernel_size > 0 &&
        hp_.last_kernel_size > 0 && hp_.residual_kernel_size > 0 && hp_.dilation_growth > 0 && hp_.compress > 0 &&
        hp_.layers >= 0 && hp_.heads > 0 && hp_.kv_heads > 0 && hp_.heads % hp_.kv_heads == 0 && hp_.head_dim > 0 &&
        hp_.ffn > 0 && hp_.codebook_size > 0 && hp_.codebook_dim > 0 && hp_.semantic_quantizers > 0 &&
        hp_.valid_quantizers >= hp_.semantic_quantizers && hp_.downsample_kernel >= hp_.downsample_stride &&
        encoder_frame_rate != frame_rate && hop * hp_.downsample_stride == hp_.frame_samples &&
        (hp_.num_filters << hp_.ratios.size()) % hp_.compress == 0;
    if (!geometry_ok) {
        throw error(QT_STATUS_INVALID_PARAMS,
                    format("%s: unsupported codec encoder geometry (%zu SEANet ratios with hop %lld, frame %d samples, "
                           "downsample kernel %d, %d/%d heads, %d/%d quantizers)",
                           path.c_str(), hp_.ratios.size(), (long long) hop, hp_.frame_samples, hp_.downsample_kernel,
                           hp_.heads, hp_.kv_heads, hp_.semantic_quantizers, hp_.valid_quantizers));
    }

    // SEANet (MimiEncoder): HF layer indices are kept in the tensor names. Layer 0 is the input
    // conv; each stage (ratios reversed) has `residual_layers` resnet blocks, an ELU and the
    // strided conv; then an ELU and the output conv.
    const std::string pre = "cenc.seanet.";
    first_ = load_conv(ml, pre + "0", 1, hp_.num_filters, hp_.kernel_size, 1, 1, hp_.pad, true);
    int     index = 1;
    int64_t dim = hp_.num_filters;
    stages_.clear();
    for (auto it = hp_.ratios.rbegin(); it != hp_.ratios.rend(); ++it) {
        const int    ratio = *it;
        seanet_stage st;
        int          dilation = 1;
        for (int j = 0; j < hp_.residual_layers; ++j) {
            const std::string p = pre + std::to_string(index++) + ".block";
            res_block rb;
            rb.c1 = load_conv(ml, p + "1", dim, dim / hp_.compress, hp_.residual_kernel_size, 1, dilation, hp_.pad, true);
            rb.c2 = load_conv(ml, p + "3", dim / hp_.compress, dim, 1, 1, 1, hp_.pad, true);
            st.res.push_back(rb);
            dilation *= hp_.dilation_growth;
        }
        ++index;  // ELU
        st.down = load_conv(ml, pre + std::to_string(index++), dim, 2 * dim, 2 * ratio, ratio, 1, hp_.pad, true);
        stages_.push_back(std::move(st));
        dim *= 2;
    }
    ++index;  // ELU
    last_ = load_conv(ml, pre + std::to_string(index), dim, hp_.hidden, hp_.last_kernel_size, 1, 1, hp_.pad, true);

    const int64_t H = hp_.hidden;
    const int64_t q_dim = int64_t(hp_.heads) * hp_.head_dim;
    const int64_t kv_dim = int64_t(hp_.kv_heads) * hp_.head_dim;
    layers_.clear();
    for (int i = 0; i < hp_.layers; ++i) {
        const std::string p = "cenc.blk." + std::to_string(i) + ".";
        layer l;
        l.attn_norm_w = ml.require(p + "attn_norm.weight", { H });
        l.attn_norm_b = ml.require(p + "attn_norm.bias", { H });
        l.q = ml.require(p + "attn_q.weight", { H, q_dim });
        l.k = ml.require(p + "attn_k.weight", { H, kv_dim });
        l.v = ml.require(p + "attn_v.weight", { H, kv_dim });
        l.o = ml.require(p + "attn_o.weight", { q_dim, H });
        l.attn_scale = ml.require(p + "attn_scale", { H });
        l.ffn_norm_w = ml.require(p + "ffn_norm.weight", { H });
        l.ffn_norm_b = ml.require(p + "ffn_norm.bias", { H });
        l.up = ml.require(p + "ffn_up.weight", { H, hp_.ffn });
        l.down = ml.require(p + "ffn_down.weight", { hp_.ffn, H });
        l.ffn_scale = ml.require(p + "ffn_scale", { H });
        layers_.push_back(l);
    }
    downsample_ = load_conv(ml, "cenc.downsample", H, H, hp_.downsample_kernel, hp_.downsample_stride, 1,
                            pad_mode::replicate, false);

    // Split RVQ: both groups quantize the latent (each through its own input projection); the
    // acoustic group does not see the semantic residual.
    auto load_rvq = [&](const std::string & p, int n_books) {
        rvq q;
        // MimiResidualVectorQuantizer has no input_proj when the dimensions agree
        if (ml.has_tensor(p + ".in_proj.weight") || H != hp_.codebook_dim) {
            q.in_proj = ml.require(p + ".in_proj.weight", { H, hp_.codebook_dim, 1 });
        }
        for (int j = 0; j < n_books; ++j) {
            q.codebooks.push_back(ml.require(p + ".codebook." + std::to_string(j), { hp_.codebook_dim, hp_.codebook_size }));
        }
        return q;
    };
    semantic_ = load_rvq("cenc.rvq_sem", hp_.semantic_quantizers);
    acoustic_ = load_rvq("cenc.rvq_ac", hp_.valid_quantizers - hp_.semantic_quantizers);

    prepare_derived(ml);
}

// Unfolded convolution weights and squared codebook norms, computed once on the host into a
// buffer of our own.
void codec_encoder::prepare_derived(model_loader & ml) {
    std::vector<conv *> convs = { &first_, &last_, &downsample_ };
    for (auto & st : stages_) {
        for (auto & rb : st.res) {
            convs.push_back(&rb.c1);
            convs.push_back(&rb.c2);
        }
        convs.push_back(&st.down);
    }
    const size_t n_books = semantic_.codebooks.size() + acoustic_.codebooks.size();
    ggml_init_params params = {
        /*.mem_size   =*/ ggml_tensor_overhead() * (convs.size() + n_books + 1),
        /*.mem_buffer =*/ nullptr,
        /*.no_alloc   =*/ true,
    };
    derived_ctx_.reset(ggml_init(params));
    if (!derived_ctx_) {
        throw error(QT_STATUS_OUT_OF_MEMORY, "cannot allocate the codec encoder's weight context");
    }
    ggml_context * ctx = derived_ctx_.get();
    std::vector<conv *> unfold;
    for (conv * c : convs) {
        // a 1-tap conv needs no rearrangement: its (C_in, C_out, 1) weight is already the matrix
        if (c->dilation == 1 && c->kernel > 1) {
            c->unfolded = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c->w->ne[0] * c->kernel, c->w->ne[1]);
            unfold.push_back(c);
        }
    }
    for (rvq * q : { &semantic_, &acoustic_ }) {
        q->norms.clear();
        for (size_t j = 0; j < q->codebooks.size(); ++j) {
            q->norms.push_back(ggml_new_tensor_1d(ctx, GGML_TYPE_F32, hp_.codebook_size));
        }
    }
    derived_buf_.reset(ggml_backend_alloc_ctx_tensors_from_buft(ctx, ggml_backend_cpu_buffer_type()));
    if (!derived_buf_) {
        throw error(QT_STATUS_OUT_OF_MEMORY, format("not enough memory for the codec encoder of %s", ml.path().c_str()));
    }
    ggml_backend_buffer_set_usage(derived_buf_.get(), GGML_BACKEND_BUFFER_USAGE_WEIGHTS);

    for (conv * c : unfold) {
        const int64_t c_in = c->w->ne[0];
        const int64_t c_out = c->w->ne[1];
        const int64_t K = c->kernel;
        const std::vector<float> w = weight_f32(c->w);  // [K][C_out][C_in]
        std::vector<float>       u(w.size());           // [C_out][K][C_in]
        for (int64_t k = 0; k < K; ++k) {
            for (int64_t o = 0; o < c_out; ++o) {
                memcpy(&u[size_t((o * K + k) * c_in)], &w[size_t((k * c_out + o) * c_in)], size_t(c_in) * sizeof(float));
            }
        }
        ggml_backend_tensor_set(c->unfolded, u.data(), 0, u.size() * sizeof(float));
    }
    for (rvq * q : { &semantic_, &acoustic_ }) {
        for (size_t j = 0; j < q->codebooks.size(); ++j) {
            const std::vector<float> cb = weight_f32(q->codebooks[j]);
            std::vector<float>       norms(size_t(hp_.codebook_size));
            for (int64_t e = 0; e < hp_.codebook_size; ++e) {
                double acc = 0.0;
                for (int64_t d = 0; d < hp_.codebook_dim; ++d) {
                    const double v = cb[size_t(e * hp_.codebook_dim + d)];
                    acc += v * v;
                }
                norms[size_t(e)] = float(acc);
            }
            ggml_backend_tensor_set(q->norms[j], norms.data(), 0, norms.size() * sizeof(float));
        }
    }
}

// MimiConv1d in causal mode: left padding (K - 1) * dilation + 1 - stride, and right padding
// so that the last window is complete, both in the conv's pad mode. The output has
// ceil(T / stride) frames. With `elu`, the conv reads ELU(x) (fused with the zero padding);
// `residual` (C_out, T_out) is added to the output, which may take over its memory.
ggml_tensor * codec_encoder::conv_forward(ggml_context * ctx, ggml_tensor * x, const conv & c, bool elu,
                                          ggml_tensor * residual) const {
    const int64_t T = x->ne[1];
    const int64_t s = c.stride;
    const int64_t k_eff = int64_t(c.kernel - 1) * c.dilation + 1;
    const int64_t left = k_eff - s;
    const int64_t n_out = (T + s - 1) / s;
    const int64_t right = n_out * s - T;
    if (elu && c.pad == pad_mode::zeros) {
        x = elu_pad(ctx, x, left, right);
    } else {
        if (elu) {
            x = ggml_elu(ctx, x);
        }
        if (c.pad == pad_mode::reflect && T <= std::max(left, right)) {
            // MimiConv1d._pad1d zero-extends such short inputs first; never the case at >= 1 s
            throw error(QT_STATUS_INVALID_PARAMS, "codec encoder: input too short for reflect padding");
        }
        x = pad_time(ctx, x, int(left), int(right), c.pad);
    }
    if (!ggml_is_contiguous(x)) {
        x = ggml_cont(ctx, x);
    }
    ggml_tensor * y = nullptr;
    if (c.kernel == 1) {
        y = dense(ctx, ggml_reshape_2d(ctx, c.w, c.w->ne[0], c.w->ne[1]),
                  s == 1 ? x : ggml_view_2d(ctx, x, x->ne[0], n_out, size_t(s) * x->nb[1], 0), c.b, residual, true);
    } else if (c.unfolded) {
        y = dense(ctx, c.unfolded, sliding_windows(ctx, x, c.kernel, s), c.b, residual, true);
    } else {
        y = conv1d(ctx, x, c.w, c.b, int(s), c.dilation);
        if (residual) {
            y = ggml_add(ctx, y, residual);
        }
    }
    GGML_ASSERT(y->ne[1] == n_out);
    return y;
}

ggml_tensor * codec_encoder::transformer_layer(ggml_context * ctx, ggml_tensor * x, ggml_tensor * pos,
                                               const layer & l) const {
    const int64_t T = x->ne[1];
    const int     hd = hp_.head_dim;
    ggml_tensor * h = layer_norm(ctx, x, l.attn_norm_w, l.attn_norm_b, hp_.norm_eps);

    // RoPE with rotate_half (NEOX layout), theta rope_theta, positions 0..T-1
    auto rope = [&](ggml_tensor * t) {
        return ggml_rope_ext(ctx, t, pos, nullptr, hd, GGML_ROPE_TYPE_NEOX, 0, hp_.rope_theta, 1.0f, 0.0f, 1.0f,
                             0.0f, 0.0f);
    };
    ggml_tensor * q = rope(ggml_reshape_3d(ctx, dense(ctx, l.q, h), hd, hp_.heads, T));
    ggml_tensor * k = rope(ggml_reshape_3d(ctx, dense(ctx, l.k, h), hd, hp_.kv_heads, T));
    ggml_tensor * v = ggml_reshape_3d(ctx, dense(ctx, l.v, h), hd, hp_.kv_heads, T);

    q = ggml_permute(ctx, q, 0, 2, 1, 3);                                 // (hd, T, heads)
    k = ggml_permute(ctx, k, 0, 2, 1, 3);                                 // (hd, T, kv_heads)
    ggml_tensor * vt = ggml_cont(ctx, ggml_permute(ctx, v, 1, 2, 0, 3));  // (T, hd, kv_heads)

    // Full causal attention: transformers' MimiTransformerModel builds its mask with
    // create_causal_mask, which ignores config.sliding_window (250 frames = 10 s), so clips
    // longer than that attend to their whole past in the reference too.
    ggml_tensor * kq = dense(ctx, k, q);  // (T_k, T_q, heads)
    kq = ggml_diag_mask_inf(ctx, kq, 0);
    kq = ggml_soft_max_ext(ctx, kq, nullptr, 1.0f / std::sqrt(float(hd)), 0.0f);
    ggml_tensor * a = dense(ctx, vt, kq);  // (hd, T, heads)
    a = ggml_cont(ctx, ggml_permute(ctx, a, 0, 2, 1, 3));
    a = dense(ctx, l.o, ggml_reshape_2d(ctx, a, int64_t(hd) * hp_.heads, T));
    x = ggml_add(ctx, x, ggml_mul(ctx, a, l.attn_scale));

    h = layer_norm(ctx, x, l.ffn_norm_w, l.ffn_norm_b, hp_.norm_eps);
    h = dense(ctx, l.down, ggml_gelu_erf(ctx, dense(ctx, l.up, h)));  // exact (erf) GELU
    return ggml_add(ctx, x, ggml_mul(ctx, h, l.ffn_scale));
}

// Residual vector quantization of latent = (hidden, T) with the first n_books codebooks:
// nearest entry by euclidean distance, i.e. argmax over entries of 2 r.c - |c|^2.
std::vector<ggml_tensor *> codec_encoder::quantize(ggml_context * ctx, ggml_tensor * latent, const rvq & q,
                                                   int n_books) const {
    ggml_tensor * r = latent;
    if (q.in_proj) {
        r = dense(ctx, ggml_reshape_2d(ctx, q.in_proj, q.in_proj->ne[0], q.in_proj->ne[1]), latent);
    }
    std::vector<ggml_tensor *> codes;
    for (int j = 0; j < n_books; ++j) {
        ggml_tensor * cb = q.codebooks[size_t(j)];
        ggml_tensor * score = ggml_sub(ctx, ggml_scale(ctx, dense(ctx, cb, r), 2.0f), q.norms[size_t(j)]);
        ggml_tensor * idx = ggml_argmax(ctx, score);  // (T) i32
        codes.push_back(idx);
        if (j + 1 < n_books) {
            r = ggml_sub(ctx, r, ggml_get_rows(ctx, cb, idx));
        }
    }
    return codes;
}

std::vector<int32_t> codec_encoder::encode(const cpu_backend & backend, const stage_dumper & dumper, const float * pcm,
                                           int64_t n_samples, int64_t * n_frames) const {
    if (n_samples <= 0) {
        throw error(QT_STATUS_INVALID_PARAMS, "codec encoder: empty clip");
    }
    graph_run     run(backend, dumper, 8192);
    ggml_context * ctx = run.ctx();

    // SEANet: (1, N) at 24 kHz -> (hidden, T25)
    ggml_tensor * x = run.input_f32("pcm", pcm, { 1, n_samples });
    x = conv_forward(ctx, x, first_);
    for (const seanet_stage & st : stages_) {
        for (const res_block & rb : st.res) {
            ggml_tensor * h = conv_forward(ctx, x, rb.c1, true);
            x = conv_forward(ctx, h, rb.c2, true, x);  // x + conv(ELU(h)), into x's memory
        }
        x = conv_forward(ctx, x, st.down, true);
    }
    x = conv_forward(ctx, x, last_, true);
    x = run.stage(x, "enc_seanet");

    const int64_t T25 = x->ne[1];
    std::vector<int32_t> positions(static_cast<size_t>(T25));
    for (int64_t t = 0; t < T25; ++t) {
        positions[size_t(t)] = int32_t(t);
    }
    ggml_tensor * pos = run.input_i32("positions", positions.data(), { T25 });
    for (const layer & l : layers_) {
        x = transformer_layer(ctx, x, pos, l);
    }
    x = run.stage(x, "enc_transformer");

    x = run.stage(conv_forward(ctx, x, downsample_), "enc_latent");
    const int64_t T12 = x->ne[1];

    std::vector<ggml_tensor *> books = quantize(ctx, x, semantic_, hp_.semantic_quantizers);
    std::vector<ggml_tensor *> acoustic = quantize(ctx, x, acoustic_, hp_.valid_quantizers - hp_.semantic_quantizers);
    books.insert(books.end(), acoustic.begin(), acoustic.end());

    ggml_tensor * all = ggml_reshape_2d(ctx, books[0], T12, 1);
    for (size_t q = 1; q < books.size(); ++q) {
        all = ggml_concat(ctx, all, ggml_reshape_2d(ctx, books[q], T12, 1), 1);
    }
    run.compute(all);  // (T12, Q): codebook-major

    // Qwen3TTSTokenizerV2Model.encode keeps ceil(n_samples / frame_samples) frames
    const int64_t keep = (n_samples + hp_.frame_samples - 1) / hp_.frame_samples;
    if (keep > T12) {
        throw error(QT_STATUS_FAILED, format("codec encoder produced %lld frames, %lld expected", (long long) T12,
                                             (long long) keep));
    }
    const int64_t              Q = int64_t(books.size());
    const std::vector<int32_t> by_book = run.read_i32(all);
    std::vector<int32_t>       codes(size_t(keep * Q));
    for (int64_t q = 0; q < Q; ++q) {
        for (int64_t t = 0; t < keep; ++t) {
            codes[size_t(t * Q + q)] = by_book[size_t(q * T12 + t)];
        }
    }
    if (dumper.enabled()) {
        dumper.write("ref_codes", codes.data(), { keep, Q });
    }
    *n_frames = keep;
    return codes;
}

} // namespace qt
