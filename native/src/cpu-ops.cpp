#include "cpu-ops.h"

#include "backend-loader.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#    include <immintrin.h>
#    define QT_X86    1
#    define QT_AVX2   __attribute__((target("avx2,fma,f16c")))
#    define QT_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c")))
#    if !defined(__clang__)
// GCC 12's AVX512 intrinsics pass _mm512_undefined_ps() (a self-initialised variable) as the
// unused merge operand, which -Wmaybe-uninitialized reports at every use.
#        pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#    endif
#endif

namespace qt {

namespace {

// The best kernels that this processor runs and the loaded ggml variant uses too: forcing a
// lower variant (VOCABLE_CPU_VARIANT=haswell, x64) lowers these with it, so that one machine
// measures and tests every path.
cpu_kernels detect_kernels() {
#ifdef QT_X86
    const cpu_backend_info & loaded = cpu_backend_loaded();
    // F16C is not asked for: every processor with AVX2 has it (and clang cannot ask)
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && loaded.has_feature("AVX2") &&
                      loaded.has_feature("FMA");
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                        loaded.has_feature("AVX512");
    return avx512 ? cpu_kernels::avx512 : avx2 ? cpu_kernels::avx2 : cpu_kernels::generic;
#else
    return cpu_kernels::generic;
#endif
}

std::atomic<int> g_forced_kernels{ -1 };
thread_local bool t_standard_ops = false;

// The panels of a packed_weight: 32 outputs by 256-deep blocks, k-major within a block.
constexpr int64_t k_pack_depth = 256;
constexpr int64_t k_pack_outputs = 32;

// Element (o, k) of packed panels of depth K.
inline size_t packed_index(int64_t o, int64_t k, int64_t K) {
    const int64_t n_depth = (K + k_pack_depth - 1) / k_pack_depth;
    return size_t((((o / k_pack_outputs) * n_depth + k / k_pack_depth) * k_pack_depth + k % k_pack_depth) *
                      k_pack_outputs +
                  o % k_pack_outputs);
}

// Row range [first, last) of n rows for thread ith of nth.
void split_rows(int64_t n, int ith, int nth, int64_t * first, int64_t * last) {
    *first = n * ith / nth;
    *last = n * (ith + 1) / nth;
}

#ifdef QT_X86

constexpr int k_kc = 256;            // depth of a packed weight panel
constexpr int k_tc = 96;             // output frames per work item (its tiles stay in L1)
constexpr int k_group_outputs = 128; // outputs of one work item
// Fewest frames for which converting weights while packing beats ggml's own products: f16
// converts at 8 values per instruction; q8_0 costs more, and ggml's integer dot products win a
// 9-position talker prefill (150-178 against 166-224 ms, measured side by side).
constexpr int k_min_frames_f16 = 8;
constexpr int k_min_frames_q8_0 = 32;
// Most tiles a panel serves for which they read a packed_weight's f16 panel in place, each tile
// converting it again, rather than from a copy widened once. Measured (Zen 4, 2 threads, the q4_k
// bench model's decoder, ms per second of audio): 8-frame chunks 201-208 in place against 206-214
// widened on AVX512, and within noise on AVX2, where a tile spends 12 multiply-adds per
// conversion against AVX512's 24, and reading in place throughout was 0-2 % slower; 1-frame
// chunks, which give the first audio, 351 against 407 on AVX512 and 389-391 against 422 on AVX2.
constexpr int64_t k_max_tiles_f16_in_place = 3;
// Fewest columns that ggml-vulkan's matrix kernel takes for an unbatched x (mul_mat_vec_max_cols
// is 8).
constexpr int64_t k_device_matrix_min_cols = 9;

// A tile's weights: a panel widened to f32 and packed [kc][nr] (`float`), or a packed_weight's f16
// panel read in place, k_pack_outputs apart, and widened in registers (`uint16_t`): the same
// values, so the same bits. Reading in place spares a pass that widens the whole panel into a
// buffer of 16 or 32 KiB, a large share of the work where the panel then serves only a few tiles.
template <class W> QT_AVX2 inline __m256 panel_8(const W * wp, int k, int j) {
    if constexpr (std::is_same_v<W, float>) {
        return _mm256_load_ps(wp + k * 16 + j);
    } else {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(wp + k * k_pack_outputs + j)));
    }
}
template <class W> QT_AVX512 inline __m512 panel_16(const W * wp, int k, int j) {
    if constexpr (std::is_same_v<W, float>) {
        return _mm512_load_ps(wp + k * 32 + j);
    } else {
        return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(wp + k * k_pack_outputs + j)));
    }
}

// y[i][0..nv) += x[i] . wp over kc for MR frames; x rows at stride ldx, wp 16 outputs wide.
// 6 x 16 outputs: 12 of the 16 ymm registers hold the sums.
template <int MR, class W>
QT_AVX2 inline void tile_avx2(int kc, const float * x, size_t ldx, const W * wp, float * y, size_t ldy, int nv) {
    constexpr int nr = 16;
    __m256 c0[MR], c1[MR];
#    pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
        c0[i] = _mm256_setzero_ps();
        c1[i] = _mm256_setzero_ps();
    }
    for (int k = 0; k < kc; ++k) {
        const __m256 w0 = panel_8(wp, k, 0);
        const __m256 w1 = panel_8(wp, k, 8);
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
        if (nv == nr) {
            _mm256_storeu_ps(yr, _mm256_add_ps(_mm256_loadu_ps(yr), c0[i]));
            _mm256_storeu_ps(yr + 8, _mm256_add_ps(_mm256_loadu_ps(yr + 8), c1[i]));
        } else {
            alignas(32) float tmp[nr];
            _mm256_store_ps(tmp, c0[i]);
            _mm256_store_ps(tmp + 8, c1[i]);
            for (int j = 0; j < nv; ++j) {
                yr[j] += tmp[j];
            }
        }
    }
}

// The same for 12 frames x 32 outputs: 24 of the 32 zmm registers hold the sums, so each weight
// load serves twice the frames. Each output sums in the same order as the AVX2 tile, so both give
// the same bits.
template <int MR, class W>
QT_AVX512 inline void tile_avx512(int kc, const float * x, size_t ldx, const W * wp, float * y, size_t ldy, int nv) {
    __m512 c0[MR], c1[MR];
#    pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
        c0[i] = _mm512_setzero_ps();
        c1[i] = _mm512_setzero_ps();
    }
    for (int k = 0; k < kc; ++k) {
        const __m512 w0 = panel_16(wp, k, 0);
        const __m512 w1 = panel_16(wp, k, 16);
#    pragma GCC unroll 16
        for (int i = 0; i < MR; ++i) {
            const __m512 xb = _mm512_set1_ps(x[i * ldx + k]);
            c0[i] = _mm512_fmadd_ps(xb, w0, c0[i]);
            c1[i] = _mm512_fmadd_ps(xb, w1, c1[i]);
        }
    }
    const __mmask16 m0 = nv >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << nv) - 1);
    const __mmask16 m1 = nv >= 32 ? __mmask16(0xFFFF) : nv > 16 ? __mmask16((1u << (nv - 16)) - 1) : __mmask16(0);
