#include "mat-vecs.h"

#include "backend-loader.h"
#include "cpu-ops.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#    include <immintrin.h>
#    define QT_MATVEC_X86  1
#    define QT_MATVEC_AVX2 __attribute__((target("avx2,fma,f16c")))
#    if !defined(__clang__)
// GCC 12's AVX512 intrinsics pass an undefined vector (a self-initialised variable) as the unused
// merge operand, which -Wmaybe-uninitialized reports at every use.
#        pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#    endif
#endif

namespace qt {

namespace {

// Weight rows a thread takes at a time (as ggml's own chunks); thread ith takes chunks ith,
// ith + nth, ...
constexpr int64_t k_chunk_rows = 16;

// Most columns a product converts in every thread (a few microseconds, where a conversion node
// of its own costs a barrier); past this (a prefill) one node converts them, split by column, and
// the q8_0 kernels, whose column sums sit in registers, leave them to ggml's vec_dot.
constexpr int k_max_columns = 32;

const ggml_type_traits_cpu * traits_of(ggml_type type) {
    // looked up once: cpu_backend_loaded() takes a lock, and every run of the ops below asks
    static const auto get = cpu_backend_loaded().type_traits;
    return get ? get(type) : nullptr;
}

// ggml custom op: dst (row_bytes, B) i8 = the columns of src0 = x (K, B) f32 in the dot type of
// src1 = W, as ggml_mul_mat converts its second operand. Threads split each column by blocks.
void convert_op(ggml_tensor * dst, int ith, int nth, void * /*userdata*/) {
    const ggml_tensor *          x = dst->src[0];
    const ggml_type              dot_type = traits_of(dst->src[1]->type)->vec_dot_type;
    const ggml_type_traits_cpu * to = traits_of(dot_type);
    const int64_t                k = x->ne[0];
    const int64_t                block = ggml_blck_size(dot_type);
    const int64_t                n_blocks = k / block;
    const int64_t                b0 = n_blocks * ith / nth, b1 = n_blocks * (ith + 1) / nth;
    if (b1 <= b0) {
        return;
    }
    for (int64_t c = 0; c < x->ne[1]; ++c) {
        const float * src = reinterpret_cast<const float *>(static_cast<const char *>(x->data) + c * x->nb[1]);
        char *        out = static_cast<char *>(dst->data) + c * dst->nb[1];
        to->from_float(src + b0 * block, out + b0 * ggml_type_size(dot_type), (b1 - b0) * block);
    }
}


// A product's share of thread ith of nth, its columns already in the weight's dot type.
using rows_kernel = void (*)(const ggml_tensor * w, const char * xq, size_t xq_stride, ggml_tensor * dst, int ith,
                             int nth);

#ifdef QT_MATVEC_X86

// ggml's q4_K and q8_K blocks (ggml-common.h, which ggml does not install), checked against
// ggml's sizes where the kernel is chosen.
constexpr int k_qk = 256;
struct block_q4_k {
    uint16_t d, dmin;     // f16
    uint8_t  scales[12];  // 8 scales and 8 mins of 6 bits
    uint8_t  qs[k_qk / 2];
};
struct block_q8_k {
    float   d;
    int8_t  qs[k_qk];
    int16_t bsums[k_qk / 16];
};
static_assert(sizeof(block_q4_k) == 144 && sizeof(block_q8_k) == 292, "ggml's block layouts");

constexpr int k_q8_0 = 32;
struct block_q8_0 {
    uint16_t d;  // f16
    int8_t   qs[k_q8_0];
};
static_assert(sizeof(block_q8_0) == 34, "ggml's block layout");

constexpr int k_group_columns = 8;

// How far ahead of the block in hand the row kernels ask for weights: a thread's rows are one
// contiguous range, and a lone column leaves the kernel waiting on memory without it (the
// talker's q4_K step, Intel Xeon: 12.2 -> 10.2 ms at 4 KiB, 1 and 2 KiB gave less).
constexpr int k_prefetch_bytes = 4096;

// (always inlined: the AVX512 kernels below call it too)
__attribute__((always_inline, target("avx2,fma,f16c"))) inline float hsum_float_8(__m256 x) {
    __m128 res = _mm256_extractf128_ps(x, 1);
    res = _mm_add_ps(res, _mm256_castps256_ps128(x));
    res = _mm_add_ps(res, _mm_movehl_ps(res, res));
    res = _mm_add_ss(res, _mm_movehdup_ps(res));
    return _mm_cvtss_f32(res);
}

// The pieces both q4_K row dots below share, always inlined like hsum_float_8.
#define QT_Q4K_SHARED __attribute__((always_inline, target("avx2,fma,f16c"))) inline

// Asks for the weights k_prefetch_bytes ahead of a block (its 144 bytes span three lines).
QT_Q4K_SHARED void prefetch_q4k_block(const block_q4_k * x) {
    for (int line = 0; line < 3; ++line) {
        _mm_prefetch(reinterpret_cast<const char *>(x) + k_prefetch_bytes + 64 * line, _MM_HINT_T0);
    }
}

// A block's 8 sub-block scales (bytes 0-7 of utmp) and 8 mins (bytes 8-15), each 6 bits, as
// ggml's q4_K dot unpacks them.
QT_Q4K_SHARED void unpack_q4k_scales(const block_q4_k & x, uint32_t utmp[4]) {
    constexpr uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
    memcpy(utmp, x.scales, 12);
    utmp[3] = ((utmp[2] >> 4) & kmask2) | (((utmp[1] >> 6) & kmask3) << 4);
    const uint32_t uaux = utmp[1] & kmask1;
    utmp[1] = (utmp[2] & kmask2) | (((utmp[0] >> 6) & kmask3) << 4);
    utmp[2] = uaux;
    utmp[0] &= kmask1;
}

// A column's mins term of one block added to acc_m: the mins (8 words) against the column's
// eight 32-value sums of that block, times dmin.
QT_Q4K_SHARED __m128 add_q4k_mins(__m128 acc_m, __m128i mins, const int16_t * sums, float dmin) {
    const __m128i column_sums = _mm_loadu_si128(reinterpret_cast<const __m128i *>(sums));
    return _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(_mm_madd_epi16(mins, column_sums)), acc_m);
}

// A row's dot from its scaled lanes and its mins term, in ggml's order.
QT_Q4K_SHARED float finish_q4k_dot(__m256 acc, __m128 acc_m) {
    __m128 m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    return hsum_float_8(acc) + _mm_cvtss_f32(m);
}

// The row kernels below take a fixed count of columns, COLS, which keeps each column's sums in
// registers; the rows kernels take any count in groups of up to k_group_columns.

// One q4_K row against the q8_K columns: out[c] is bit for bit ggml_vec_dot_q4_K_q8_K (its AVX2
// path, which every ggml variant with AVX2 runs) of the row and column c. The row's nibbles and
// scales are unpacked once per block for all the columns; each column then takes the same
// integer lanes (exact, so formed by any instructions in any order) and the same float
// operations in the same order. q8s + (c * nb + i) * 8: the eight 32-value sums of column c's
// block i, as that function forms them. ADD_SCALED adds `pairs`, the 16-bit sums of byte pairs,
// times the sub-block's scale[h] to the 32-bit lanes of sumi; TARGET names the instruction sets
// it needs.
#define QT_Q4K_ROW_DOT(NAME, TARGET, ADD_SCALED)                                                                       \
    struct NAME {                                                                                                      \
        template <int COLS>                                                                                            \
        __attribute__((target(TARGET))) static void dot(const block_q4_k * x, int nb, const block_q8_k * const * ys,   \
                                                        const int16_t * q8s, float * out) {                            \
            constexpr int cols = COLS;                                                                                 \
            __m256        acc[COLS];                                                                                   \
            __m128        acc_m[COLS];                                                                                 \
            for (int c = 0; c < cols; ++c) {                                                                           \
                acc[c] = _mm256_setzero_ps();                                                                          \
                acc_m[c] = _mm_setzero_ps();                                                                           \
            }                                                                                                          \
            const __m256i      m4 = _mm256_set1_epi8(0xF);                                                             \
            for (int i = 0; i < nb; ++i) {                                                                             \
                prefetch_q4k_block(x + i);                                                                             \
                const float xd = _cvtsh_ss(x[i].d);                                                                    \
                const float xdmin = _cvtsh_ss(x[i].dmin);                                                              \
                uint32_t    utmp[4];                                                                                   \
                unpack_q4k_scales(x[i], utmp);                                                                         \
                const uint8_t * sc = reinterpret_cast<const uint8_t *>(utmp); /* 8 scales, then 8 mins */              \
                const __m128i   mins = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, int(utmp[3]), int(utmp[2])));             \
                __m256i         q4[8], scale[8];                                                                       \
                for (int j = 0; j < k_qk / 64; ++j) {                                                                  \
                    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(x[i].qs + 32 * j));      \
                    q4[2 * j] = _mm256_and_si256(bits, m4);                                                            \
                    q4[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);                                  \
                    scale[2 * j] = _mm256_set1_epi16(int16_t(sc[2 * j]));                                              \
                    scale[2 * j + 1] = _mm256_set1_epi16(int16_t(sc[2 * j + 1]));                                      \
                }                                                                                                      \
                for (int c = 0; c < cols; ++c) {                                                                       \
                    const block_q8_k & y = ys[c][i];                                                                   \
                    const float        d = y.d * xd;                                                                   \
                    const float        dmin = -y.d * xdmin;                                                            \
                    acc_m[c] = add_q4k_mins(acc_m[c], mins, q8s + (size_t(c) * size_t(nb) + size_t(i)) * 8, dmin);     \
                    __m256i sumi = _mm256_setzero_si256();                                                             \
                    for (int h = 0; h < 8; ++h) {                                                                      \
                        const __m256i q8 = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(y.qs + 32 * h));       \
                        const __m256i pairs = _mm256_maddubs_epi16(q4[h], q8);                                         \
                        sumi = ADD_SCALED;                                                                             \
                    }                                                                                                  \
                    acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc[c]);                     \
                }                                                                                                      \
            }                                                                                                          \
            for (int c = 0; c < cols; ++c) {                                                                           \
                out[c] = finish_q4k_dot(acc[c], acc_m[c]);                                                             \
            }                                                                                                          \
        }                                                                                                              \
    };

