#include "interleaved-rows.h"

#include "backend-loader.h"
#include "cpu-ops.h"
#include "graph.h"
#include "log.h"
#include "model-loader.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#    include <cpuid.h>
#    include <immintrin.h>
#    define QT_INTERLEAVED_X86 1
#    if !defined(__clang__)
// GCC 12's AVX512 intrinsics pass an undefined vector (a self-initialised variable) as the unused
// merge operand, which -Wmaybe-uninitialized and -Wuninitialized report at every use.
#        pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#        pragma GCC diagnostic ignored "-Wuninitialized"
#    endif
#endif

namespace qt {

namespace {

// ggml's q4_K and q8_0 blocks (ggml-common.h, which ggml does not install), checked against
// ggml's sizes in interleave_supported() (q8_K's below).
constexpr int k_qk = 256;
struct block_q4_k {
    uint16_t d, dmin;     // f16
    uint8_t  scales[12];  // 8 scales and 8 mins of 6 bits
    uint8_t  qs[k_qk / 2];
};
static_assert(sizeof(block_q4_k) == 144, "ggml's block layout");
constexpr int k_q8_0 = 32;
struct block_q8_0 {
    uint16_t d;  // f16
    int8_t   qs[k_q8_0];
};
static_assert(sizeof(block_q8_0) == 34, "ggml's block layout");

// One q4_K record: a block of 16 rows.
constexpr size_t k_rows = size_t(k_interleaved_rows);
constexpr size_t k_qs_bytes = 4 * 8 * k_rows * 4;  // [j][q][row][4]
constexpr size_t k_scales_at = k_qs_bytes;         // [w][row] 32-bit words, w < 3
constexpr size_t k_d_at = k_scales_at + 3 * k_rows * 4;
constexpr size_t k_dmin_at = k_d_at + k_rows * 2;
constexpr size_t k_record_bytes = k_dmin_at + k_rows * 2;
static_assert(k_record_bytes == k_rows * sizeof(block_q4_k), "a record is its rows' blocks, rearranged");

// One q8_0 record: two blocks of 16 rows (64-byte aligned where one block would not be).
constexpr size_t k_q8_blocks = 2;
constexpr size_t k_q8_qs_bytes = k_q8_blocks * 8 * k_rows * 4;  // [b][q][row][4]
constexpr size_t k_q8_d_at = k_q8_qs_bytes;                     // [b][row] f16
constexpr size_t k_q8_record_bytes = k_q8_d_at + k_q8_blocks * k_rows * 2;
static_assert(k_q8_record_bytes == k_q8_blocks * k_rows * sizeof(block_q8_0) && k_q8_record_bytes % 64 == 0,
              "a record is its rows' blocks, rearranged, and vectors stay aligned");

} // namespace

bool is_interleaved(const ggml_tensor * w) {
    const size_t n = strlen(w->name), s = strlen(k_interleaved_suffix);
    return (w->type == GGML_TYPE_Q4_K || w->type == GGML_TYPE_Q8_0) && n >= s &&
           strcmp(w->name + n - s, k_interleaved_suffix) == 0;
}

namespace {

// Calls place(rec, r, first) for each row r < 16 of every 16-row group and every record of
// `record_blocks` blocks: rec, the record's bytes in `out`; first, the index of the row's first
// stored block in it (rows of `row_blocks` blocks).
template <class Place>
void for_each_record_row(void * out, int64_t n_rows, int64_t row_blocks, int64_t record_blocks, size_t record_bytes,
                         Place && place) {
    const int64_t n_records = row_blocks / record_blocks;
    for (int64_t g = 0; g < n_rows / int64_t(k_rows); ++g) {
        for (int64_t i = 0; i < n_records; ++i) {
            uint8_t * rec = static_cast<uint8_t *>(out) + size_t(g * n_records + i) * record_bytes;
            for (size_t r = 0; r < k_rows; ++r) {
                place(rec, r, (size_t(g) * k_rows + r) * size_t(row_blocks) + size_t(i * record_blocks));
            }
        }
    }
}

void interleave_q4k(const void * rows, void * out, int64_t n_rows, int64_t k) {
    const auto * in = static_cast<const block_q4_k *>(rows);
    for_each_record_row(out, n_rows, k / k_qk, 1, k_record_bytes, [&](uint8_t * rec, size_t r, size_t first) {
        const block_q4_k & b = in[first];
        for (size_t jq = 0; jq < 32; ++jq) {  // j * 8 + q: bytes 4 jq .. 4 jq + 3 of qs
            memcpy(rec + (jq * k_rows + r) * 4, b.qs + 4 * jq, 4);
        }
        for (size_t w = 0; w < 3; ++w) {
            memcpy(rec + k_scales_at + (w * k_rows + r) * 4, b.scales + 4 * w, 4);
        }
        memcpy(rec + k_d_at + 2 * r, &b.d, 2);
        memcpy(rec + k_dmin_at + 2 * r, &b.dmin, 2);
    });
}

void interleave_q8_0(const void * rows, void * out, int64_t n_rows, int64_t k) {
    const auto * in = static_cast<const block_q8_0 *>(rows);
    for_each_record_row(out, n_rows, k / k_q8_0, int64_t(k_q8_blocks), k_q8_record_bytes,
                        [&](uint8_t * rec, size_t r, size_t first) {
                            for (size_t b = 0; b < k_q8_blocks; ++b) {
                                const block_q8_0 & x = in[first + b];
                                for (size_t q = 0; q < 8; ++q) {
                                    memcpy(rec + ((b * 8 + q) * k_rows + r) * 4, x.qs + 4 * q, 4);
                                }
                                memcpy(rec + k_q8_d_at + (b * k_rows + r) * 2, &x.d, 2);
                            }
                        });
}

} // namespace

void interleave_rows(ggml_type type, const void * rows, void * out, int64_t n_rows, int64_t k) {
    GGML_ASSERT(n_rows % k_interleaved_rows == 0);
    if (type == GGML_TYPE_Q4_K) {
        GGML_ASSERT(k % k_qk == 0);
        interleave_q4k(rows, out, n_rows, k);
    } else {
        GGML_ASSERT(type == GGML_TYPE_Q8_0 && k % (k_q8_0 * int64_t(k_q8_blocks)) == 0);
        interleave_q8_0(rows, out, n_rows, k);
    }
}

#ifdef QT_INTERLEAVED_X86

namespace {

struct block_q8_k {
    float   d;
    int8_t  qs[k_qk];
    int16_t bsums[k_qk / 16];
};
static_assert(sizeof(block_q8_k) == 292, "ggml's block layout");

constexpr int k_group_columns = 8;

// Byte pair (2p, 2p + 1) of each 32-bit word as two 16-bit words, within 128-bit lanes.
__attribute__((always_inline, target("avx2"))) inline __m256i pair_control(int p) {
    const int8_t a = int8_t(2 * p), b = int8_t(2 * p + 1), z = int8_t(0x80);
    return _mm256_setr_epi8(a, z, b, z, a + 4, z, b + 4, z, a + 8, z, b + 8, z, a + 12, z, b + 12, z, a, z, b, z, a + 4,
                            z, b + 4, z, a + 8, z, b + 8, z, a + 12, z, b + 12, z);
}

// Byte b of each 32-bit word as that word (`twice` false: for vpmulld) or in both of its 16-bit
// halves (`twice`: for vpmaddwd), within 128-bit lanes.
__attribute__((always_inline, target("avx2"))) inline __m256i byte_control(int b, bool twice) {
    const auto   c = [b](int word) { return int8_t(4 * word + b); };
    const int8_t z = int8_t(0x80);
    const auto   t = [&](int word) { return twice ? c(word) : z; };
    return _mm256_setr_epi8(c(0), z, t(0), z, c(1), z, t(1), z, c(2), z, t(2), z, c(3), z, t(3), z, c(0), z, t(0), z,
                            c(1), z, t(1), z, c(2), z, t(2), z, c(3), z, t(3), z);
}

__attribute__((always_inline)) inline int32_t load_i32(const void * p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

// How far ahead of the record in hand the kernels ask for weights, and the share of a q4_K
// record's lines each of its four steps asks for. A thread's groups are one contiguous range, but the
// processor's own prefetching leaves the kernels waiting on memory without this: 10 sequences
// side by side at q4_K, perf samples in the 8-column kernel (Zen 5): 32.7k without, 15.6k at
// 2 KiB, 13.6k at 4 KiB, 11.4-11.9k at 8 and 12 KiB; a lone column's kernel varied within noise.
constexpr size_t k_prefetch_bytes = 8192;
constexpr size_t k_lines_per_step = k_record_bytes / 64 / 4;

// Asks for the n_lines cache lines k_prefetch_bytes past `at`.
__attribute__((always_inline)) inline void prefetch_ahead(const uint8_t * at, size_t n_lines) {
    for (size_t line = 0; line < n_lines; ++line) {
        _mm_prefetch(reinterpret_cast<const char *>(at) + k_prefetch_bytes + line * 64, _MM_HINT_T0);
    }
}

// The q4_K kernels' output for one group of 16 rows and COLS columns (COLS <= k_group_columns):
// out[c][0..15] = the rows dotted with column c. ys[c]: the column's q8_K blocks; the four words
// at sums + (c * nb + i) * 4: its eight 32-value sums of block i, paired (sums_of_32).
// DOT4(acc, w, y) adds the dot of each 32-bit lane's four unsigned bytes w by four signed bytes y;
// DOT2(acc, w, y) of two 16-bit pairs. PAIRS16, for the dots without VNNI (where DOT4 takes three
// instructions): a sub-block's eight byte-pair products (vpmaddubsw) add up in 16 bits, each lane
// at most 2 x 15 x 127 (4-bit weights, q8_K values within +-127), eight of them 30480, and one
// vpmaddwd by the scale in both halves of each word then gives the same 32-bit integer as DOT4's
// sums times the scale (vpmulld).
#    define QT_Q4K_GROUP_512(NAME, TARGET, DOT4, DOT2, PAIRS16)                                                       \
        template <int COLS>                                                                                          \
        __attribute__((target(TARGET))) void NAME(const uint8_t * group, int nb, const block_q8_k * const * ys,     \
                                                  const int32_t * sums, float * const * out) {                      \
            __m512 acc[COLS], accm[COLS];                                                                             \
            for (int c = 0; c < COLS; ++c) {                                                                          \
                acc[c] = _mm512_setzero_ps();                                                                         \
                accm[c] = _mm512_setzero_ps();                                                                        \
            }                                                                                                         \
            const __m512i m4 = _mm512_set1_epi8(0x0F), low6 = _mm512_set1_epi8(0x3F), two = _mm512_set1_epi8(0x03);   \
            const __m512i pairs01 = _mm512_broadcast_i64x4(pair_control(0)),                                          \
                          pairs23 = _mm512_broadcast_i64x4(pair_control(1));                                          \
            /* sub-block 2j + g's scale (g = h0 + h: low nibbles 0, high 1) is byte 2 (j % 2) + g of sc[j / 2] */\
            const __m512i scale_of[4] = { _mm512_broadcast_i64x4(byte_control(0, PAIRS16)),                           \
                                          _mm512_broadcast_i64x4(byte_control(1, PAIRS16)),                           \
                                          _mm512_broadcast_i64x4(byte_control(2, PAIRS16)),                           \
                                          _mm512_broadcast_i64x4(byte_control(3, PAIRS16)) };                         \
            for (int i = 0; i < nb; ++i) {                                                                            \
                const uint8_t * rec = group + size_t(i) * k_record_bytes;                                             \
                const auto *    qs = reinterpret_cast<const __m512i *>(rec);                                          \
                const __m512i   u0 = _mm512_loadu_si512(rec + k_scales_at);                                           \
                const __m512i   u1 = _mm512_loadu_si512(rec + k_scales_at + 64);                                      \
                const __m512i   u2 = _mm512_loadu_si512(rec + k_scales_at + 128);                                     \
                /* ggml's unpacking of the 6-bit scales and mins, for 16 rows at once */                             \
                const __m512i sc[2] = {                                                                               \
                    _mm512_and_si512(u0, low6),                                                                       \
                    _mm512_or_si512(_mm512_and_si512(u2, m4),                                                         \
                                    _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u0, 6), two), 4)) };         \
                const __m512i mn_lo = _mm512_and_si512(u1, low6);                                                     \
                const __m512i mn_hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), m4),                 \
                                                      _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u1, 6), two), \
                                                                        4));                                          \
                const __m512i mp[4] = { _mm512_shuffle_epi8(mn_lo, pairs01), _mm512_shuffle_epi8(mn_lo, pairs23),     \
                                        _mm512_shuffle_epi8(mn_hi, pairs01), _mm512_shuffle_epi8(mn_hi, pairs23) };   \
                __m512i isum[COLS];                                                                                   \
                for (int c = 0; c < COLS; ++c) {                                                                      \
                    isum[c] = _mm512_setzero_si512();                                                                 \
                }                                                                                                     \
                for (int j = 0; j < 4; ++j) {                                                                         \
                    prefetch_ahead(rec + size_t(j) * k_lines_per_step * 64, k_lines_per_step);                        \
                    /* both halves at once for few columns, else one: each step of q then feeds   */           \
                    /* COLS * H independent sums, enough to hide the dot's latency                  */           \
                    constexpr int H = COLS <= 4 ? 2 : 1;                                                              \
                    for (int h0 = 0; h0 < 2; h0 += H) {                                                               \
                        __m512i w[H][8];                                                                              \
                        for (int q = 0; q < 8; ++q) {                                                                 \
                            const __m512i bits = _mm512_load_si512(qs + 8 * j + q);                                   \
                            for (int h = 0; h < H; ++h) {                                                             \
                                w[h][q] = _mm512_and_si512(h0 + h ? _mm512_srli_epi16(bits, 4) : bits, m4);           \
                            }                                                                                         \
                        }                                                                                             \
                        __m512i a[H][COLS];                                                                           \
                        for (int h = 0; h < H; ++h) {                                                                 \
                            for (int c = 0; c < COLS; ++c) {                                                          \
                                a[h][c] = _mm512_setzero_si512();                                                     \
                            }                                                                                         \
                        }                                                                                             \
                        for (int q = 0; q < 8; ++q) {                                                                 \
                            for (int h = 0; h < H; ++h) {                                                             \
                                for (int c = 0; c < COLS; ++c) {                                                      \
                                    const int8_t * y = ys[c][i].qs + 64 * j + 32 * (h0 + h) + 4 * q;                  \
                                    const __m512i  yb = _mm512_set1_epi32(load_i32(y));                               \
                                    a[h][c] = PAIRS16 ? _mm512_add_epi16(a[h][c], _mm512_maddubs_epi16(w[h][q], yb))  \
                                                      : DOT4(a[h][c], w[h][q], yb);                                   \
                                }                                                                                     \
                            }                                                                                         \
                        }                                                                                             \
                        for (int h = 0; h < H; ++h) {                                                                 \
                            const __m512i scale = _mm512_shuffle_epi8(sc[j / 2], scale_of[2 * (j % 2) + h0 + h]);     \
                            for (int c = 0; c < COLS; ++c) {                                                          \
                                isum[c] = _mm512_add_epi32(isum[c], PAIRS16 ? _mm512_madd_epi16(a[h][c], scale)       \
                                                                            : _mm512_mullo_epi32(a[h][c], scale));    \
                            }                                                                                         \
                        }                                                                                             \
                    }                                                                                                 \
                }                                                                                                     \
                const __m512 xd = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(rec + k_d_at))); \
                const __m512 xdmin =                                                                                  \
                    _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(rec + k_dmin_at)));          \
                for (int c = 0; c < COLS; ++c) {                                                                      \
                    const int32_t * s = sums + (size_t(c) * size_t(nb) + size_t(i)) * 4;                              \
                    __m512i         msum = _mm512_setzero_si512();                                                    \
                    for (int p = 0; p < 4; ++p) {                                                                     \
                        msum = DOT2(msum, mp[p], _mm512_set1_epi32(s[p]));                                            \
                    }                                                                                                 \
                    const __m512 yd = _mm512_set1_ps(ys[c][i].d);                                                     \
                    acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(xd, yd), _mm512_cvtepi32_ps(isum[c]), acc[c]);             \
                    accm[c] = _mm512_fmadd_ps(_mm512_mul_ps(xdmin, yd), _mm512_cvtepi32_ps(msum), accm[c]);           \
                }                                                                                                     \
            }                                                                                                         \
            for (int c = 0; c < COLS; ++c) {                                                                          \
                _mm512_storeu_ps(out[c], _mm512_sub_ps(acc[c], accm[c]));                                             \
            }                                                                                                         \
        }