#    pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
        float * yr = y + i * ldy;
        _mm512_mask_storeu_ps(yr, m0, _mm512_add_ps(_mm512_maskz_loadu_ps(m0, yr), c0[i]));
        _mm512_mask_storeu_ps(yr + 16, m1, _mm512_add_ps(_mm512_maskz_loadu_ps(m1, yr + 16), c1[i]));
    }
}

// Elements [k0, k0 + n) of a weight row as f32: the row itself for f32, else converted into
// `buf` (f16 by F16C, q8_0 block by block). k0 is a multiple of the block size.
QT_AVX2 const float * weight_row(ggml_type type, const char * row, int64_t k0, int n, float * buf) {
    if (type == GGML_TYPE_F32) {
        return reinterpret_cast<const float *>(row) + k0;
    }
    if (type == GGML_TYPE_F16) {
        const auto * h = reinterpret_cast<const uint16_t *>(row) + k0;
        int k = 0;
        for (; k + 8 <= n; k += 8) {
            _mm256_store_ps(buf + k, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(h + k))));
        }
        for (; k < n; ++k) {
            buf[k] = _cvtsh_ss(h[k]);
        }
        return buf;
    }
    // q8_0: blocks of a f16 scale and 32 int8 values (n is a multiple of 32)
    constexpr int    qk = 32;
    constexpr size_t block_bytes = sizeof(uint16_t) + qk;
    const char *     b = row + size_t(k0 / qk) * block_bytes;
    for (int k = 0; k < n; k += qk, b += block_bytes) {
        uint16_t d16;
        memcpy(&d16, b, sizeof(d16));
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(d16));
        const auto * q = reinterpret_cast<const __m128i *>(b + sizeof(uint16_t));
        const __m128i lo = _mm_loadu_si128(q);
        const __m128i hi = _mm_loadu_si128(q + 1);
        const __m128i parts[4] = { lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8) };
        for (int p = 0; p < 4; ++p) {
            const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[p]));
            _mm256_store_ps(buf + k + 8 * p, _mm256_mul_ps(v, d));
        }
    }
    return buf;
}

alignas(64) const float k_zero_row[k_kc] = {};

// wp[k][j] = rows[j][k] for k < kc, j < NR: 8 x 8 blocks transposed in registers (a scalar
// scatter of the panel costs as much as the products when a panel serves only a few frames).
template <int NR>
QT_AVX2 void pack_panel(const float * const rows[NR], int kc, float * wp) {
    int k = 0;
    for (; k + 8 <= kc; k += 8) {
        for (int jb = 0; jb < NR; jb += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; ++i) {
                r[i] = _mm256_loadu_ps(rows[jb + i] + k);
            }
            const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
            const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
            const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
            const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
            const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
            const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
            const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
            const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
            float * out = wp + k * NR + jb;
            _mm256_store_ps(out + 0 * NR, _mm256_permute2f128_ps(u0, u4, 0x20));
            _mm256_store_ps(out + 1 * NR, _mm256_permute2f128_ps(u1, u5, 0x20));
            _mm256_store_ps(out + 2 * NR, _mm256_permute2f128_ps(u2, u6, 0x20));
            _mm256_store_ps(out + 3 * NR, _mm256_permute2f128_ps(u3, u7, 0x20));
            _mm256_store_ps(out + 4 * NR, _mm256_permute2f128_ps(u0, u4, 0x31));
            _mm256_store_ps(out + 5 * NR, _mm256_permute2f128_ps(u1, u5, 0x31));
            _mm256_store_ps(out + 6 * NR, _mm256_permute2f128_ps(u2, u6, 0x31));
            _mm256_store_ps(out + 7 * NR, _mm256_permute2f128_ps(u3, u7, 0x31));
        }
    }
    for (; k < kc; ++k) {
        for (int j = 0; j < NR; ++j) {
            wp[k * NR + j] = rows[j][k];
        }
    }
}

// wp[k][j] = src[k * 32 + j] widened to f32, for k < kc, j < NR: NR outputs of a packed panel.
template <int NR>
QT_AVX2 void widen_panel(const uint16_t * src, int kc, float * wp) {
    for (int k = 0; k < kc; ++k) {
        for (int j = 0; j < NR; j += 8) {
            _mm256_store_ps(wp + k * NR + j,
                            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(src + k * k_pack_outputs + j))));
        }
    }
}

// Asks for elements [k0, k0 + n) of weight rows [first, first + count) of batch `b` in cache.
void prefetch_rows(const ggml_tensor * w, int64_t b, int64_t first, int64_t count, int64_t k0, int n) {
    const size_t offset = ggml_row_size(w->type, k0);
    const size_t bytes = ggml_row_size(w->type, n);
    for (int64_t j = 0; j < count; ++j) {
        const char * row = static_cast<const char *>(w->data) + b * w->nb[2] + (first + j) * w->nb[1] + offset;
        for (size_t at = 0; at < bytes; at += 64) {
            __builtin_prefetch(row + at);
        }
    }
}

// out[k] for k < n (a multiple of 8) = sum over i < M of coef[i] * rows[i][k], one f32 FMA a
// row in order of i from 0, for f16 (F16) or f32 rows.
template <int M, bool F16>
QT_AVX2 void combine_taps(const char * const rows[], const float coef[], int n, float * out) {
    __m256 c[M];
    for (int i = 0; i < M; ++i) {
        c[i] = _mm256_set1_ps(coef[i]);
    }
    for (int k = 0; k < n; k += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (int i = 0; i < M; ++i) {
            const __m256 t = F16 ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(
                                       reinterpret_cast<const uint16_t *>(rows[i]) + k)))
                                 : _mm256_loadu_ps(reinterpret_cast<const float *>(rows[i]) + k);
            acc = _mm256_fmadd_ps(c[i], t, acc);
        }
        _mm256_storeu_ps(out + k, acc);
    }
}

// The same sums 16 elements a step (n a multiple of 16), with the same FMAs lane by lane.
template <int M, bool F16>
QT_AVX512 void combine_taps_wide(const char * const rows[], const float coef[], int n, float * out) {
    __m512 c[M];
    for (int i = 0; i < M; ++i) {
        c[i] = _mm512_set1_ps(coef[i]);
    }
    for (int k = 0; k < n; k += 16) {
        __m512 acc = _mm512_setzero_ps();
        for (int i = 0; i < M; ++i) {
            const __m512 t = F16 ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(
                                       reinterpret_cast<const uint16_t *>(rows[i]) + k)))
                                 : _mm512_loadu_ps(reinterpret_cast<const float *>(rows[i]) + k);
            acc = _mm512_fmadd_ps(c[i], t, acc);
        }
        _mm512_storeu_ps(out + k, acc);
    }
}

// combine_taps for m (1 to 7) rows: 512-bit vectors where `wide` and n allow.
template <bool F16>
QT_AVX2 void combine_taps(bool wide, int m, const char * const rows[], const float coef[], int n, float * out) {
    using combiner = void (*)(const char * const[], const float[], int, float *);
    static constexpr combiner narrow[] = { combine_taps<1, F16>, combine_taps<2, F16>, combine_taps<3, F16>,
                                           combine_taps<4, F16>, combine_taps<5, F16>, combine_taps<6, F16>,
                                           combine_taps<7, F16> };
    static constexpr combiner wider[] = { combine_taps_wide<1, F16>, combine_taps_wide<2, F16>,
                                          combine_taps_wide<3, F16>, combine_taps_wide<4, F16>,
                                          combine_taps_wide<5, F16>, combine_taps_wide<6, F16>,
                                          combine_taps_wide<7, F16> };
    (wide && n % 16 == 0 ? wider : narrow)[m - 1](rows, coef, n, out);
}

