#include "mat-vecs.h"

#include "backend-loader.h"
#include "cpu-ops.h"
#include "q4k-interleaved.h"

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

constexpr int k_q8_0 = 32;
struct block_q8_0 {
    uint16_t d;  // f16
    int8_t   qs[k_q8_0];
};
static_assert(sizeof(block_q8_0) == 34, "ggml's block layout");

// How far ahead of the block in hand the row kernels ask for weights: a thread's rows are one
// contiguous range, and a lone column leaves the kernel waiting on memory without it (the
// talker's q4_K step with the former row kernel, Intel Xeon: 12.2 -> 10.2 ms at 4 KiB, 1 and
// 2 KiB gave less).
constexpr int k_prefetch_bytes = 4096;

// (always inlined: the AVX512 kernels below call it too)
__attribute__((always_inline, target("avx2,fma,f16c"))) inline float hsum_float_8(__m256 x) {
    __m128 res = _mm256_extractf128_ps(x, 1);
    res = _mm_add_ps(res, _mm256_castps256_ps128(x));
    res = _mm_add_ps(res, _mm_movehl_ps(res, res));
    res = _mm_add_ss(res, _mm_movehdup_ps(res));
    return _mm_cvtss_f32(res);
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
    if (is_interleaved_q4k(w)) {  // whatever kernels are active: its rows are for these only
        return interleaved_q4k_product;
    }
#ifdef QT_MATVEC_X86
    const cpu_kernels kernels = cpu_kernels_active();
    if (kernels < cpu_kernels::avx2) {
        return nullptr;
    }
    // VNNI with the AVX512 kernels only: forcing AVX2 (tests, measurements) takes the plain path
    static const bool vnni = cpu_backend_loaded().features.find("AVX512_VNNI") != std::string::npos;
    const bool        use_vnni = vnni && kernels == cpu_kernels::avx512;
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
    if (dot_type == GGML_TYPE_Q8_K) {
        quantize_q8_k(column, out, x->ne[0]);
        return;
    }
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
        GGML_ASSERT(!is_interleaved_q4k(w));
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