QT_Q4K_GROUP_512(group_512_vnni, "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni", _mm512_dpbusd_epi32,
                 _mm512_dpwssd_epi32, false)

__attribute__((always_inline, target("avx2,fma,f16c,avx512f,avx512bw"))) inline __m512i dot4_512(__m512i acc, __m512i w,
                                                                                                __m512i y) {
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w, y), _mm512_set1_epi16(1)));
}
__attribute__((always_inline, target("avx2,fma,f16c,avx512f,avx512bw"))) inline __m512i dot2_512(__m512i acc, __m512i w,
                                                                                                __m512i y) {
    return _mm512_add_epi32(acc, _mm512_madd_epi16(w, y));
}
QT_Q4K_GROUP_512(group_512, "avx2,fma,f16c,avx512f,avx512vl,avx512bw", dot4_512, dot2_512, true)

// Rows 0-7 (half 0) or 8-15 (half 1) of the record's 64-byte vector at `offset`.
__attribute__((always_inline, target("avx2"))) inline __m256i half_at(const uint8_t * rec, size_t offset, int half) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(rec + offset + 32 * size_t(half)));
}

// The same sums with 256-bit vectors: rows 0-7 of the group (half 0), then rows 8-15 (half 1),
// each the low or high 32 bytes of every 64-byte vector of the record. One or two columns take
// both halves in one pass over the records: their product waits on memory, which the second of
// two passes would leave idle (one pass also broadcasts each of the columns' words once). Four
// columns in one pass, whose accumulators overflow the 16 registers, ran 8 % slower in cache. The
// sums of each half are the same either way. DOT4, DOT2 and PAIRS16 as for QT_Q4K_GROUP_512.
#    define QT_Q4K_GROUP_256(NAME, TARGET, DOT4, DOT2, PAIRS16)                                                       \
        template <int COLS>                                                                                          \
        __attribute__((target(TARGET))) void NAME(const uint8_t * group, int nb, const block_q8_k * const * ys,     \
                                                  const int32_t * sums, float * const * out) {                      \
            const __m256i m4 = _mm256_set1_epi8(0x0F), low6 = _mm256_set1_epi8(0x3F), two = _mm256_set1_epi8(0x03);   \
            const __m256i pairs01 = pair_control(0), pairs23 = pair_control(1);                                       \
            const __m256i scale_of[4] = { byte_control(0, PAIRS16), byte_control(1, PAIRS16),                        \
                                          byte_control(2, PAIRS16), byte_control(3, PAIRS16) }; /* as for 512 */      \
            constexpr int P = COLS <= 2 ? 2 : 1; /* halves per pass */                                               \
            for (int half0 = 0; half0 < 2; half0 += P) {                                                              \
                __m256 acc[P][COLS], accm[P][COLS];                                                                   \
                for (int p = 0; p < P; ++p) {                                                                         \
                    for (int c = 0; c < COLS; ++c) {                                                                  \
                        acc[p][c] = _mm256_setzero_ps();                                                              \
                        accm[p][c] = _mm256_setzero_ps();                                                             \
                    }                                                                                                 \
                }                                                                                                     \
                for (int i = 0; i < nb; ++i) {                                                                        \
                    const uint8_t * rec = group + size_t(i) * k_record_bytes;                                         \
                    __m256i         sc[P][2], mp[P][4], isum[P][COLS];                                                \
                    for (int p = 0; p < P; ++p) {                                                                     \
                        const int     half = half0 + p;                                                               \
                        const __m256i u0 = half_at(rec, k_scales_at, half), u1 = half_at(rec, k_scales_at + 64, half),\
                                      u2 = half_at(rec, k_scales_at + 128, half);                                     \
                        sc[p][0] = _mm256_and_si256(u0, low6);                                                        \
                        sc[p][1] = _mm256_or_si256(_mm256_and_si256(u2, m4),                                          \
                                                   _mm256_slli_epi32(                                                 \
                                                       _mm256_and_si256(_mm256_srli_epi32(u0, 6), two), 4));         \
                        const __m256i mn_lo = _mm256_and_si256(u1, low6);                                             \
                        const __m256i mn_hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u2, 4), m4),         \
                                                              _mm256_slli_epi32(                                      \
                                                                  _mm256_and_si256(_mm256_srli_epi32(u1, 6), two), 4));\
                        mp[p][0] = _mm256_shuffle_epi8(mn_lo, pairs01);                                               \
                        mp[p][1] = _mm256_shuffle_epi8(mn_lo, pairs23);                                               \
                        mp[p][2] = _mm256_shuffle_epi8(mn_hi, pairs01);                                               \
                        mp[p][3] = _mm256_shuffle_epi8(mn_hi, pairs23);                                               \
                        for (int c = 0; c < COLS; ++c) {                                                              \
                            isum[p][c] = _mm256_setzero_si256();                                                      \
                        }                                                                                             \
                    }                                                                                                 \
                    for (int j = 0; j < 4; ++j) {                                                                     \
                        prefetch_ahead(rec + size_t(j) * k_lines_per_step * 64, k_lines_per_step);                    \
                        constexpr int H = COLS <= 4 ? 2 : 1; /* as in the AVX512 kernels */                           \
                        for (int h0 = 0; h0 < 2; h0 += H) {                                                           \
                            __m256i a[P][H][COLS];                                                                    \
                            for (int p = 0; p < P; ++p) {                                                             \
                                for (int h = 0; h < H; ++h) {                                                         \
                                    for (int c = 0; c < COLS; ++c) {                                                  \
                                        a[p][h][c] = _mm256_setzero_si256();                                          \
                                    }                                                                                 \
                                }                                                                                     \
                            }                                                                                         \
                            for (int q = 0; q < 8; ++q) {                                                             \
                                __m256i yb[H][COLS];                                                                  \
                                for (int h = 0; h < H; ++h) {                                                         \
                                    for (int c = 0; c < COLS; ++c) {                                                  \
                                        yb[h][c] = _mm256_set1_epi32(                                                 \
                                            load_i32(ys[c][i].qs + 64 * j + 32 * (h0 + h) + 4 * q));                  \
                                    }                                                                                 \
                                }                                                                                     \
                                for (int p = 0; p < P; ++p) {                                                         \
                                    const __m256i bits = half_at(rec, size_t(8 * j + q) * 64, half0 + p);             \
                                    for (int h = 0; h < H; ++h) {                                                     \
                                        const __m256i w =                                                             \
                                            _mm256_and_si256(h0 + h ? _mm256_srli_epi16(bits, 4) : bits, m4);         \
                                        for (int c = 0; c < COLS; ++c) {                                              \
                                            a[p][h][c] = PAIRS16 ? _mm256_add_epi16(a[p][h][c],                       \
                                                                                    _mm256_maddubs_epi16(w, yb[h][c])) \
                                                                 : DOT4(a[p][h][c], w, yb[h][c]);                     \
                                        }                                                                             \
                                    }                                                                                 \
                                }                                                                                     \
                            }                                                                                         \
                            for (int p = 0; p < P; ++p) {                                                             \
                                for (int h = 0; h < H; ++h) {                                                         \
                                    const __m256i scale =                                                             \
                                        _mm256_shuffle_epi8(sc[p][j / 2], scale_of[2 * (j % 2) + h0 + h]);            \
                                    for (int c = 0; c < COLS; ++c) {                                                  \
                                        isum[p][c] = _mm256_add_epi32(isum[p][c],                                     \
                                                                      PAIRS16 ? _mm256_madd_epi16(a[p][h][c], scale)  \
                                                                              : _mm256_mullo_epi32(a[p][h][c], scale));\
                                    }                                                                                 \
                                }                                                                                     \
                            }                                                                                         \
                        }                                                                                             \
                    }                                                                                                 \
                    for (int p = 0; p < P; ++p) {                                                                     \
                        const __m256 xd = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(          \
                            rec + k_d_at + 16 * size_t(half0 + p))));                                                 \
                        const __m256 xdmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(       \
                            rec + k_dmin_at + 16 * size_t(half0 + p))));                                              \
                        for (int c = 0; c < COLS; ++c) {                                                              \
                            const int32_t * s = sums + (size_t(c) * size_t(nb) + size_t(i)) * 4;                      \
                            __m256i         msum = _mm256_setzero_si256();                                            \
                            for (int k = 0; k < 4; ++k) {                                                             \
                                msum = DOT2(msum, mp[p][k], _mm256_set1_epi32(s[k]));                                 \
                            }                                                                                         \
                            const __m256 yd = _mm256_set1_ps(ys[c][i].d);                                             \
                            acc[p][c] = _mm256_fmadd_ps(_mm256_mul_ps(xd, yd), _mm256_cvtepi32_ps(isum[p][c]),        \
                                                        acc[p][c]);                                                   \
                            accm[p][c] = _mm256_fmadd_ps(_mm256_mul_ps(xdmin, yd), _mm256_cvtepi32_ps(msum),          \
                                                         accm[p][c]);                                                 \
                        }                                                                                             \
                    }                                                                                                 \
                }                                                                                                     \
                for (int p = 0; p < P; ++p) {                                                                         \
                    for (int c = 0; c < COLS; ++c) {                                                                  \
                        _mm256_storeu_ps(out[c] + 8 * (half0 + p), _mm256_sub_ps(acc[p][c], accm[p][c]));             \
                    }                                                                                                 \
                }                                                                                                     \
            }                                                                                                         \
        }