constexpr int k_max_taps = 7;

// Elements [k0, k0 + n) of row o of U_p = sum_r coef[p][r] W_r, for the taps W (K, R, N), into
// `out`: one f32 FMA per nonzero coefficient, in order of r from 0 (f16 taps widened exactly
// first), so that the AVX2 and AVX512 GEMMs, which both pack through here (`wide`: with 512-bit
// vectors), and the generic kernel get the same bits.
QT_AVX2 const float * combined_row(const ggml_tensor * taps, const tap_combination & c, int64_t p, int64_t o, int64_t k0,
                                   int n, float * out, float * buf, bool wide) {
    const float * coef = c.coef + p * c.taps;
    const char *  rows = static_cast<const char *>(taps->data) + o * taps->nb[2];
    const bool    f16 = taps->type == GGML_TYPE_F16;
    if ((f16 || taps->type == GGML_TYPE_F32) && n % 8 == 0 && c.taps <= k_max_taps) {  // summed in registers
        const char * used[k_max_taps];
        float        used_coef[k_max_taps];
        int          m = 0;
        for (int r = 0; r < c.taps; ++r) {
            if (coef[r] != 0.0f) {
                used[m] = rows + r * taps->nb[1] + k0 * int64_t(ggml_type_size(taps->type));
                used_coef[m++] = coef[r];
            }
        }
        if (m == 0) {
            memset(out, 0, size_t(n) * sizeof(float));
        } else if (f16) {
            combine_taps<true>(wide, m, used, used_coef, n, out);
        } else {
            combine_taps<false>(wide, m, used, used_coef, n, out);
        }
        return out;
    }
    std::fill(out, out + n, 0.0f);
    for (int r = 0; r < c.taps; ++r) {
        if (coef[r] != 0.0f) {
            const float * t = weight_row(taps->type, rows + r * taps->nb[1], k0, n, buf);
            for (int k = 0; k < n; ++k) {
                out[k] = std::fma(coef[r], t[k], out[k]);
            }
        }
    }
    return out;
}

// The register tiles of one instruction set: `run` multiplies a block of up to `mr` frames
// by a panel of `nr` outputs.
struct avx2_tiles {
    static constexpr int  nr = 16;
    static constexpr int  mr = 6;
    static constexpr bool wide = false;  // 512-bit vectors

    template <class W>
    QT_AVX2 static void run(int frames, int kc, const float * x, size_t ldx, const W * wp, float * y, size_t ldy,
                            int nv) {
        switch (frames) {
            case 6: tile_avx2<6>(kc, x, ldx, wp, y, ldy, nv); break;
            case 5: tile_avx2<5>(kc, x, ldx, wp, y, ldy, nv); break;
            case 4: tile_avx2<4>(kc, x, ldx, wp, y, ldy, nv); break;
            case 3: tile_avx2<3>(kc, x, ldx, wp, y, ldy, nv); break;
            case 2: tile_avx2<2>(kc, x, ldx, wp, y, ldy, nv); break;
            default: tile_avx2<1>(kc, x, ldx, wp, y, ldy, nv); break;
        }
    }
};

struct avx512_tiles {
    static constexpr int  nr = 32;
    static constexpr int  mr = 12;
    static constexpr bool wide = true;

    template <class W>
    QT_AVX512 static void run(int frames, int kc, const float * x, size_t ldx, const W * wp, float * y, size_t ldy,
                              int nv) {
        switch (frames) {
            case 12: tile_avx512<12>(kc, x, ldx, wp, y, ldy, nv); break;
            case 11: tile_avx512<11>(kc, x, ldx, wp, y, ldy, nv); break;
            case 10: tile_avx512<10>(kc, x, ldx, wp, y, ldy, nv); break;
            case 9: tile_avx512<9>(kc, x, ldx, wp, y, ldy, nv); break;
            case 8: tile_avx512<8>(kc, x, ldx, wp, y, ldy, nv); break;
            case 7: tile_avx512<7>(kc, x, ldx, wp, y, ldy, nv); break;
            case 6: tile_avx512<6>(kc, x, ldx, wp, y, ldy, nv); break;
            case 5: tile_avx512<5>(kc, x, ldx, wp, y, ldy, nv); break;
            case 4: tile_avx512<4>(kc, x, ldx, wp, y, ldy, nv); break;
            case 3: tile_avx512<3>(kc, x, ldx, wp, y, ldy, nv); break;
            case 2: tile_avx512<2>(kc, x, ldx, wp, y, ldy, nv); break;
            default: tile_avx512<1>(kc, x, ldx, wp, y, ldy, nv); break;
        }
    }
};

// y (N, T, B) = W^T x (+ b) (+ r) per batch: x (K, T, B) with rows at any stride (overlapping
// sliding windows included), W (K, N, Bw) f32 with B % Bw == 0 (batch i uses W batch
// i / (B / Bw), as ggml_mul_mat broadcasts; f32, f16 or q8_0 rows), optional b (N) and r (N, T, B)
// contiguous.
// r may be y itself (accumulate in place).
struct gemm_args {
    const ggml_tensor * x;
    const ggml_tensor * w;  // or the F16 panels of a packed_weight (then N = y->ne[0], one batch)
    const ggml_tensor * b;
    const ggml_tensor * r;
    ggml_tensor *       y;
    bool                packed;
    const tap_combination * taps = nullptr;  // w is a convolution's taps (K, R, N), batch p uses U_p
};

