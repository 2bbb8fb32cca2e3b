#include "winograd.h"

#include "cpu-ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

namespace qt {

namespace {

constexpr int k_m = k_winograd_outputs;
constexpr int k_max_r = k_winograd_max_taps;
constexpr int k_max_a = k_m + k_max_r - 1;

// Toom-Cook for the correlation y_j = sum_k g_k d_{j+k} (j < m, k < r, d of length a = m + r - 1):
// it is the transpose of the polynomial product g(x) h(x) (degree m - 1 for h), which evaluation
// at a - 1 points plus infinity computes exactly. With E_n the a x n evaluation matrix (rows
// [1, p, .., p^(n-1)], and [0, .., 0, 1] for infinity), y = E_m^T ((E_r g) * (E_a^-T d)). Not
// copied: `weights` points into it.
struct filter {
    int             r;                          // taps
    int             a;                          // points, m + r - 1
    float           input[k_max_a][k_max_a];    // B^T = E_a^-T
    float           output[k_m][k_max_a];       // A^T = E_m^T
    float           weight[k_max_a * k_max_r];  // G = E_r, [p * r + k]: powers of the points (exact)
    tap_combination weights;                    // G for dense_taps

    filter(int taps, const double * finite);
    filter(const filter &) = delete;
    filter & operator=(const filter &) = delete;
};

filter::filter(int taps, const double * finite) :
    r(taps),
    a(k_m + taps - 1),
    input{},
    output{},
    weight{},
    weights{ k_m + taps - 1, taps, weight } {
    auto evaluation = [&](int point, int power, int n) {
        if (point == a - 1) {
            return power == n - 1 ? 1.0 : 0.0;  // infinity: the leading coefficient
        }
        return std::pow(finite[point], power);
    };
    // E_a^-1 by Gauss-Jordan with partial pivoting, in double.
    double e[k_max_a][2 * k_max_a] = {};
    for (int i = 0; i < a; ++i) {
        for (int j = 0; j < a; ++j) {
            e[i][j] = evaluation(i, j, a);
        }
        e[i][a + i] = 1.0;
    }
    for (int c = 0; c < a; ++c) {
        int pivot = c;
        for (int i = c + 1; i < a; ++i) {
            if (std::fabs(e[i][c]) > std::fabs(e[pivot][c])) {
                pivot = i;
            }
        }
        std::swap(e[c], e[pivot]);
        const double p = e[c][c];
        for (int j = 0; j < 2 * a; ++j) {
            e[c][j] /= p;
        }
        for (int i = 0; i < a; ++i) {
            if (i != c && e[i][c] != 0.0) {
                const double g = e[i][c];
                for (int j = 0; j < 2 * a; ++j) {
                    e[i][j] -= g * e[c][j];
                }
            }
        }
    }
    for (int i = 0; i < a; ++i) {
        for (int j = 0; j < a; ++j) {
            const double v = e[j][a + i];  // (E_a^-1)^T
            input[i][j] = std::fabs(v) < 1e-12 ? 0.0f : float(v);
        }
        for (int k = 0; k < r; ++k) {
            weight[i * r + k] = float(evaluation(i, k, r));
        }
        for (int j = 0; j < k_m; ++j) {
            output[j][i] = float(evaluation(i, j, k_m));
        }
    }
}

// The filters' points, symmetric about 0 and with few powers of two where they can be, keep the
// f32 error low (chosen by measuring the error of each candidate set against the direct
// convolution): F(4, 7) for the residual units' convolutions, F(4, 2) for the phases of the
// transposed ones.
const filter & filter_for(int taps) {
    static const double seven[] = { 0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 0.75, -0.75 };
    static const double two[] = { 0.0, 1.0, -1.0, -2.0 };
    static const filter f7(7, seven);
    static const filter f2(2, two);
    GGML_ASSERT(winograd_taps_supported(taps));
    return taps == 7 ? f7 : f2;
}

// Tiles: tile n covers outputs base + dilation * j (j < m) with base = (n / dilation) * dilation *
// m + n % dilation, so a tile's inputs are every dilation-th frame, as for an undilated filter.
// Outputs past t_out are not computed; inputs past x's end count as zeros.
struct tiling {
    int64_t dilation;
    int64_t t_out;
    int64_t n_tiles;