__attribute__((always_inline, target("avx2"))) inline __m256i dot4_256(__m256i acc, __m256i w, __m256i y) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, y), _mm256_set1_epi16(1)));
}
__attribute__((always_inline, target("avx2"))) inline __m256i dot2_256(__m256i acc, __m256i w, __m256i y) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(w, y));
}
QT_Q4K_GROUP_256(group_avx2, "avx2,fma,f16c", dot4_256, dot2_256, true)
// AVX-VNNI (Alder Lake and later cores without AVX512; Zen 5): one instruction per dot
QT_Q4K_GROUP_256(group_avx2_vnni, "avx2,fma,f16c,avxvnni", _mm256_dpbusd_avx_epi32, _mm256_dpwssd_avx_epi32,
                 false)

// The q8_0 kernels' output for one group of 16 rows and COLS columns: out[c][0..15]. ys[c]: the
// column's q8_0 blocks; yd[c * nb + i], ysum[c * nb + i]: block i's scale as f32 and the sum of
// its 32 values. The VNNI form dots the weights plus 128 (unsigned, as vpdpbusd takes them) and
// takes 128 times the column's sum back off; the same integers as the AVX2 form's.
template <int COLS>
__attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni"))) void q8_group_512_vnni(
    const uint8_t * group, int nb, const block_q8_0 * const * ys, const float * yd, const int32_t * ysum,
    float * const * out) {
    __m512 acc[COLS];
    for (int c = 0; c < COLS; ++c) {
        acc[c] = _mm512_setzero_ps();
    }
    const __m512i bias = _mm512_set1_epi8(int8_t(0x80));
    for (int r = 0; r < nb / int(k_q8_blocks); ++r) {
        const uint8_t * rec = group + size_t(r) * k_q8_record_bytes;
        prefetch_ahead(rec, k_q8_record_bytes / 64);
        for (int b = 0; b < int(k_q8_blocks); ++b) {
            const int i = r * int(k_q8_blocks) + b;
            __m512i   w[8];
            for (int q = 0; q < 8; ++q) {
                w[q] = _mm512_xor_si512(_mm512_load_si512(rec + size_t(b * 8 + q) * 64), bias);
            }
            __m512i a[COLS];
            for (int c = 0; c < COLS; ++c) {
                a[c] = _mm512_setzero_si512();
            }
            for (int q = 0; q < 8; ++q) {
                for (int c = 0; c < COLS; ++c) {
                    a[c] = _mm512_dpbusd_epi32(a[c], w[q], _mm512_set1_epi32(load_i32(ys[c][i].qs + 4 * q)));
                }
            }
            const __m512 xd =
                _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i *>(rec + k_q8_d_at + size_t(b) * 32)));
            for (int c = 0; c < COLS; ++c) {
                const size_t  at = size_t(c) * size_t(nb) + size_t(i);
                const __m512i isum = _mm512_sub_epi32(a[c], _mm512_set1_epi32(128 * ysum[at]));
                acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(xd, _mm512_set1_ps(yd[at])), _mm512_cvtepi32_ps(isum), acc[c]);
            }
        }
    }
    for (int c = 0; c < COLS; ++c) {
        _mm512_storeu_ps(out[c], acc[c]);
    }
}