QT_Q4K_ROW_DOT(q4k_row_dot, "avx2,fma,f16c", _mm256_add_epi32(sumi, _mm256_madd_epi16(scale[h], pairs)))

// The same dot with 512-bit vectors: sub-blocks 2j and 2j + 1 side by side in one register (the
// row's low and high nibbles of the same 32 bytes, against the column's 64 contiguous bytes), so
// each column takes half the instructions; the halves' lanes are added at the end, which gives
// the same exact integer lanes as the 256-bit dot.
#define QT_Q4K_ROW_DOT_512(NAME, TARGET, ADD_SCALED)                                                                     \
    struct NAME {                                                                                                        \
        template <int COLS>                                                                                              \
        __attribute__((target(TARGET))) static void dot(const block_q4_k * x, int nb, const block_q8_k * const * ys,     \
                                                        const int16_t * q8s, float * out) {                              \
            constexpr int cols = COLS;                                                                                   \
            __m256        acc[COLS];                                                                                     \
            __m128        acc_m[COLS];                                                                                   \
            for (int c = 0; c < cols; ++c) {                                                                             \
                acc[c] = _mm256_setzero_ps();                                                                            \
                acc_m[c] = _mm_setzero_ps();                                                                             \
            }                                                                                                            \
            const __m512i      m4 = _mm512_set1_epi8(0xF);                                                               \
            for (int i = 0; i < nb; ++i) {                                                                               \
                prefetch_q4k_block(x + i);                                                                               \
                const float xd = _cvtsh_ss(x[i].d);                                                                      \
                const float xdmin = _cvtsh_ss(x[i].dmin);                                                                \
                uint32_t    utmp[4];                                                                                     \
                unpack_q4k_scales(x[i], utmp);                                                                           \
                const __m128i   mins = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, int(utmp[3]), int(utmp[2])));               \
                /* the 8 scales as words; register j takes scale 2j in its low half, 2j + 1 in its high one */           \
                const __m512i scales = _mm512_castsi128_si512(                                                           \
                    _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, int(utmp[1]), int(utmp[0]))));                                 \
                __m512i q4[4], scale[4];                                                                                 \
                for (int j = 0; j < k_qk / 64; ++j) {                                                                    \
                    /* the 32 bytes in both halves, the high half shifted to its high nibbles */                         \
                    const __m512i bits = _mm512_broadcast_i64x4(                                                         \
                        _mm256_loadu_si256(reinterpret_cast<const __m256i *>(x[i].qs + 32 * j)));                        \
                    q4[j] = _mm512_and_si512(_mm512_mask_srli_epi16(bits, 0xFFFF0000u, bits, 4), m4);                    \
                    scale[j] = _mm512_permutexvar_epi16(                                                                 \
                        _mm512_inserti64x4(_mm512_set1_epi16(int16_t(2 * j)), _mm256_set1_epi16(int16_t(2 * j + 1)), 1), \
                        scales);                                                                                         \
                }                                                                                                        \
                for (int c = 0; c < cols; ++c) {                                                                         \
                    const block_q8_k & y = ys[c][i];                                                                     \
                    const float        d = y.d * xd;                                                                     \
                    const float        dmin = -y.d * xdmin;                                                              \
                    acc_m[c] = add_q4k_mins(acc_m[c], mins, q8s + (size_t(c) * size_t(nb) + size_t(i)) * 8, dmin);       \
                    __m512i sumi = _mm512_setzero_si512();                                                               \
                    for (int j = 0; j < k_qk / 64; ++j) {                                                                \
                        const __m512i pairs = _mm512_maddubs_epi16(q4[j], _mm512_loadu_si512(y.qs + 64 * j));            \
                        sumi = ADD_SCALED;                                                                               \
                    }                                                                                                    \
                    const __m256i halves =                                                                               \
                        _mm256_add_epi32(_mm512_castsi512_si256(sumi), _mm512_extracti64x4_epi64(sumi, 1));              \
                    acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(halves), acc[c]);                     \
                }                                                                                                        \
            }                                                                                                            \
            for (int c = 0; c < cols; ++c) {                                                                             \
                out[c] = finish_q4k_dot(acc[c], acc_m[c]);                                                               \
            }                                                                                                            \
        }                                                                                                                \
    };