    tiling(int64_t d, int64_t t) : dilation(d), t_out(t), n_tiles((t + d * k_m - 1) / (d * k_m) * d) {}
    int64_t base(int64_t n) const { return n / dilation * dilation * k_m + n % dilation; }
};

// userdata of both transforms: the filter's taps, the dilation, the piece's first tile, and for
// the output transform whether it writes into the outputs of the pieces before it (src[0]) in place.
struct piece {
    int     taps;
    int64_t dilation;
    int64_t first_tile;
    bool    in_place;
};

static_assert(k_winograd_max_taps < 8, "a piece's taps take 3 bits");

void * pack_piece(const piece & p) {
    return reinterpret_cast<void *>(uintptr_t(p.first_tile) << 12 | uintptr_t(p.taps) << 9 |
                                    uintptr_t(p.in_place) << 8 | uintptr_t(p.dilation));
}

piece unpack_piece(void * userdata) {
    const uintptr_t u = reinterpret_cast<uintptr_t>(userdata);
    return { int(u >> 9 & 7), int64_t(u & 0xff), int64_t(u >> 12), (u >> 8 & 1) != 0 };
}

void split(int64_t n, int ith, int nth, int64_t * first, int64_t * last) {
    *first = n * ith / nth;
    *last = n * (ith + 1) / nth;
}

// out[c] = sum_i coef[i] * rows[i][c] (at least one row), in blocks of 16 channels that stay in
// registers. Everything below is inlined into one function per instruction set (the wrappers at
// the end). The blocks are GCC vectors V, not loops left to the auto-vectoriser, which kept them
// scalar (16 single-lane FMAs per row): one 16-lane vector for AVX512, two 8-lane ones for AVX2
// (a 16-lane vector there went through the stack at every row), four 4-lane ones elsewhere; the
// same FMAs lane by lane, so AVX2 and AVX512 give the same bits, and the same as the scalar tail.
#define QT_INLINE inline __attribute__((always_inline))
constexpr int k_block = 16;
typedef float vec16 __attribute__((vector_size(16 * sizeof(float))));
typedef float vec8 __attribute__((vector_size(8 * sizeof(float))));
typedef float vec4 __attribute__((vector_size(4 * sizeof(float))));

template <class V>
QT_INLINE void combine_block(float * out, const float * const * rows, const float * coef, int n_rows, int64_t c0) {
    constexpr int n_vecs = k_block * int(sizeof(float)) / int(sizeof(V));
    V             acc[n_vecs] = {};
    for (int i = 0; i < n_rows; ++i) {
        for (int v = 0; v < n_vecs; ++v) {
            V r;
            std::memcpy(&r, rows[i] + c0 + v * int64_t(sizeof(V) / sizeof(float)), sizeof(r));
            acc[v] += coef[i] * r;
        }
    }
    std::memcpy(out + c0, acc, sizeof(acc));
}

QT_INLINE void combine_one(float * out, const float * const * rows, const float * coef, int n_rows, int64_t c) {
    float acc = 0.0f;
    for (int i = 0; i < n_rows; ++i) {
        acc += coef[i] * rows[i][c];
    }
    out[c] = acc;
}

template <class V>
QT_INLINE void combine(float * out, const float * const * rows, const float * coef, int n_rows, int64_t C) {
    int64_t c0 = 0;
    for (; c0 + k_block <= C; c0 += k_block) {
        combine_block<V>(out, rows, coef, n_rows, c0);
    }
    for (; c0 < C; ++c0) {
        combine_one(out, rows, coef, n_rows, c0);
    }
}

// src[0] = x (C, (r - 1) d + T), dst = V (C, tiles, points) for the piece's tiles; userdata: the piece.
template <class V> QT_INLINE void input_transform(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const ggml_tensor * x = dst->src[0];
    const piece         pc = unpack_piece(userdata);
    const int64_t       d = pc.dilation;
    const int64_t       C = x->ne[0];
    const int64_t       t_in = x->ne[1];
    const filter &      tf = filter_for(pc.taps);
    const int           a = tf.a;
    const tiling        tl(d, t_in - (tf.r - 1) * d);
    int64_t             first = 0, last = 0;
    split(dst->ne[1], ith, nth, &first, &last);
    for (int64_t n = first; n < last; ++n) {
        const int64_t base = tl.base(pc.first_tile + n);
        const float * in[k_max_a];
        for (int i = 0; i < a; ++i) {
            const int64_t t = base + d * i;
            in[i] = t < t_in ? reinterpret_cast<const float *>(static_cast<const char *>(x->data) + t * x->nb[1])
                             : nullptr;
        }
        for (int p = 0; p < a; ++p) {
            const float * rows[k_max_a];
            float         coef[k_max_a];
            int           n_rows = 0;
            for (int i = 0; i < a; ++i) {
                if (in[i] && tf.input[p][i] != 0.0f) {
                    rows[n_rows] = in[i];
                    coef[n_rows++] = tf.input[p][i];
                }
            }
            float * out = reinterpret_cast<float *>(static_cast<char *>(dst->data) + p * dst->nb[2] + n * dst->nb[1]);
            if (n_rows == 0) {
                std::memset(out, 0, size_t(C) * sizeof(float));
            } else {
                combine<V>(out, rows, coef, n_rows, C);
            }
        }
    }
}

// src = { M (C, tiles, points) of the piece's tiles, bias (C) or null }, after y (C, T) where in
// place; dst = y, of which the piece writes its tiles' outputs; userdata: the piece.
template <class V> QT_INLINE void output_transform(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const piece         pc = unpack_piece(userdata);
    const ggml_tensor * m = dst->src[pc.in_place ? 1 : 0];
    const ggml_tensor * b = dst->src[pc.in_place ? 2 : 1];
    const int64_t       d = pc.dilation;
    const int64_t       C = dst->ne[0];
    const tiling        tl(d, dst->ne[1]);
    const filter &      tf = filter_for(pc.taps);
    int64_t             first = 0, last = 0;
    split(m->ne[1], ith, nth, &first, &last);
    static const float one = 1.0f;
    for (int64_t n = first; n < last; ++n) {
        const int64_t base = tl.base(pc.first_tile + n);
        for (int j = 0; j < k_m; ++j) {
            const int64_t t = base + d * j;
            if (t >= tl.t_out) {
                break;
            }
            const float * rows[k_max_a + 1];
            float         coef[k_max_a + 1];
            int           n_rows = 0;
            for (int p = 0; p < tf.a; ++p) {
                if (tf.output[j][p] != 0.0f) {
                    rows[n_rows] = reinterpret_cast<const float *>(static_cast<const char *>(m->data) + p * m->nb[2] +
                                                                   n * m->nb[1]);
                    coef[n_rows++] = tf.output[j][p];
                }
            }
            if (b) {
                rows[n_rows] = static_cast<const float *>(b->data);
                coef[n_rows++] = one;
            }
            float * y = reinterpret_cast<float *>(static_cast<char *>(dst->data) + t * dst->nb[1]);
            combine<V>(y, rows, coef, n_rows, C);
        }
    }
}

void input_generic(ggml_tensor * dst, int ith, int nth, void * userdata) {
    input_transform<vec4>(dst, ith, nth, userdata);
}
void output_generic(ggml_tensor * dst, int ith, int nth, void * userdata) {
    output_transform<vec4>(dst, ith, nth, userdata);
}

#if defined(__GNUC__) && defined(__x86_64__)
#    define QT_WINOGRAD_X86 1
__attribute__((target("avx2,fma"))) void input_avx2(ggml_tensor * dst, int ith, int nth, void * userdata) {
    input_transform<vec8>(dst, ith, nth, userdata);
}
__attribute__((target("avx2,fma"))) void output_avx2(ggml_tensor * dst, int ith, int nth, void * userdata) {
    output_transform<vec8>(dst, ith, nth, userdata);
}
__attribute__((target("avx512f,avx512vl,avx2,fma"))) void input_avx512(ggml_tensor * dst, int ith, int nth,
                                                                       void * userdata) {
    input_transform<vec16>(dst, ith, nth, userdata);
}
__attribute__((target("avx512f,avx512vl,avx2,fma"))) void output_avx512(ggml_tensor * dst, int ith, int nth,
                                                                        void * userdata) {
    output_transform<vec16>(dst, ith, nth, userdata);
}
#endif

} // namespace

bool winograd_taps_supported(int taps) {
    return taps == 7 || taps == 2;
}

const tap_combination & winograd_weight_transform(int taps) {
    return filter_for(taps).weights;
}

ggml_tensor * winograd_conv(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, ggml_tensor * b, int dilation,
                            int64_t piece_bytes) {
    const int64_t c_in = w->ne[0];
    const int64_t c_out = w->ne[2];
    GGML_ASSERT(x->type == GGML_TYPE_F32 && x->nb[0] == sizeof(float) && x->ne[0] == c_in && x->ne[2] == 1 &&
                x->ne[3] == 1);
    const int taps = int(w->ne[1]);
    GGML_ASSERT(winograd_taps_supported(taps) && w->ne[3] == 1);
    GGML_ASSERT(!b || (b->type == GGML_TYPE_F32 && ggml_is_contiguous(b) && ggml_nelements(b) == c_out));
    GGML_ASSERT(dilation >= 1 && dilation < 256 && x->ne[1] > int64_t(taps - 1) * dilation);  // 8 bits of a piece
    const int64_t t_out = x->ne[1] - int64_t(taps - 1) * dilation;
    const int     points = k_m + taps - 1;
    const tiling  tl(dilation, t_out);
    ggml_custom_op_t input_op = input_generic, output_op = output_generic;
#ifdef QT_WINOGRAD_X86
    switch (cpu_kernels_active()) {
        case cpu_kernels::avx512: input_op = input_avx512, output_op = output_avx512; break;
        case cpu_kernels::avx2: input_op = input_avx2, output_op = output_avx2; break;
        case cpu_kernels::generic: break;
    }
#endif

    // A piece's transformed inputs and products are dead once its outputs are written, so the
    // compute buffer holds one piece's instead of all of them: at 24 kHz, 8 frames of 96 channels
    // transform into 29 MiB. Each tile is computed alike in any piece (the GEMM's sums run over
    // the channels only).
    GGML_ASSERT(piece_bytes > 0);
    const int64_t tile_bytes = (c_in + c_out) * points * int64_t(sizeof(float));
    const int64_t n_pieces = std::min(tl.n_tiles, (tl.n_tiles * tile_bytes + piece_bytes - 1) / piece_bytes);
    ggml_tensor * y = nullptr;
    for (int64_t i = 0; i < n_pieces; ++i) {
        const int64_t first = tl.n_tiles * i / n_pieces;
        const int64_t count = tl.n_tiles * (i + 1) / n_pieces - first;
        ggml_tensor * in_args[] = { x };
        ggml_tensor * v = ggml_custom_4d(ctx, GGML_TYPE_F32, c_in, count, points, 1, in_args, 1, input_op,
                                         GGML_N_TASKS_MAX, pack_piece({ taps, dilation, first, false }));
        // (C_out, tiles, points): one product per point
        ggml_tensor * m = dense_taps(ctx, w, winograd_weight_transform(taps), v);
        ggml_tensor * out_args[] = { m, b };
        y = y ? ggml_custom_inplace(ctx, y, out_args, b ? 2 : 1, output_op, GGML_N_TASKS_MAX,
                                    pack_piece({ taps, dilation, first, true }))
              : ggml_custom_4d(ctx, GGML_TYPE_F32, c_out, t_out, 1, 1, out_args, b ? 2 : 1, output_op,
                               GGML_N_TASKS_MAX, pack_piece({ taps, dilation, first, false }));
    }
    return y;
}

} // namespace qt