// The same with 256-bit vectors and signed bytes: |w| dotted with y carrying w's sign (vpmaddubsw
// takes one unsigned operand; q8_0 values lie in [-127, 127], so the 16-bit pair sums cannot
// saturate). Rows 0-7 and 8-15 are the low and high 32 bytes of every 64-byte vector. Up to
// k_q8_one_pass_columns columns, both halves go in one pass over the records, so that the weights
// stream from memory without a pause (the second pass over a record, from the cache, asked for no
// weights ahead: a lone column's product read 18-20 GB/s from memory where one pass reads 23-43 on
// a Zen 4, and 6-8 % less time at 3 and 4 columns in cache); more columns take rows 0-7 and then
// rows 8-15, as one pass gained nothing there. DOT4 as for QT_Q4K_GROUP_512.
constexpr int k_q8_one_pass_columns = 4;

#    define QT_Q8_GROUP_256(NAME, TARGET, DOT4)                                                                       \
        template <int COLS>                                                                                          \
        __attribute__((target(TARGET))) void NAME(const uint8_t * group, int nb, const block_q8_0 * const * ys,     \
                                                  const float * yd, const int32_t *, float * const * out) {         \
            constexpr int H = COLS <= k_q8_one_pass_columns ? 2 : 1; /* halves per pass */                          \
            for (int h0 = 0; h0 < 2; h0 += H) {                                                                       \
                __m256 acc[H][COLS];                                                                                  \
                for (int h = 0; h < H; ++h) {                                                                         \
                    for (int c = 0; c < COLS; ++c) {                                                                  \
                        acc[h][c] = _mm256_setzero_ps();                                                              \
                    }                                                                                                 \
                }                                                                                                     \
                for (int r = 0; r < nb / int(k_q8_blocks); ++r) {                                                     \
                    const uint8_t * rec = group + size_t(r) * k_q8_record_bytes;                                      \
                    if (h0 == 0) {                                                                                    \
                        prefetch_ahead(rec, k_q8_record_bytes / 64);                                                  \
                    }                                                                                                 \
                    for (int b = 0; b < int(k_q8_blocks); ++b) {                                                      \
                        const int i = r * int(k_q8_blocks) + b;                                                       \
                        __m256i   a[H][COLS];                                                                         \
                        for (int h = 0; h < H; ++h) {                                                                 \
                            for (int c = 0; c < COLS; ++c) {                                                          \
                                a[h][c] = _mm256_setzero_si256();                                                     \
                            }                                                                                         \
                        }                                                                                             \
                        for (int q = 0; q < 8; ++q) {                                                                 \
                            __m256i y[COLS];                                                                          \
                            for (int c = 0; c < COLS; ++c) {                                                          \
                                y[c] = _mm256_set1_epi32(load_i32(ys[c][i].qs + 4 * q));                              \
                            }                                                                                         \
                            for (int h = 0; h < H; ++h) {                                                             \
                                const __m256i w = half_at(rec, size_t(b * 8 + q) * 64, h0 + h);                      \
                                const __m256i aw = _mm256_sign_epi8(w, w);                                            \
                                for (int c = 0; c < COLS; ++c) {                                                      \
                                    a[h][c] = DOT4(a[h][c], aw, _mm256_sign_epi8(y[c], w));                           \
                                }                                                                                     \
                            }                                                                                         \
                        }                                                                                             \
                        for (int h = 0; h < H; ++h) {                                                                 \
                            const __m256 xd = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i *>(       \
                                rec + k_q8_d_at + size_t(b) * 32 + 16 * size_t(h0 + h))));                            \
                            for (int c = 0; c < COLS; ++c) {                                                          \
                                const size_t at = size_t(c) * size_t(nb) + size_t(i);                                \
                                acc[h][c] = _mm256_fmadd_ps(_mm256_mul_ps(xd, _mm256_set1_ps(yd[at])),                \
                                    _mm256_cvtepi32_ps(a[h][c]), acc[h][c]);                                          \
                            }                                                                                         \
                        }                                                                                             \
                    }                                                                                                 \
                }                                                                                                     \
                for (int h = 0; h < H; ++h) {                                                                         \
                    for (int c = 0; c < COLS; ++c) {                                                                  \
                        _mm256_storeu_ps(out[c] + 8 * (h0 + h), acc[h][c]);                                           \
                    }                                                                                                 \
                }                                                                                                     \
            }                                                                                                         \
        }