template <class Tiles>
void gemm_run(const gemm_args & g, int ith, int nth) {
    constexpr int nr = Tiles::nr;
    static_assert(k_max_tiles_f16_in_place * Tiles::mr < k_tc,
                  "a whole block of frames reads a widened copy: test-ops covers both ways");
    const int64_t K = g.x->ne[0];
    const int64_t T = g.x->ne[1];
    const int64_t B = g.x->ne[2];
    const int64_t N = g.packed || g.taps ? g.y->ne[0] : g.w->ne[1];
    const int64_t group = g.packed || g.taps ? B : B / g.w->ne[2];
    const size_t  ldx = g.x->nb[1] / sizeof(float);
    const size_t  ldy = size_t(N);
    const bool    in_place = g.r && g.r->data == g.y->data;

    const int64_t n_panels = (N + nr - 1) / nr;
    const int64_t n_chunks = (T + k_tc - 1) / k_tc;
    // A work item is a block of frames times a group of panels; its depth loop packs each
    // panel in turn against the same x block, which then stays in L2 (one panel per item would
    // read the whole x block from L3 once per panel). Groups shrink until every thread gets a
    // few items.
    // Taps over one block of frames: a panel's points one after the other, so that its taps
    // (nr * K * R values) come from memory once and then from L2 for each point.
    const bool    points_inner = g.taps && n_chunks == 1;
    const int64_t per_group = points_inner ? 1 : std::max<int64_t>(
        1, std::min<int64_t>(k_group_outputs / nr, B * n_chunks * n_panels / (4 * int64_t(nth))));
    const int64_t n_groups = (n_panels + per_group - 1) / per_group;
    int64_t       first = 0, last = 0;
    split_rows(B * n_chunks * n_groups, ith, nth, &first, &last);
    alignas(64) float wp[k_kc * nr];
    alignas(64) float row_buf[nr * k_kc];
    alignas(64) float tap_buf[k_kc];
    // Combining taps costs several multiply-adds per weight, more than a block of frames spends
    // on it: there a thread takes a group's blocks of frames one after the other and packs the
    // group's panels once for all of them (per_group * nr * K floats, at most 128 K).
    const int64_t n_depth = (K + k_kc - 1) / k_kc;
    thread_local std::vector<float> tap_panels;
    int64_t                         packed_for = -1;  // (bi, group) of the panels in tap_panels
    if (g.taps) {
        tap_panels.resize(size_t(n_depth * per_group) * k_kc * nr + 16);
    }
    float * const panels = reinterpret_cast<float *>((reinterpret_cast<uintptr_t>(tap_panels.data()) + 63) & ~uintptr_t(63));
    for (int64_t item = first; item < last; ++item) {
        // taps: blocks of frames innermost, so that consecutive items share their panels
        const int64_t bi = points_inner ? item % B : item / (n_chunks * n_groups);
        const int64_t chunk = points_inner ? 0 : g.taps ? item % n_chunks : item / n_groups % n_chunks;
        const int64_t gi = points_inner ? item / B : g.taps ? item / n_chunks % n_groups : item % n_groups;
        const int64_t t0 = chunk * k_tc;
        const int64_t t1 = std::min(T, t0 + k_tc);
        const bool f16_in_place = t1 - t0 <= k_max_tiles_f16_in_place * Tiles::mr;
        const int64_t g0 = gi * per_group * nr;  // first output of the group
        const int64_t g1 = std::min(N, g0 + per_group * nr);
        const float * xd = reinterpret_cast<const float *>(static_cast<const char *>(g.x->data) + bi * g.x->nb[2]);
        float *       yd = reinterpret_cast<float *>(static_cast<char *>(g.y->data) + bi * g.y->nb[2]);
        const float * rd = g.r ? reinterpret_cast<const float *>(static_cast<const char *>(g.r->data) + bi * g.r->nb[2])
                               : nullptr;
        const size_t  width = size_t(g1 - g0);
        // start from bias + residual; separate loops, as a vectorised select of a null pointer
        // becomes a masked load from address 0, which AMD CPUs serve very slowly
        const float * br = g.b ? static_cast<const float *>(g.b->data) + g0 : nullptr;
        for (int64_t t = t0; t < t1; ++t) {
            float * yr = yd + t * ldy + g0;
            if (!in_place) {
                if (rd) {
                    memcpy(yr, rd + t * ldy + g0, width * sizeof(float));
                } else {
                    memset(yr, 0, width * sizeof(float));
                }
            }
            if (br) {
                for (size_t j = 0; j < width; ++j) {
                    yr[j] += br[j];
                }
            }
        }
        for (int64_t kb = 0; kb < K; kb += k_kc) {
            const int kc = int(std::min<int64_t>(k_kc, K - kb));
            for (int64_t o0 = g0; o0 < g1; o0 += nr) {
                const int     nv = int(std::min<int64_t>(nr, N - o0));
                const float *    panel = wp;
                const uint16_t * f16_panel = nullptr;  // read in place by the tiles
                if (g.packed) {
                    const uint16_t * f16 = static_cast<const uint16_t *>(g.w->data) + packed_index(o0, kb, K);
                    if (f16_in_place) {
                        f16_panel = f16;
                    } else {
                        widen_panel<nr>(f16, kc, wp);
                    }
                } else if (g.taps) {
                    float * cached = panels + size_t(((kb / k_kc) * per_group + (o0 - g0) / nr) * k_kc * nr);
                    if (packed_for != bi * n_groups + gi) {
                        const float * rows[nr];
                        for (int j = 0; j < nr; ++j) {
                            rows[j] = j < nv ? combined_row(g.w, *g.taps, bi, o0 + j, kb, kc, row_buf + j * k_kc, tap_buf, Tiles::wide)
                                             : k_zero_row;
                        }
                        pack_panel<nr>(rows, kc, cached);
                        // every tap of the next panel's outputs (taps batch o holds output o's rows)
                        for (int64_t o = o0 + nr; o < std::min(g1, o0 + 2 * nr); ++o) {
                            prefetch_rows(g.w, o, 0, g.w->ne[1], kb, kc);
                        }
                    }
                    panel = cached;
                } else {
                    const float * rows[nr];
                    for (int j = 0; j < nr; ++j) {
                        rows[j] = k_zero_row;
                        if (j < nv) {
                            const char * row = static_cast<const char *>(g.w->data) + bi / group * g.w->nb[2] +
                                               (o0 + j) * g.w->nb[1];
                            rows[j] = weight_row(g.w->type, row, kb, kc, row_buf + j * k_kc);
                        }
                    }
                    pack_panel<nr>(rows, kc, wp);
                    // the next panel's weight rows (or the first of the next depth block) start
                    // loading while this one's tiles run: the rows are kilobytes apart, too many
                    // streams for the hardware prefetcher when the weights come from memory
                    if (o0 + nr < g1) {
                        prefetch_rows(g.w, bi / group, o0 + nr, std::min<int64_t>(nr, g1 - o0 - nr), kb, kc);
                    } else if (kb + k_kc < K) {
                        prefetch_rows(g.w, bi / group, g0, std::min<int64_t>(nr, g1 - g0), kb + k_kc,
                                      int(std::min<int64_t>(k_kc, K - kb - k_kc)));
                    }
                }
                const auto run_tiles = [&](const auto * weights) {
                    for (int64_t t = t0; t < t1; t += Tiles::mr) {
                        Tiles::run(int(std::min<int64_t>(Tiles::mr, t1 - t)), kc, xd + t * ldx + kb, ldx, weights,
                                   yd + t * ldy + o0, ldy, nv);
                    }
                };
                if (f16_panel) {
                    run_tiles(f16_panel);
                } else {
                    run_tiles(panel);
                }
            }
        }
        if (g.taps) {
            packed_for = bi * n_groups + gi;
        }
    }
}

// ggml_custom_4d: src = { x, w, b, r }; userdata non-null: w is packed
template <class Tiles> void gemm_op(ggml_tensor * dst, int ith, int nth, void * packed) {
    gemm_run<Tiles>({ dst->src[0], dst->src[1], dst->src[2], dst->src[3], dst, packed != nullptr }, ith, nth);
}

// ggml_custom_inplace on r: src = { r, x, w, b }
template <class Tiles> void gemm_acc_op(ggml_tensor * dst, int ith, int nth, void * packed) {
    gemm_run<Tiles>({ dst->src[1], dst->src[2], dst->src[3], dst->src[0], dst, packed != nullptr }, ith, nth);
}