QT_Q4K_ROW_DOT_512(q4k_row_dot_512, "avx2,fma,f16c,avx512f,avx512vl,avx512bw",
                   _mm512_add_epi32(sumi, _mm512_madd_epi16(scale[j], pairs)))
// vpdpwssd is vpmaddwd and the add in one instruction
QT_Q4K_ROW_DOT_512(q4k_row_dot_512_vnni, "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
                   _mm512_dpwssd_epi32(sumi, scale[j], pairs))

QT_MATVEC_AVX2 __m128i q8k_sums_of_32(const block_q8_k & y) {
    const __m256i sums = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(y.bsums));
    return _mm_hadd_epi16(_mm256_extracti128_si256(sums, 0), _mm256_extracti128_si256(sums, 1));
}

// ggml's quantize_row_q8_K (its x86 build runs the scalar reference) with AVX2, the same bits for
// finite inputs: the block's scale from its first value of largest magnitude, each value times
// -127 / that value rounded to the nearest integer, ties to even (as the reference's float trick
// rounds), and the 16-value sums. An all-zero block gets zero sums where the reference leaves
// them as they were; its scale is zero, so they add only zeros to any dot product.
QT_MATVEC_AVX2 void quantize_q8_k(const float * x, block_q8_k * y, int64_t k) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < k / k_qk; ++b, x += k_qk) {
        block_q8_k & out = y[b];
        __m256       amax8 = _mm256_setzero_ps();
        for (int j = 0; j < k_qk; j += 8) {
            amax8 = _mm256_max_ps(amax8, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
        }
        __m128 amax4 = _mm_max_ps(_mm256_castps256_ps128(amax8), _mm256_extractf128_ps(amax8, 1));
        amax4 = _mm_max_ps(amax4, _mm_movehl_ps(amax4, amax4));
        amax4 = _mm_max_ss(amax4, _mm_movehdup_ps(amax4));
        const float amax = _mm_cvtss_f32(amax4);
        if (amax == 0.0f) {
            out.d = 0.0f;
            memset(out.qs, 0, sizeof(out.qs));
            memset(out.bsums, 0, sizeof(out.bsums));
            continue;
        }
        float max = 0.0f;
        for (int j = 0; j < k_qk; j += 8) {
            const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j));
            const int    hits = _mm256_movemask_ps(_mm256_cmp_ps(a, _mm256_set1_ps(amax), _CMP_EQ_OQ));
            if (hits) {
                max = x[j + __builtin_ctz(unsigned(hits))];
                break;
            }
        }
        const float   iscale = -127.0f / max;
        const __m256  scale = _mm256_set1_ps(iscale);
        const __m256i top = _mm256_set1_epi32(127);
        for (int g = 0; g < k_qk / 16; ++g) {
            const __m256i lo = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(scale, _mm256_loadu_ps(x + 16 * g))), top);
            const __m256i hi =
                _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(scale, _mm256_loadu_ps(x + 16 * g + 8))), top);
            // packs work within 128-bit lanes: 16-bit values 0-3 8-11 4-7 12-15, then put in order
            const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xD8);
            const __m128i bytes = _mm_packs_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1));
            _mm_storeu_si128(reinterpret_cast<__m128i *>(out.qs + 16 * g), bytes);
            __m128i sum = _mm_add_epi32(_mm256_castsi256_si128(_mm256_add_epi32(lo, hi)),
                                        _mm256_extracti128_si256(_mm256_add_epi32(lo, hi), 1));
            sum = _mm_hadd_epi32(sum, sum);
            sum = _mm_hadd_epi32(sum, sum);
            out.bsums[g] = int16_t(_mm_cvtsi128_si32(sum));
        }
        out.d = 1.0f / iscale;
    }
}