QT_Q8_GROUP_256(q8_group_avx2, "avx2,fma,f16c", dot4_256)
QT_Q8_GROUP_256(q8_group_avx2_vnni, "avx2,fma,f16c,avxvnni", _mm256_dpbusd_avx_epi32)

using q8_group_kernel = void (*)(const uint8_t *, int, const block_q8_0 * const *, const float *, const int32_t *,
                                 float * const *);

using group_kernel = void (*)(const uint8_t *, int, const block_q8_k * const *, const int32_t *, float * const *);

#    define QT_GROUP_TABLE(KERNEL)                                                                                \
        { KERNEL<1>, KERNEL<2>, KERNEL<3>, KERNEL<4>, KERNEL<5>, KERNEL<6>, KERNEL<7>, KERNEL<8> }

const group_kernel k_avx2_kernels[k_group_columns] = QT_GROUP_TABLE(group_avx2);
const group_kernel k_avx2_vnni_kernels[k_group_columns] = QT_GROUP_TABLE(group_avx2_vnni);
const group_kernel k_512_kernels[k_group_columns] = QT_GROUP_TABLE(group_512);
const group_kernel k_512_vnni_kernels[k_group_columns] = QT_GROUP_TABLE(group_512_vnni);
const q8_group_kernel k_q8_avx2_kernels[k_group_columns] = QT_GROUP_TABLE(q8_group_avx2);
const q8_group_kernel k_q8_avx2_vnni_kernels[k_group_columns] = QT_GROUP_TABLE(q8_group_avx2_vnni);
const q8_group_kernel k_q8_512_vnni_kernels[k_group_columns] = QT_GROUP_TABLE(q8_group_512_vnni);