// ggml_custom_4d: src = { x, taps }; userdata: the tap_combination
template <class Tiles> void gemm_taps_op(ggml_tensor * dst, int ith, int nth, void * combination) {
    gemm_run<Tiles>({ dst->src[0], dst->src[1], nullptr, nullptr, dst, false,
                      static_cast<const tap_combination *>(combination) },
                    ith, nth);
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

// The same arithmetic on 16 lanes (same bits per element).
QT_AVX512 inline __m512 expm1_neg(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 40320.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 5040.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_mul_ps(p, r);
    const __m512 scale = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
    return _mm512_fmadd_ps(scale, p, _mm512_sub_ps(scale, _mm512_set1_ps(1.0f)));
}

void elu_row_generic(const float * x, float * y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        y[i] = x[i] > 0.0f ? x[i] : std::expm1(x[i]);
    }
}

QT_AVX2 void elu_row_avx2(const float * x, float * y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256 neg = expm1_neg(_mm256_min_ps(v, _mm256_setzero_ps()));
        _mm256_storeu_ps(y + i, _mm256_blendv_ps(neg, v, _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_GT_OQ)));
    }
    elu_row_generic(x + i, y + i, n - i);
}

QT_AVX512 void elu_row_avx512(const float * x, float * y, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
        const __m512    v = _mm512_maskz_loadu_ps(m, x + i);
        const __m512    neg = expm1_neg(_mm512_min_ps(v, _mm512_setzero_ps()));
        _mm512_mask_storeu_ps(y + i, m,
                              _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GT_OQ), neg, v));
    }
}

// sin^2(a * x), 8 lanes, for the exact product a * x = hi + lo (lo by FMA). Cody-Waite: hi = k pi/2
// + r, k rounded by adding 1.5 * 2^23 (which leaves k's parity in the low mantissa bit, for
// |k| < 2^22), pi/2 = C1 + C2 in two floats (k C1 is exact with FMA; a third term, below 2e-15 k,
// is under 2e-9 for |a x| < 1e6), lo added to r, |r| <= pi/4 (+ slack). Then sin^2(a x) is
// sin^2(r) for even k and 1 - sin^2(r) for odd k, with sin^2(r) = u + u^2 P(u), u = r^2, P a
// degree-3 minimax fit on [0, (pi/4 + 0.002)^2] with the leading 1 exact (fit error 2e-10; with
// rounding, |error| < 1.3e-7 against double sin of the exact product).
QT_AVX2 inline __m256 sin_sq(__m256 x, __m256 a) {
    const __m256 hi = _mm256_mul_ps(x, a);
    const __m256 lo = _mm256_fmsub_ps(x, a, hi);
    const __m256 shifter = _mm256_set1_ps(12582912.0f);
    const __m256 kb = _mm256_fmadd_ps(hi, _mm256_set1_ps(0.636619746685028076f), shifter);
    const __m256 k = _mm256_sub_ps(kb, shifter);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(1.57079637050628662f), hi);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-4.37113882867379300e-8f), r);
    r = _mm256_add_ps(r, lo);
    const __m256 u = _mm256_mul_ps(r, r);
    __m256 p = _mm256_set1_ps(1.34077577968128026e-4f);
    p = _mm256_fmadd_ps(p, u, _mm256_set1_ps(-3.17042926326394081e-3f));
    p = _mm256_fmadd_ps(p, u, _mm256_set1_ps(4.44434061646461487e-2f));
    p = _mm256_fmadd_ps(p, u, _mm256_set1_ps(-3.33333253860473633e-1f));
    const __m256 s = _mm256_fmadd_ps(_mm256_mul_ps(p, u), u, u);
    // the parity of k, moved to the sign bit, selects 1 - s
    const __m256 odd = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(kb), 31));
    return _mm256_blendv_ps(s, _mm256_sub_ps(_mm256_set1_ps(1.0f), s), odd);
}

// The same arithmetic on 16 lanes (same bits per element).
QT_AVX512 inline __m512 sin_sq(__m512 x, __m512 a) {
    const __m512 hi = _mm512_mul_ps(x, a);
    const __m512 lo = _mm512_fmsub_ps(x, a, hi);
    const __m512 shifter = _mm512_set1_ps(12582912.0f);
    const __m512 kb = _mm512_fmadd_ps(hi, _mm512_set1_ps(0.636619746685028076f), shifter);
    const __m512 k = _mm512_sub_ps(kb, shifter);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.57079637050628662f), hi);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-4.37113882867379300e-8f), r);
    r = _mm512_add_ps(r, lo);
    const __m512 u = _mm512_mul_ps(r, r);
    __m512 p = _mm512_set1_ps(1.34077577968128026e-4f);
    p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(-3.17042926326394081e-3f));
    p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(4.44434061646461487e-2f));
    p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(-3.33333253860473633e-1f));
    const __m512    s = _mm512_fmadd_ps(_mm512_mul_ps(p, u), u, u);
    const __mmask16 odd = _mm512_test_epi32_mask(_mm512_castps_si512(kb), _mm512_set1_epi32(1));
    return _mm512_mask_blend_ps(odd, s, _mm512_sub_ps(_mm512_set1_ps(1.0f), s));
}

QT_AVX2 void snake_beta_row_avx2(const float * x, const float * alpha, const float * inv_beta, float * y, int64_t n) {
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
        const __m256 v = _mm256_loadu_ps(x + c);
        const __m256 s = sin_sq(v, _mm256_loadu_ps(alpha + c));
        _mm256_storeu_ps(y + c, _mm256_fmadd_ps(_mm256_loadu_ps(inv_beta + c), s, v));
    }
    if (c < n) {
        // the last n - c channels through masked loads and stores, so that every channel gets
        // the same arithmetic (masked-off lanes are not read and do not fault)
        const __m256i mask =
            _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n - c)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        const __m256 v = _mm256_maskload_ps(x + c, mask);
        const __m256 s = sin_sq(v, _mm256_maskload_ps(alpha + c, mask));
        _mm256_maskstore_ps(y + c, mask, _mm256_fmadd_ps(_mm256_maskload_ps(inv_beta + c, mask), s, v));
    }
}

QT_AVX512 void snake_beta_row_avx512(const float * x, const float * alpha, const float * inv_beta, float * y,
                                     int64_t n) {
    for (int64_t c = 0; c < n; c += 16) {
        const __mmask16 m = n - c >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - c)) - 1);
        const __m512    v = _mm512_maskz_loadu_ps(m, x + c);
        const __m512    s = sin_sq(v, _mm512_maskz_loadu_ps(m, alpha + c));
        _mm512_mask_storeu_ps(y + c, m, _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, inv_beta + c), s, v));
    }
}

using snake_row_fn = void (*)(const float *, const float *, const float *, float *, int64_t);

// dst (C, P + T) = src[3]'s P frames (C, P), if any, then SnakeBeta of src[0] (C, T), rows at any
// stride, with src[1] = alpha (C) and src[2] = inv_beta (C).
template <snake_row_fn Row> void snake_beta_op(ggml_tensor * dst, int ith, int nth, void *) {
    const ggml_tensor * x = dst->src[0];
    const float *       alpha = static_cast<const float *>(dst->src[1]->data);
    const float *       inv_beta = static_cast<const float *>(dst->src[2]->data);
    const ggml_tensor * history = dst->src[3];
    const int64_t       P = history ? history->ne[1] : 0;
    int64_t             first = 0, last = 0;
    split_rows(dst->ne[1], ith, nth, &first, &last);
    for (int64_t t = first; t < last; ++t) {
        auto * y = reinterpret_cast<float *>(static_cast<char *>(dst->data) + t * dst->nb[1]);
        if (t < P) {
            memcpy(y, static_cast<const char *>(history->data) + t * history->nb[1], size_t(x->ne[0]) * sizeof(float));
        } else {
            Row(reinterpret_cast<const float *>(static_cast<const char *>(x->data) + (t - P) * x->nb[1]), alpha, inv_beta,
                y, x->ne[0]);
        }
    }
}