// The rows kernel for q4_K weights with the row dots of ROW_DOT, for any number of columns: thread
// ith of nth takes one contiguous range of rows, the columns' block sums formed once. Past
// k_group_columns columns, rows go by blocks of k_chunk_rows, each block dotted with one group of
// columns after the other: both stay in the first-level cache, and each group's sums in registers.
template <class ROW_DOT>
QT_MATVEC_AVX2 void q4k_rows(const ggml_tensor * w, const char * xq, size_t xq_stride, ggml_tensor * dst, int ith,
                             int nth) {
    const int nb = int(w->ne[0] / k_qk);
    const int cols = int(dst->ne[1]);
    thread_local std::vector<int16_t>            q8s;
    thread_local std::vector<const block_q8_k *> ys;
    q8s.resize(size_t(cols) * size_t(nb) * 8);
    ys.resize(size_t(cols));
    for (int c = 0; c < cols; ++c) {
        ys[size_t(c)] = reinterpret_cast<const block_q8_k *>(xq + size_t(c) * xq_stride);
        for (int i = 0; i < nb; ++i) {
            _mm_storeu_si128(reinterpret_cast<__m128i *>(q8s.data() + (size_t(c) * size_t(nb) + size_t(i)) * 8),
                             q8k_sums_of_32(ys[size_t(c)][i]));
        }
    }
    const int64_t r_end = w->ne[1] * (ith + 1) / nth;
    for (int64_t r0 = w->ne[1] * ith / nth; r0 < r_end; r0 += k_chunk_rows) {
        for (int c0 = 0; c0 < cols; c0 += k_group_columns) {
            const int                  n = std::min(cols - c0, k_group_columns);
            const block_q8_k * const * g_ys = ys.data() + c0;
            const int16_t *            g_q8s = q8s.data() + size_t(c0) * size_t(nb) * 8;
            for (int64_t r = r0; r < std::min(r_end, r0 + k_chunk_rows); ++r) {
                const auto * row = reinterpret_cast<const block_q4_k *>(static_cast<const char *>(w->data) + r * w->nb[1]);
                float        out[k_group_columns];
                switch (n) {
                    case 1: ROW_DOT::template dot<1>(row, nb, g_ys, g_q8s, out); break;
                    case 2: ROW_DOT::template dot<2>(row, nb, g_ys, g_q8s, out); break;
                    case 3: ROW_DOT::template dot<3>(row, nb, g_ys, g_q8s, out); break;
                    case 4: ROW_DOT::template dot<4>(row, nb, g_ys, g_q8s, out); break;
                    case 5: ROW_DOT::template dot<5>(row, nb, g_ys, g_q8s, out); break;
                    case 6: ROW_DOT::template dot<6>(row, nb, g_ys, g_q8s, out); break;
                    case 7: ROW_DOT::template dot<7>(row, nb, g_ys, g_q8s, out); break;
                    default: ROW_DOT::template dot<8>(row, nb, g_ys, g_q8s, out); break;
                }
                for (int c = 0; c < n; ++c) {
                    reinterpret_cast<float *>(static_cast<char *>(dst->data) + (c0 + c) * dst->nb[1])[r] = out[c];
                }
            }
        }
    }
}