std::atomic<interleaved_dots> g_dots{ interleaved_dots::variant };

// The kernels for products run now: AVX512 where active, else AVX2, which every machine that
// interleaved its weights has (cpu_kernels_force() lowers the others' kernels, not below what
// interleaved weights need); each with VNNI's dots where the ggml variant has them, so that a
// variant chosen for an older processor (haswell, for Zen 2 and 3) also runs its instructions.
bool use_vnni() {
    static const bool vnni = cpu_backend_loaded().has_feature("AVX512_VNNI");
    return vnni && g_dots.load(std::memory_order_relaxed) != interleaved_dots::no_vnni;
}

// CPUID leaf 7, subleaf 1, EAX bit 4 (compilers' __builtin_cpu_supports names it only lately: clang
// 14 does not). Asked only where the AVX2 kernels run, so the OS saves the 256-bit registers.
bool processor_has_avx_vnni() {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 4)) != 0;
}

bool use_avx_vnni() {
    static const bool variant = cpu_backend_loaded().has_feature("AVX_VNNI");
    static const bool cpu = processor_has_avx_vnni();
    const interleaved_dots dots = g_dots.load(std::memory_order_relaxed);
    return cpu && (dots == interleaved_dots::avx_vnni || (variant && dots == interleaved_dots::variant));
}