#else

void elu_row_generic(const float * x, float * y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        y[i] = x[i] > 0.0f ? x[i] : std::expm1(x[i]);
    }
}

#endif  // QT_X86

using elu_row_fn = void (*)(const float *, float *, int64_t);

// dst (C, left + T + right) = zero-padded ELU of src[0] (C, T); userdata = left.
template <elu_row_fn Row> void elu_pad_op(ggml_tensor * dst, int ith, int nth, void * userdata) {
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
        Row(reinterpret_cast<const float *>(static_cast<const char *>(x->data) + src * x->nb[1]), y, C);
    }
}

// dst (C, left + T + right) = padded src[0] (C, T); userdata = left << 2 | mode.
void pad_frames_op(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const ggml_tensor * x = dst->src[0];
    const int64_t       C = x->ne[0];
    const int64_t       T = x->ne[1];
    const intptr_t      packed = reinterpret_cast<intptr_t>(userdata);
    const int64_t       left = int64_t(packed >> 2);
    const auto          mode = pad_mode(packed & 3);
    int64_t             first = 0, last = 0;
    split_rows(dst->ne[1], ith, nth, &first, &last);
    for (int64_t t = first; t < last; ++t) {
        float * y = reinterpret_cast<float *>(static_cast<char *>(dst->data) + t * dst->nb[1]);
        int64_t src = t - left;
        if (src < 0 || src >= T) {
            if (mode == pad_mode::zeros) {
                memset(y, 0, size_t(C) * sizeof(float));
                continue;
            }
            src = mode == pad_mode::replicate ? (src < 0 ? 0 : T - 1) : (src < 0 ? -src : 2 * (T - 1) - src);
        }
        memcpy(y, static_cast<const char *>(x->data) + src * x->nb[1], size_t(C) * sizeof(float));
    }
}

} // namespace

namespace {

// pad_frames from ggml's standard ops (a device): zeros by ggml_pad_ext, the edge frames of the
// other modes gathered from single-frame views (a convolution's padding is a few frames).
ggml_tensor * pad_frames_standard(ggml_context * ctx, ggml_tensor * x, int64_t left, int64_t right, pad_mode mode) {
    x = ggml_is_contiguous(x) ? x : ggml_cont(ctx, x);
    if (mode == pad_mode::zeros) {
        return ggml_pad_ext(ctx, x, 0, 0, int(left), int(right), 0, 0, 0, 0);
    }
    const int64_t C = x->ne[0], T = x->ne[1];
    const auto frame = [&](int64_t t) { return ggml_view_2d(ctx, x, C, 1, x->nb[1], size_t(t) * x->nb[1]); };
    // the frame that output frame t - left takes, as pad_frames_op maps it
    const auto source = [&](int64_t src) {
        return mode == pad_mode::replicate ? (src < 0 ? 0 : T - 1) : (src < 0 ? -src : 2 * (T - 1) - src);
    };
    // each edge gathered on its own, then one copy of x between them
    const auto edge = [&](int64_t from, int64_t to) {
        ggml_tensor * e = nullptr;
        for (int64_t src = from; src < to; ++src) {
            e = e ? ggml_concat(ctx, e, frame(source(src)), 1) : frame(source(src));
        }
        return e;
    };
    ggml_tensor * y = x;
    if (left > 0) {
        y = ggml_concat(ctx, edge(-left, 0), y, 1);
    }
    if (right > 0) {
        y = ggml_concat(ctx, y, edge(T, T + right), 1);
    }
    return y;
}

} // namespace

ggml_tensor * pad_frames(ggml_context * ctx, ggml_tensor * x, int64_t left, int64_t right, pad_mode mode) {
    GGML_ASSERT(x->type == GGML_TYPE_F32 && x->nb[0] == sizeof(float) && x->ne[2] == 1 && x->ne[3] == 1);
    GGML_ASSERT(left >= 0 && right >= 0);
    // reflection needs left, right < T (as torch's reflect pad)
    GGML_ASSERT(mode != pad_mode::reflect || (left < x->ne[1] && right < x->ne[1]));
    if (t_standard_ops) {
        return pad_frames_standard(ctx, x, left, right, mode);
    }
    ggml_tensor * args[] = { x };
    return ggml_custom_4d(ctx, GGML_TYPE_F32, x->ne[0], left + x->ne[1] + right, 1, 1, args, 1, pad_frames_op,
                          GGML_N_TASKS_MAX, reinterpret_cast<void *>(intptr_t(left) << 2 | intptr_t(mode)));
}

ggml_tensor * elu_pad(ggml_context * ctx, ggml_tensor * x, int64_t left, int64_t right) {
    GGML_ASSERT(x->type == GGML_TYPE_F32 && x->nb[0] == sizeof(float) && x->ne[2] == 1 && x->ne[3] == 1);
    if (t_standard_ops) {
        return pad_frames_standard(ctx, ggml_elu(ctx, ggml_is_contiguous(x) ? x : ggml_cont(ctx, x)), left, right,
                                   pad_mode::zeros);
    }
    ggml_custom_op_t op = elu_pad_op<elu_row_generic>;
#ifdef QT_X86
    switch (cpu_kernels_active()) {
        case cpu_kernels::avx512: op = elu_pad_op<elu_row_avx512>; break;
        case cpu_kernels::avx2: op = elu_pad_op<elu_row_avx2>; break;
        case cpu_kernels::generic: break;
    }
#endif
    ggml_tensor * args[] = { x };
    return ggml_custom_4d(ctx, GGML_TYPE_F32, x->ne[0], left + x->ne[1] + right, 1, 1, args, 1, op, GGML_N_TASKS_MAX,
                          reinterpret_cast<void *>(intptr_t(left)));
}

ggml_tensor * snake_beta(ggml_context * ctx, ggml_tensor * x, ggml_tensor * alpha, ggml_tensor * inv_beta,
                         ggml_tensor * history) {
    GGML_ASSERT(x->type == GGML_TYPE_F32 && x->nb[0] == sizeof(float) && x->ne[2] == 1 && x->ne[3] == 1);
    for (const ggml_tensor * p : { alpha, inv_beta }) {
        GGML_ASSERT(p->type == GGML_TYPE_F32 && ggml_is_contiguous(p) && p->ne[0] == x->ne[0] &&
                    ggml_nelements(p) == x->ne[0]);
    }
    GGML_ASSERT(!history || (history->type == GGML_TYPE_F32 && history->nb[0] == sizeof(float) &&
                             history->ne[0] == x->ne[0] && history->ne[2] == 1 && history->ne[3] == 1));
#ifdef QT_X86
    const cpu_kernels kernels = cpu_kernels_active();
    if (kernels != cpu_kernels::generic) {
        ggml_tensor * args[] = { x, alpha, inv_beta, history };
        return ggml_custom_4d(ctx, GGML_TYPE_F32, x->ne[0], (history ? history->ne[1] : 0) + x->ne[1], 1, 1, args,
                              history ? 4 : 3,
                              kernels == cpu_kernels::avx512 ? snake_beta_op<snake_beta_row_avx512>
                                                             : snake_beta_op<snake_beta_row_avx2>,
                              GGML_N_TASKS_MAX, nullptr);
    }
#endif
    ggml_tensor * s = ggml_sqr(ctx, ggml_sin(ctx, ggml_mul(ctx, x, alpha)));
    ggml_tensor * y = ggml_add(ctx, x, ggml_mul(ctx, s, inv_beta));
    return history ? ggml_concat(ctx, history, y, 1) : y;
}