// The rows kernel for q8_0 weights: each row against the q8_0 columns, out[c] bit for bit
// ggml_vec_dot_q8_0_q8_0 (its AVX2 path: the lanes' integer sums, exact whichever instructions
// form them, then the same float operations in the same order). The row's absolute values are
// formed once per block, the columns' scales once per call. LANES(ax, sy) forms the eight 32-bit
// sums of four byte products; TARGET names the instruction sets it needs (one function per set:
// a function cannot take instructions its target lacks, inlined or not).
#define QT_Q8_0_ROWS(NAME, TARGET, LANES)                                                                         \
    template <int COLS>                                                                                           \
    __attribute__((target(TARGET))) void NAME(const ggml_tensor * w, const char * xq, size_t xq_stride,           \
                                              ggml_tensor * dst, int ith, int nth) {                              \
        const int          nb = int(w->ne[0] / k_q8_0);                                                           \
        const int          cols = COLS ? COLS : int(dst->ne[1]);                                                  \
        const block_q8_0 * ys[k_max_columns];                                                                     \
        thread_local std::vector<float> yd;                                                                       \
        yd.resize(size_t(cols) * size_t(nb));                                                                     \
        for (int c = 0; c < cols; ++c) {                                                                          \
            ys[c] = reinterpret_cast<const block_q8_0 *>(xq + size_t(c) * xq_stride);                             \
            for (int i = 0; i < nb; ++i) {                                                                        \
                yd[size_t(c) * size_t(nb) + size_t(i)] = _cvtsh_ss(ys[c][i].d);                                   \
            }                                                                                                     \
        }                                                                                                         \
        const __m256i ones = _mm256_set1_epi16(1);                                                                \
        (void) ones;                                                                                              \
        __m256 acc[COLS ? COLS : k_max_columns];                                                                  \
        for (int64_t r = w->ne[1] * ith / nth; r < w->ne[1] * (ith + 1) / nth; ++r) {                             \
            const auto * row =                                                                                    \
                reinterpret_cast<const block_q8_0 *>(static_cast<const char *>(w->data) + r * w->nb[1]);          \
            for (int c = 0; c < cols; ++c) {                                                                      \
                acc[c] = _mm256_setzero_ps();                                                                     \
            }                                                                                                     \
            for (int i = 0; i < nb; ++i) {                                                                        \
                _mm_prefetch(reinterpret_cast<const char *>(row + i) + k_prefetch_bytes, _MM_HINT_T0);            \
                const float   xd = _cvtsh_ss(row[i].d);                                                           \
                const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(row[i].qs));            \
                const __m256i ax = _mm256_sign_epi8(qx, qx);                                                      \
                for (int c = 0; c < cols; ++c) {                                                                  \
                    const __m256  d = _mm256_set1_ps(xd * yd[size_t(c) * size_t(nb) + size_t(i)]);               \
                    const __m256i sy = _mm256_sign_epi8(                                                          \
                        _mm256_loadu_si256(reinterpret_cast<const __m256i *>(ys[c][i].qs)), qx);                  \
                    acc[c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(LANES), acc[c]);                               \
                }                                                                                                 \
            }                                                                                                     \
            for (int c = 0; c < cols; ++c) {                                                                      \
                reinterpret_cast<float *>(static_cast<char *>(dst->data) + c * dst->nb[1])[r] =                   \
                    hsum_float_8(acc[c]);                                                                         \
            }                                                                                                     \
        }                                                                                                         \
    }

