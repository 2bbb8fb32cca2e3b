#include "mat-vecs.h"

#include "backend-loader.h"
#include "cpu-ops.h"
#include "interleaved-rows.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace qt {

namespace {

// Weight rows a thread takes at a time (as ggml's own chunks); thread ith takes chunks ith,
// ith + nth, ...
constexpr int64_t k_chunk_rows = 16;

// Most columns an interleaved product converts in every thread (a few microseconds, where a
// conversion node of its own costs a barrier); past this (a prefill) one node converts them, split
// by column.
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
// bits faster for q8_K: interleaved weights exist on AVX2 machines only).
void convert_column(const ggml_tensor * x, int64_t c, ggml_type dot_type, char * out) {
    const float * column = reinterpret_cast<const float *>(static_cast<const char *>(x->data) + c * x->nb[1]);
    if (dot_type == GGML_TYPE_Q8_K) {
        quantize_q8_k(column, out, x->ne[0]);
        return;
    }
    traits_of(dot_type)->from_float(column, out, x->ne[0]);
}

// ggml custom op: dst (N, B) f32 = W x for src = { W (K, N) interleaved, x (K, B) f32 }. Every
// thread converts all the columns itself: a few microseconds for the columns of a decoding step,
// where a conversion node of its own would cost a barrier.
void converting_product_op(ggml_tensor * dst, int ith, int nth, void * /*userdata*/) {
    const ggml_tensor * w = dst->src[0];
    const ggml_tensor * x = dst->src[1];
    const ggml_type     dot_type = traits_of(w->type)->vec_dot_type;
    const size_t        stride = ggml_row_size(dot_type, x->ne[0]);
    thread_local std::vector<char> xq;
    xq.resize(stride * size_t(x->ne[1]));
    for (int64_t c = 0; c < x->ne[1]; ++c) {
        convert_column(x, c, dot_type, xq.data() + size_t(c) * stride);
    }
    interleaved_product(w, xq.data(), stride, dst, ith, nth);
}

// ggml custom op: dst (row_bytes, B) i8 = the columns of src0 = x (K, B) f32 in the dot type of
// src1 = W, for an interleaved product; threads take whole columns (the many positions of a
// prefill).
void convert_columns_op(ggml_tensor * dst, int ith, int nth, void * /*userdata*/) {
    const ggml_type dot_type = traits_of(dst->src[1]->type)->vec_dot_type;
    for (int64_t c = ith; c < dst->ne[1]; c += nth) {
        convert_column(dst->src[0], c, dot_type, static_cast<char *>(dst->data) + c * dst->nb[1]);
    }
}

// ggml custom op: dst (N, B) f32 = W x for src = { W (K, N) interleaved, x (row_bytes, B) in W's
// dot type }.
void rows_product_op(ggml_tensor * dst, int ith, int nth, void * /*userdata*/) {
    const ggml_tensor * x = dst->src[1];
    interleaved_product(dst->src[0], static_cast<const char *>(x->data), x->nb[1], dst, ith, nth);
}

} // namespace

ggml_tensor * mat_vecs(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x) {
    GGML_ASSERT(x->type == GGML_TYPE_F32 && x->ne[0] == w->ne[0] && x->ne[2] == 1 && x->ne[3] == 1 &&
                x->nb[0] == sizeof(float) && ggml_is_contiguous_rows(w) && w->ne[2] == 1 && w->ne[3] == 1);
    const int64_t cols = x->ne[1];
    if (standard_ops_only()) {  // a device: one product, its own kernels, accumulating in f32
        GGML_ASSERT(!is_interleaved(w));
        ggml_tensor * y = ggml_mul_mat(ctx, w, x);
        ggml_mul_mat_set_prec(y, GGML_PREC_F32);
        return y;
    }
    if (is_interleaved(w)) {  // whatever kernels are active: its rows are for these only
        if (cols <= k_max_columns) {
            ggml_tensor * args[] = { w, x };
            return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], cols, 1, 1, args, 2, converting_product_op,
                                  GGML_N_TASKS_MAX, nullptr);
        }
        // a prefill's many columns: converted once, the threads sharing the work
        const ggml_type dot_type = traits_of(w->type)->vec_dot_type;
        ggml_tensor *   convert_args[] = { x, w };
        ggml_tensor *   xq = ggml_custom_4d(ctx, GGML_TYPE_I8, int64_t(ggml_row_size(dot_type, x->ne[0])), cols, 1, 1,
                                            convert_args, 2, convert_columns_op, GGML_N_TASKS_MAX, nullptr);
        ggml_tensor *   args[] = { w, xq };
        return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], cols, 1, 1, args, 2, rows_product_op, GGML_N_TASKS_MAX,
                              nullptr);
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