ggml_tensor * dense(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, ggml_tensor * b, ggml_tensor * r,
                    bool r_in_place) {
    GGML_ASSERT(w->ne[0] == x->ne[0] && x->ne[2] % w->ne[2] == 0 && x->ne[3] == 1 && w->ne[3] == 1);
    GGML_ASSERT(!r || (r->ne[0] == w->ne[1] && r->ne[1] == x->ne[1] && r->ne[2] == x->ne[2]));
#ifdef QT_X86
    // f16 and q8_0 weights are converted while packing, which pays off once a panel serves a
    // few frames; a matrix-vector product is bound by reading the weights, where ggml's
    // quantized dot products read less.
    const cpu_kernels kernels = cpu_kernels_active();
    const bool packable = w->type == GGML_TYPE_F32 || (w->type == GGML_TYPE_F16 && x->ne[1] >= k_min_frames_f16) ||
                          (w->type == GGML_TYPE_Q8_0 && x->ne[1] >= k_min_frames_q8_0);
    if (kernels != cpu_kernels::generic && packable && x->type == GGML_TYPE_F32 &&
        w->nb[0] == ggml_type_size(w->type) && x->nb[0] == sizeof(float) &&
        (!b || (b->type == GGML_TYPE_F32 && ggml_is_contiguous(b))) && (!r || ggml_is_contiguous(r))) {
        const bool avx512 = kernels == cpu_kernels::avx512;
        if (r && r_in_place) {
            ggml_tensor * args[] = { x, w, b };
            return ggml_custom_inplace(ctx, r, args, 3, avx512 ? gemm_acc_op<avx512_tiles> : gemm_acc_op<avx2_tiles>,
                                       GGML_N_TASKS_MAX, nullptr);
        }
        ggml_tensor * args[] = { x, w, b, r };
        return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], x->ne[1], x->ne[2], 1, args, 4,
                              avx512 ? gemm_op<avx512_tiles> : gemm_op<avx2_tiles>, GGML_N_TASKS_MAX, nullptr);
    }
#endif
    if (t_standard_ops) {
        // ggml-vulkan rounds a strided operand (a permuted view, overlapping sliding windows) to
        // f16 while it gathers it: gathered here, it stays f32
        w = ggml_is_contiguous(w) ? w : ggml_cont(ctx, w);
        x = ggml_is_contiguous(x) ? x : ggml_cont(ctx, x);
    }
    // ggml-vulkan runs a product of up to 8 columns (of 1 column where x is batched) through a
    // matrix-vector kernel, which sums in another order than its matrix kernel, and the codec
    // decoder's snake activations amplify that difference until streamed chunks no longer match
    // one pass (30.7 dB on lavapipe). Zero columns up to the matrix kernel's width keep every
    // chunk width on the matrix kernel: on lavapipe, chunks then join to one pass exactly.
    const int64_t n_cols = x->ne[1];
    if (t_standard_ops && n_cols < k_device_matrix_min_cols && (n_cols == 1 || x->ne[2] == 1)) {
        x = ggml_pad(ctx, x, 0, int(k_device_matrix_min_cols - n_cols), 0, 0);
    }
    ggml_tensor * y = ggml_mul_mat(ctx, w, x);
    if (t_standard_ops) {  // a device: f32 accumulation, as the CPU's
        ggml_mul_mat_set_prec(y, GGML_PREC_F32);
    }
    if (y->ne[1] != n_cols) {
        y = ggml_cont(ctx, ggml_view_3d(ctx, y, y->ne[0], n_cols, y->ne[2], y->nb[1], y->nb[2], 0));
    }
    if (b) {
        y = ggml_add(ctx, y, b);
    }
    return r ? ggml_add(ctx, y, r) : y;
}

namespace {

// The same product as the packed GEMM, one output at a time (kernels forced to generic).
void gemm_packed_generic(const ggml_tensor * x, const ggml_tensor * w, const ggml_tensor * b, const ggml_tensor * r,
                         ggml_tensor * y, int ith, int nth) {
    const int64_t K = x->ne[0], T = x->ne[1], B = x->ne[2], N = y->ne[0];
    const auto *  panels = static_cast<const ggml_fp16_t *>(w->data);
    int64_t       first = 0, last = 0;
    split_rows(B * T, ith, nth, &first, &last);
    for (int64_t row = first; row < last; ++row) {
        const int64_t bi = row / T, t = row % T;
        const float * xr = reinterpret_cast<const float *>(static_cast<const char *>(x->data) + bi * x->nb[2] + t * x->nb[1]);
        float * yr = reinterpret_cast<float *>(static_cast<char *>(y->data) + bi * y->nb[2] + t * y->nb[1]);
        const float * rr = r ? reinterpret_cast<const float *>(static_cast<const char *>(r->data) + bi * r->nb[2] +
                                                               t * r->nb[1])
                             : nullptr;
        for (int64_t o = 0; o < N; ++o) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; ++k) {
                acc += xr[k] * ggml_fp16_to_fp32(panels[packed_index(o, k, K)]);
            }
            yr[o] = (rr ? rr[o] : 0.0f) + (b ? static_cast<const float *>(b->data)[o] : 0.0f) + acc;
        }
    }
}

void gemm_packed_generic_op(ggml_tensor * dst, int ith, int nth, void *) {
    gemm_packed_generic(dst->src[0], dst->src[1], dst->src[2], dst->src[3], dst, ith, nth);
}

void gemm_packed_generic_acc_op(ggml_tensor * dst, int ith, int nth, void *) {
    gemm_packed_generic(dst->src[1], dst->src[2], dst->src[3], dst->src[0], dst, ith, nth);
}