QT_Q8_0_ROWS(q8_0_rows, "avx2,fma,f16c", _mm256_madd_epi16(ones, _mm256_maddubs_epi16(ax, sy)))
QT_Q8_0_ROWS(q8_0_rows_vnni, "avx2,fma,f16c,avx512f,avx512vl,avx512vnni",
             _mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sy))

#endif  // QT_MATVEC_X86

// The rows kernel above that reproduces the loaded variant's vec_dot for these operands, if any
// (the variants with AVX2 all run the same AVX2 vec_dot for q4_K and q8_0), for `cols` columns.

#ifdef QT_MATVEC_X86
#    define QT_BY_COLUMNS(KERNEL, cols)                                                                 \
        ((cols) == 1 ? KERNEL<1> : (cols) == 2 ? KERNEL<2> : (cols) == 3 ? KERNEL<3> : (cols) == 4 ? KERNEL<4> \
                                                                                                   : KERNEL<0>)
#endif

rows_kernel rows_kernel_for(const ggml_tensor * w, int64_t cols) {
#ifdef QT_MATVEC_X86
    const cpu_kernels kernels = cpu_kernels_active();
    if (kernels < cpu_kernels::avx2) {
        return nullptr;
    }
    // VNNI with the AVX512 kernels only: forcing AVX2 (tests, measurements) takes the plain path
    static const bool vnni = cpu_backend_loaded().features.find("AVX512_VNNI") != std::string::npos;
    const bool        use_vnni = vnni && kernels == cpu_kernels::avx512;
    if (w->type == GGML_TYPE_Q4_K && ggml_type_size(GGML_TYPE_Q4_K) == 144 && ggml_type_size(GGML_TYPE_Q8_K) == 292) {
        if (kernels == cpu_kernels::avx512) {
            return use_vnni ? q4k_rows<q4k_row_dot_512_vnni> : q4k_rows<q4k_row_dot_512>;
        }
        return q4k_rows<q4k_row_dot>;
    }
    if (w->type == GGML_TYPE_Q8_0 && ggml_type_size(GGML_TYPE_Q8_0) == 34 && cols <= k_max_columns) {
        return use_vnni ? QT_BY_COLUMNS(q8_0_rows_vnni, cols) : QT_BY_COLUMNS(q8_0_rows, cols);
    }
#else
    (void) w;
    (void) cols;
#endif
    return nullptr;
}