const group_kernel * active_kernels() {
    if (cpu_kernels_active() == cpu_kernels::avx512) {
        return use_vnni() ? k_512_vnni_kernels : k_512_kernels;
    }
    return use_avx_vnni() ? k_avx2_vnni_kernels : k_avx2_kernels;
}

// q8_0 has no AVX512 kernel without VNNI: the AVX2 one serves there.
const q8_group_kernel * active_q8_kernels() {
    if (cpu_kernels_active() == cpu_kernels::avx512 && use_vnni()) {
        return k_q8_512_vnni_kernels;
    }
    return use_avx_vnni() ? k_q8_avx2_vnni_kernels : k_q8_avx2_kernels;
}

// A column's block's eight 32-value sums as four words of two 16-bit halves: sums 2p and 2p + 1
// in word p, against the mins 2p and 2p + 1 of a DOT2.
void sums_of_32(const block_q8_k & y, int32_t * words) {
    for (int p = 0; p < 4; ++p) {
        const auto lo = uint16_t(int16_t(y.bsums[4 * p] + y.bsums[4 * p + 1]));
        const auto hi = uint16_t(int16_t(y.bsums[4 * p + 2] + y.bsums[4 * p + 3]));
        words[p] = int32_t(uint32_t(lo) | uint32_t(hi) << 16);
    }
}

// Thread ith of nth's share of a product: its 16-row groups of W (`group_bytes` each), one after
// the other, each against the columns by groups of up to k_group_columns: run(group, c0, n, out),
// out[c] the 16 outputs of column c0 + c.
template <class Run>
void for_each_group(const ggml_tensor * w, size_t group_bytes, ggml_tensor * dst, int ith, int nth, Run && run) {
    const int64_t groups = w->ne[1] / int64_t(k_rows);
    const int     cols = int(dst->ne[1]);
    for (int64_t g = groups * ith / nth; g < groups * (ith + 1) / nth; ++g) {
        const uint8_t * group = static_cast<const uint8_t *>(w->data) + size_t(g) * group_bytes;
        for (int c0 = 0; c0 < cols; c0 += k_group_columns) {
            const int n = std::min(cols - c0, k_group_columns);
            float *   out[k_group_columns];
            for (int c = 0; c < n; ++c) {
                out[c] = reinterpret_cast<float *>(static_cast<char *>(dst->data) + size_t(c0 + c) * dst->nb[1]) +
                         g * int64_t(k_rows);
            }
            run(group, c0, n, out);
        }
    }
}

void q8_0_product(const ggml_tensor * w, const char * xq, size_t xq_stride, ggml_tensor * dst, int ith, int nth) {
    const int     nb = int(w->ne[0] / k_q8_0);
    const int     cols = int(dst->ne[1]);
    thread_local std::vector<const block_q8_0 *> ys;
    thread_local std::vector<float>              yd;
    thread_local std::vector<int32_t>            ysum;
    ys.resize(size_t(cols));
    yd.resize(size_t(cols) * size_t(nb));
    ysum.resize(size_t(cols) * size_t(nb));
    for (int c = 0; c < cols; ++c) {
        ys[size_t(c)] = reinterpret_cast<const block_q8_0 *>(xq + size_t(c) * xq_stride);
        for (int i = 0; i < nb; ++i) {
            const block_q8_0 & y = ys[size_t(c)][i];
            int32_t            sum = 0;
            for (int k = 0; k < k_q8_0; ++k) {
                sum += y.qs[k];
            }
            yd[size_t(c) * size_t(nb) + size_t(i)] = ggml_fp16_to_fp32(y.d);
            ysum[size_t(c) * size_t(nb) + size_t(i)] = sum;
        }
    }
    const q8_group_kernel * kernels = active_q8_kernels();
    for_each_group(w, size_t(nb) / k_q8_blocks * k_q8_record_bytes, dst, ith, nth,
                   [&](const uint8_t * group, int c0, int n, float * const * out) {
                       const size_t at = size_t(c0) * size_t(nb);
                       kernels[n - 1](group, nb, ys.data() + c0, yd.data() + at, ysum.data() + at, out);
                   });
}