// dense_taps one output row of U_p at a time (kernels forced to generic); src = { x, taps }.
void gemm_taps_generic_op(ggml_tensor * dst, int ith, int nth, void * combination) {
    const auto &        c = *static_cast<const tap_combination *>(combination);
    const ggml_tensor * x = dst->src[0];
    const ggml_tensor * taps = dst->src[1];
    const int64_t       K = x->ne[0], T = x->ne[1], P = x->ne[2], N = dst->ne[0];
    const auto          to_float = ggml_get_type_traits(taps->type)->to_float;
    std::vector<float>  u(static_cast<size_t>(K));
    std::vector<float>  tap(static_cast<size_t>(K));
    int64_t             first = 0, last = 0;
    split_rows(P * N, ith, nth, &first, &last);
    for (int64_t item = first; item < last; ++item) {
        const int64_t p = item / N, o = item % N;
        std::fill(u.begin(), u.end(), 0.0f);  // the vector paths' FMAs, in the same order
        for (int r = 0; r < c.taps; ++r) {
            const float coef = c.coef[p * c.taps + r];
            if (coef == 0.0f) {
                continue;
            }
            const char * row = static_cast<const char *>(taps->data) + o * taps->nb[2] + r * taps->nb[1];
            if (taps->type == GGML_TYPE_F32) {
                memcpy(tap.data(), row, tap.size() * sizeof(float));
            } else {
                to_float(row, tap.data(), K);
            }
            for (int64_t k = 0; k < K; ++k) {
                u[size_t(k)] = std::fma(coef, tap[size_t(k)], u[size_t(k)]);
            }
        }
        for (int64_t t = 0; t < T; ++t) {
            const auto * xr = reinterpret_cast<const float *>(static_cast<const char *>(x->data) + p * x->nb[2] + t * x->nb[1]);
            float        acc = 0.0f;
            for (int64_t k = 0; k < K; ++k) {
                acc += xr[k] * u[size_t(k)];
            }
            *reinterpret_cast<float *>(static_cast<char *>(dst->data) + p * dst->nb[2] + t * dst->nb[1] +
                                       o * sizeof(float)) = acc;
        }
    }
}

} // namespace

bool packed_weights_supported() { return cpu_kernels_best() != cpu_kernels::generic; }

size_t packed_weight_elements(int64_t k, int64_t n) {
    const int64_t n_depth = (k + k_pack_depth - 1) / k_pack_depth;
    const int64_t n_panels = (n + k_pack_outputs - 1) / k_pack_outputs;
    return size_t(n_panels * n_depth * k_pack_depth * k_pack_outputs);
}

std::vector<uint16_t> pack_weight_panels(const uint16_t * rows, int64_t k, int64_t n) {
    std::vector<uint16_t> out(packed_weight_elements(k, n), 0);
    for (int64_t o = 0; o < n; ++o) {
        for (int64_t i = 0; i < k; ++i) {
            out[packed_index(o, i, k)] = rows[o * k + i];
        }
    }
    return out;
}

ggml_tensor * dense(ggml_context * ctx, const packed_weight & w, ggml_tensor * x, ggml_tensor * b, ggml_tensor * r,
                    bool r_in_place) {
    if (!w.panels) {
        return dense(ctx, w.plain, x, b, r, r_in_place);
    }
    GGML_ASSERT(w.panels->type == GGML_TYPE_F16 && ggml_nelements(w.panels) == int64_t(packed_weight_elements(w.k, w.n)));
    GGML_ASSERT(x->type == GGML_TYPE_F32 && x->nb[0] == sizeof(float) && x->ne[0] == w.k && x->ne[3] == 1);
    GGML_ASSERT(!b || (b->type == GGML_TYPE_F32 && ggml_is_contiguous(b) && ggml_nelements(b) == w.n));
    GGML_ASSERT(!r || (ggml_is_contiguous(r) && r->ne[0] == w.n && r->ne[1] == x->ne[1] && r->ne[2] == x->ne[2]));
    static int packed_marker;
    void *           packed = &packed_marker;
    ggml_custom_op_t op = gemm_packed_generic_op, acc_op = gemm_packed_generic_acc_op;
#ifdef QT_X86
    static_assert(k_kc == k_pack_depth && avx512_tiles::nr == k_pack_outputs && k_pack_outputs % avx2_tiles::nr == 0,
                  "a packed panel is one AVX512 panel, or whole AVX2 panels, deep as the GEMM's blocks");
    switch (cpu_kernels_active()) {
        case cpu_kernels::avx512: op = gemm_op<avx512_tiles>, acc_op = gemm_acc_op<avx512_tiles>; break;
        case cpu_kernels::avx2: op = gemm_op<avx2_tiles>, acc_op = gemm_acc_op<avx2_tiles>; break;
        case cpu_kernels::generic: break;
    }
#endif
    if (r && r_in_place) {
        ggml_tensor * args[] = { x, w.panels, b };
        return ggml_custom_inplace(ctx, r, args, 3, acc_op, GGML_N_TASKS_MAX, packed);
    }
    ggml_tensor * args[] = { x, w.panels, b, r };
    return ggml_custom_4d(ctx, GGML_TYPE_F32, w.n, x->ne[1], x->ne[2], 1, args, 4, op, GGML_N_TASKS_MAX, packed);
}

bool dense_taps_supported(ggml_type type) {
    return type == GGML_TYPE_F32 || ggml_get_type_traits(type)->to_float != nullptr;
}

ggml_tensor * dense_taps(ggml_context * ctx, ggml_tensor * taps, const tap_combination & combination, ggml_tensor * x) {
    GGML_ASSERT(taps->ne[0] == x->ne[0] && taps->ne[1] == combination.taps && taps->ne[3] == 1 &&
                taps->nb[0] == ggml_type_size(taps->type) && dense_taps_supported(taps->type));
    GGML_ASSERT(x->type == GGML_TYPE_F32 && x->nb[0] == sizeof(float) && x->ne[2] == combination.points && x->ne[3] == 1);
    ggml_custom_op_t op = gemm_taps_generic_op;
#ifdef QT_X86
    const bool converted = taps->type == GGML_TYPE_F32 || taps->type == GGML_TYPE_F16 || taps->type == GGML_TYPE_Q8_0;
    switch (converted ? cpu_kernels_active() : cpu_kernels::generic) {
        case cpu_kernels::avx512: op = gemm_taps_op<avx512_tiles>; break;
        case cpu_kernels::avx2: op = gemm_taps_op<avx2_tiles>; break;
        case cpu_kernels::generic: break;
    }
#endif
    ggml_tensor * args[] = { x, taps };
    return ggml_custom_4d(ctx, GGML_TYPE_F32, taps->ne[2], x->ne[1], x->ne[2], 1, args, 2, op, GGML_N_TASKS_MAX,
                          const_cast<tap_combination *>(&combination));
}

cpu_kernels cpu_kernels_best() {
    static const cpu_kernels best = detect_kernels();
    return best;
}

standard_ops_scope::standard_ops_scope(bool active) : previous_(t_standard_ops) {
    t_standard_ops = previous_ || active;
}

standard_ops_scope::~standard_ops_scope() { t_standard_ops = previous_; }

bool standard_ops_only() { return t_standard_ops; }

cpu_kernels cpu_kernels_active() {
    if (t_standard_ops) {
        return cpu_kernels::generic;
    }
    const int forced = g_forced_kernels.load();
    return forced >= 0 ? cpu_kernels(forced) : cpu_kernels_best();
}

void cpu_kernels_force(cpu_kernels kernels) {
    GGML_ASSERT(kernels <= cpu_kernels_best());
    g_forced_kernels.store(int(kernels));
}

void cpu_kernels_unforce() { g_forced_kernels.store(-1); }

const char * cpu_kernels_name(cpu_kernels kernels) {
    switch (kernels) {
        case cpu_kernels::avx512: return "avx512";
        case cpu_kernels::avx2: return "avx2";
        case cpu_kernels::generic: break;
    }
    return "generic";
}

} // namespace qt