// ggml custom op: dst (N, B) f32 = W x for src = { W (K, N), x (row_bytes, B) in W's dot type }.
// Threads take chunks of k_chunk_rows weight rows, each row dotted with every column while it is
// in the first-level cache.
void product_op(ggml_tensor * dst, int ith, int nth, void * /*userdata*/) {
    const ggml_tensor * w = dst->src[0];
    const ggml_tensor * x = dst->src[1];
    const int64_t       k = w->ne[0], n = w->ne[1], cols = dst->ne[1];
    const ggml_type_traits_cpu * traits = traits_of(w->type);
    for (int64_t r0 = int64_t(ith) * k_chunk_rows; r0 < n; r0 += int64_t(nth) * k_chunk_rows) {
        const int64_t r1 = std::min(n, r0 + k_chunk_rows);
        for (int64_t c = 0; c < cols; ++c) {
            const char * col = static_cast<const char *>(x->data) + c * x->nb[1];
            float *      out = reinterpret_cast<float *>(static_cast<char *>(dst->data) + c * dst->nb[1]);
            for (int64_t r = r0; r < r1; ++r) {
                traits->vec_dot(int(k), out + r, 0, static_cast<const char *>(w->data) + r * w->nb[1], 0, col, 0, 1);
            }
        }
    }
}

// Column c of x (K, B) f32 in `dot_type` at `out` (the quantizers of ggml's x86 build, or the same
// bits faster for q8_K: rows kernels run on AVX2 machines only).
void convert_column(const ggml_tensor * x, int64_t c, ggml_type dot_type, char * out) {
    const float * column = reinterpret_cast<const float *>(static_cast<const char *>(x->data) + c * x->nb[1]);
#ifdef QT_MATVEC_X86
    if (dot_type == GGML_TYPE_Q8_K) {
        quantize_q8_k(column, reinterpret_cast<block_q8_k *>(out), x->ne[0]);
        return;
    }
#endif
    traits_of(dot_type)->from_float(column, out, x->ne[0]);
}

// ggml custom op: dst (N, B) f32 = W x for src = { W (K, N), x (K, B) f32 } with the rows kernel in
// userdata. Every thread converts all the columns itself: a few microseconds for the columns of a
// decoding step, where a conversion node of its own would cost a barrier.
void converting_product_op(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const ggml_tensor * w = dst->src[0];
    const ggml_tensor * x = dst->src[1];
    const ggml_type     dot_type = traits_of(w->type)->vec_dot_type;
    const size_t        stride = ggml_row_size(dot_type, x->ne[0]);
    thread_local std::vector<char> xq;
    xq.resize(stride * size_t(x->ne[1]));
    for (int64_t c = 0; c < x->ne[1]; ++c) {
        convert_column(x, c, dot_type, xq.data() + size_t(c) * stride);
    }
    reinterpret_cast<rows_kernel>(userdata)(w, xq.data(), stride, dst, ith, nth);
}

