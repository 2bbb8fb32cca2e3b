#include "mat-vecs.h"

#include "backend-loader.h"

#include <algorithm>
#include <cstring>

namespace qt {

namespace {

const ggml_type_traits_cpu * traits_of(ggml_type type) {
    auto get = cpu_backend_loaded().type_traits;
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
// Threads take blocks of 16 weight rows (as ggml's own chunks), each row dotted with every column
// while it is in the first-level cache.
void product_op(ggml_tensor * dst, int ith, int nth, void * /*userdata*/) {
    const ggml_tensor *          w = dst->src[0];
    const ggml_tensor *          x = dst->src[1];
    const ggml_type_traits_cpu * traits = traits_of(w->type);
    const int64_t                k = w->ne[0], n = w->ne[1], cols = dst->ne[1];
    constexpr int64_t            k_rows = 16;
    const int64_t                n_chunks = (n + k_rows - 1) / k_rows;
    for (int64_t chunk = ith; chunk < n_chunks; chunk += nth) {
        const int64_t r0 = chunk * k_rows, r1 = std::min(n, r0 + k_rows);
        for (int64_t c = 0; c < cols; ++c) {
            const char * col = static_cast<const char *>(x->data) + c * x->nb[1];
            float *      out = reinterpret_cast<float *>(static_cast<char *>(dst->data) + c * dst->nb[1]);
            for (int64_t r = r0; r < r1; ++r) {
                traits->vec_dot(int(k), out + r, 0, static_cast<const char *>(w->data) + r * w->nb[1], 0, col, 0, 1);
            }
        }
    }
}

} // namespace

ggml_tensor * mat_vecs(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x) {
    GGML_ASSERT(x->type == GGML_TYPE_F32 && x->ne[0] == w->ne[0] && x->ne[2] == 1 && x->ne[3] == 1 &&
                x->nb[0] == sizeof(float) && ggml_is_contiguous_rows(w) && w->ne[2] == 1 && w->ne[3] == 1);
    const int64_t cols = x->ne[1];
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