void q4k_product(const ggml_tensor * w, const char * xq, size_t xq_stride, ggml_tensor * dst, int ith, int nth) {
    const int     nb = int(w->ne[0] / k_qk);
    const int     cols = int(dst->ne[1]);
    thread_local std::vector<const block_q8_k *> ys;
    thread_local std::vector<int32_t>            sums;
    ys.resize(size_t(cols));
    sums.resize(size_t(cols) * size_t(nb) * 4);
    for (int c = 0; c < cols; ++c) {
        ys[size_t(c)] = reinterpret_cast<const block_q8_k *>(xq + size_t(c) * xq_stride);
        for (int i = 0; i < nb; ++i) {
            sums_of_32(ys[size_t(c)][i], sums.data() + (size_t(c) * size_t(nb) + size_t(i)) * 4);
        }
    }
    const group_kernel * kernels = active_kernels();
    for_each_group(w, size_t(nb) * k_record_bytes, dst, ith, nth,
                   [&](const uint8_t * group, int c0, int n, float * const * out) {
                       kernels[n - 1](group, nb, ys.data() + c0, sums.data() + size_t(c0) * size_t(nb) * 4, out);
                   });
}

} // namespace

void interleaved_product(const ggml_tensor * w, const char * xq, size_t xq_stride, ggml_tensor * dst, int ith,
                         int nth) {
    (w->type == GGML_TYPE_Q4_K ? q4k_product : q8_0_product)(w, xq, xq_stride, dst, ith, nth);
}

// ggml's quantize_row_q8_K (its x86 build runs the scalar reference) with AVX2, the same bits for
// finite inputs: the block's scale from its first value of largest magnitude, each value times
// -127 / that value rounded to the nearest integer, ties to even (as the reference's float trick
// rounds), and the 16-value sums. An all-zero block gets zero sums where the reference leaves
// them as they were; its scale is zero, so they add only zeros to any dot product.
__attribute__((target("avx2,fma,f16c"))) void quantize_q8_k(const float * x, void * out_blocks, int64_t k) {
    auto * y = static_cast<block_q8_k *>(out_blocks);
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

void interleaved_force_dots(interleaved_dots dots) { g_dots.store(dots, std::memory_order_relaxed); }

#else

// Nothing is interleaved where q4k_interleave_supported() is false.
void interleaved_product(const ggml_tensor *, const char *, size_t, ggml_tensor *, int, int) {
    GGML_ABORT("interleaved q4_K weights on a CPU without the kernels");
}

void quantize_q8_k(const float *, void *, int64_t) { GGML_ABORT("q8_K columns on a CPU without the kernels"); }

void interleaved_force_dots(interleaved_dots) {}

#endif  // QT_INTERLEAVED_X86

bool interleave_supported(ggml_type type) {
#ifdef QT_INTERLEAVED_X86
    if (cpu_kernels_best() < cpu_kernels::avx2) {
        return false;
    }
    if (type == GGML_TYPE_Q4_K) {
        return ggml_type_size(GGML_TYPE_Q4_K) == sizeof(block_q4_k) && ggml_blck_size(GGML_TYPE_Q4_K) == k_qk &&
               ggml_type_size(GGML_TYPE_Q8_K) == sizeof(block_q8_k);
    }
    return type == GGML_TYPE_Q8_0 && ggml_type_size(GGML_TYPE_Q8_0) == sizeof(block_q8_0) &&
           ggml_blck_size(GGML_TYPE_Q8_0) == k_q8_0;
#else
    (void) type;
    return false;
#endif
}

ggml_tensor * interleaved_weights::adopt(const model_loader & loader, ggml_tensor * w) {
    const int64_t depth = w->type == GGML_TYPE_Q4_K ? k_qk : k_q8_0 * int64_t(k_q8_blocks);
    if (!interleave_supported(w->type) || !loader.on_cpu() || !ggml_is_contiguous(w) || ggml_n_dims(w) != 2 ||
        w->ne[1] % k_interleaved_rows != 0 || w->ne[0] % depth != 0) {
        return w;
    }
    if (!ctx_) {
        ctx_ = new_metadata_context(256, false, "interleaved weights");
    }
    ggml_tensor * t = ggml_new_tensor_2d(ctx_.get(), w->type, w->ne[0], w->ne[1]);
    if (!t) {
        throw error(QT_STATUS_OUT_OF_MEMORY, "too many interleaved weights for their context");
    }
    ggml_format_name(t, "%.*s%s", int(GGML_MAX_NAME - 1 - strlen(k_interleaved_suffix)), w->name, k_interleaved_suffix);
    pending_.push_back({ w, t, loader.maps(w) });
    return t;
}

void interleaved_weights::commit(const model_loader & loader) {
    if (pending_.empty()) {
        return;
    }
    buffer_.reset(ggml_backend_alloc_ctx_tensors_from_buft(ctx_.get(), ggml_backend_cpu_buffer_type()));
    if (!buffer_) {
        throw error(QT_STATUS_OUT_OF_MEMORY,
                    format("not enough memory for the interleaved weights of %s", loader.path().c_str()));
    }
    ggml_backend_buffer_set_usage(buffer_.get(), GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
}

void interleaved_weights::fill() const {
    std::call_once(*filled_, [this] {
        if (pending_.empty()) {
            return;
        }
        size_t n_q4k = 0, n_q8_0 = 0;
        for (const pending & p : pending_) {
            interleave_rows(p.stored->type, p.stored->data, p.interleaved->data, p.stored->ne[1], p.stored->ne[0]);
            if (p.mapped) {
                model_loader::release_pages(p.stored);
            }
            ++(p.stored->type == GGML_TYPE_Q4_K ? n_q4k : n_q8_0);
        }
        QT_LOG_INFO("interleaved by 16 rows: %zu q4_K and %zu q8_0 matrices, %.1f MiB", n_q4k, n_q8_0,
                    double(ggml_backend_buffer_get_size(buffer_.get())) / (1024.0 * 1024.0));
    });
}

} // namespace qt