// ggml custom op: dst (row_bytes, B) i8 = the columns of src0 = x (K, B) f32 in the dot type of
// src1 = W, for a rows kernel; threads take whole columns (the many positions of a prefill).
void convert_columns_op(ggml_tensor * dst, int ith, int nth, void * /*userdata*/) {
    const ggml_type dot_type = traits_of(dst->src[1]->type)->vec_dot_type;
    for (int64_t c = ith; c < dst->ne[1]; c += nth) {
        convert_column(dst->src[0], c, dot_type, static_cast<char *>(dst->data) + c * dst->nb[1]);
    }
}

// ggml custom op: dst (N, B) f32 = W x for src = { W (K, N), x (row_bytes, B) in W's dot type } with
// the rows kernel in userdata.
void rows_product_op(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const ggml_tensor * x = dst->src[1];
    reinterpret_cast<rows_kernel>(userdata)(dst->src[0], static_cast<const char *>(x->data), x->nb[1], dst, ith, nth);
}

} // namespace

ggml_tensor * mat_vecs(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x) {
    GGML_ASSERT(x->type == GGML_TYPE_F32 && x->ne[0] == w->ne[0] && x->ne[2] == 1 && x->ne[3] == 1 &&
                x->nb[0] == sizeof(float) && ggml_is_contiguous_rows(w) && w->ne[2] == 1 && w->ne[3] == 1);
    const int64_t cols = x->ne[1];
    if (standard_ops_only()) {  // a device: one product, its own kernels, accumulating in f32
        ggml_tensor * y = ggml_mul_mat(ctx, w, x);
        ggml_mul_mat_set_prec(y, GGML_PREC_F32);
        return y;
    }
    if (const rows_kernel kernel = rows_kernel_for(w, cols)) {
        if (cols <= k_max_columns) {
            ggml_tensor * args[] = { w, x };
            return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], cols, 1, 1, args, 2, converting_product_op,
                                  GGML_N_TASKS_MAX, reinterpret_cast<void *>(kernel));
        }
        // a prefill's many columns: converted once, the threads sharing the work
        const ggml_type dot_type = traits_of(w->type)->vec_dot_type;
        ggml_tensor *   convert_args[] = { x, w };
        ggml_tensor *   xq = ggml_custom_4d(ctx, GGML_TYPE_I8, int64_t(ggml_row_size(dot_type, x->ne[0])), cols, 1, 1,
                                            convert_args, 2, convert_columns_op, GGML_N_TASKS_MAX, nullptr);
        ggml_tensor *   args[] = { w, xq };
        return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], cols, 1, 1, args, 2, rows_product_op, GGML_N_TASKS_MAX,
                              reinterpret_cast<void *>(kernel));
    }
    const ggml_type_traits_cpu * traits = cols > 1 ? traits_of(w->type) : nullptr;
    if (cols == 1 || !traits || !traits->vec_dot || traits->nrows != 1 ||
        w->ne[0] % ggml_blck_size(traits->vec_dot_type) != 0) {
        if (cols == 1) {
            return ggml_mul_mat(ctx, w, x);
        }
        // Without ggml's kernels at hand: one product per column, the same bits, no shared read.
        ggml_tensor * y = nullptr;
        for (int64_t c = 0; c < cols; ++c) {
            ggml_tensor * yc = ggml_mul_mat(ctx, w, ggml_view_2d(ctx, x, x->ne[0], 1, x->nb[1], size_t(c) * x->nb[1]));
            y = y ? ggml_concat(ctx, y, yc, 1) : yc;
        }
        return y;
    }
    ggml_tensor * xd = x;  // f32 weights dot f32 columns as they are
    if (traits->vec_dot_type != GGML_TYPE_F32) {
        ggml_tensor * args[] = { x, w };
        xd = ggml_custom_4d(ctx, GGML_TYPE_I8, int64_t(ggml_row_size(traits->vec_dot_type, x->ne[0])), cols, 1, 1, args,
                            2, convert_op, GGML_N_TASKS_MAX, nullptr);
    }
    ggml_tensor * args[] = { w, xd };
    return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], cols, 1, 1, args, 2, product_op, GGML_N_TASKS_MAX, nullptr);
}

} // namespace qt
