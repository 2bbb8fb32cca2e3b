// Fused f32 kernels as ggml custom ops.
//
// ggml computes f32 matrix products with one dot product per output: about 25-30 GFLOP/s on
// two Zen 2 cores, where the FPU allows ~150. The convolutions of the speaker encoder and the
// codec run over hundreds to thousands of frames and are all matrix products, so they use a
// packed, register-tiled GEMM here, with bias and residual folded in, an ELU fused with zero
// padding, and the codec's SnakeBeta activation with a vectorised sine (it runs on ~35 M
// elements per second of audio). Each has an AVX2/FMA and an AVX512 path, chosen when a graph
// is built (cpu_kernels_active()); both give the same bits. Without AVX2/FMA, plain ggml ops
// (and a scalar ELU) are used.
#pragma once

#include "ggml.h"

#include <cstdint>
#include <vector>

namespace qt {

// The instruction sets of the kernels here, lowest first.
enum class cpu_kernels { generic, avx2, avx512 };

// The best kernels that both the processor and the loaded ggml CPU variant support (a variant
// forced by VOCABLE_CPU_VARIANT lowers them too).
cpu_kernels cpu_kernels_best();
// What graphs built from now on use: the best, or what cpu_kernels_force() set.
cpu_kernels cpu_kernels_active();
// For tests and measurements: build graphs with `kernels` (at most cpu_kernels_best()) until
// cpu_kernels_unforce(). Process-wide.
void        cpu_kernels_force(cpu_kernels kernels);
void        cpu_kernels_unforce();
const char * cpu_kernels_name(cpu_kernels kernels);

// While an active one lives, graphs built on this thread use ggml's standard ops only, for a
// device backend, which runs no custom op: cpu_kernels_active() answers generic there and
// mat_vecs (mat-vecs.h) is a plain ggml_mul_mat. Scopes nest.
class standard_ops_scope {
public:
    explicit standard_ops_scope(bool active);
    ~standard_ops_scope();
    standard_ops_scope(const standard_ops_scope &) = delete;
    standard_ops_scope & operator=(const standard_ops_scope &) = delete;

private:
    bool previous_;
};
// Whether a standard_ops_scope is active on this thread.
bool standard_ops_only();

// y (N, T, B) = W^T x (+ b) (+ r) for x = (K, T, B) with rows at any stride (overlapping
// sliding windows included) and W = (K, N, Bw) with rows at any stride, B % Bw == 0 (batch i
// uses W batch i / (B / Bw), as ggml_mul_mat broadcasts). With `r_in_place`, y overwrites r
// (r must have no later use).
ggml_tensor * dense(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, ggml_tensor * b = nullptr,
                    ggml_tensor * r = nullptr, bool r_in_place = false);

// A weight matrix (K, N) for dense(), f16 rows packed once at load into the GEMM's panel order
// (32 outputs by 256-deep blocks), so that a product over few frames, which would convert and
// transpose every panel again for every graph, only widens them to f32. Same values, same sums,
// same bits as the rows as stored; same memory as the f16 rows. `panels` null: `plain` is used
// as stored (any type).
struct packed_weight {
    ggml_tensor * panels = nullptr;  // F16, packed_weight_elements(k, n)
    ggml_tensor * plain = nullptr;
    int64_t       k = 0;
    int64_t       n = 0;
};
// Whether packing pays here (the packed GEMM runs on this CPU).
bool                  packed_weights_supported();
size_t                packed_weight_elements(int64_t k, int64_t n);
// The panels of N rows of K f16 values (row o at rows + o * K).
std::vector<uint16_t> pack_weight_panels(const uint16_t * rows, int64_t k, int64_t n);
// y (N, T, B) = W^T x (+ b) (+ r), as dense() above; x (K, T, B) rows at any stride.
ggml_tensor * dense(ggml_context * ctx, const packed_weight & w, ggml_tensor * x, ggml_tensor * b = nullptr,
                    ggml_tensor * r = nullptr, bool r_in_place = false);

// y (N, T, P) = U_p^T x_p for each point p of x (K, T, P), where U_p (K, N) = sum_r coef[p][r] W_r
// combines the R taps of a convolution's weight W (K, R, N) as stored (f32, f16 or q8_0 rows):
// Winograd's transformed weights (winograd.h), computed while each weight panel is packed, so
// that they take no memory of their own. `combination` must outlive the graph.
struct tap_combination {
    int           points = 0;
    int           taps = 0;
    const float * coef = nullptr;  // coef[p * taps + r]
};
// Whether dense_taps reads taps of this type.
bool          dense_taps_supported(ggml_type type);
ggml_tensor * dense_taps(ggml_context * ctx, ggml_tensor * taps, const tap_combination & combination, ggml_tensor * x);

// ELU(x) (alpha 1) of x = (C, T) with `left` / `right` zero frames around it; ELU(0) = 0, so
// this is also the zero padding of ELU(x) that a causal convolution after it needs.
ggml_tensor * elu_pad(ggml_context * ctx, ggml_tensor * x, int64_t left, int64_t right);

// x = (C, T) (rows may be strided) padded along time to (C, left + T + right), contiguous, in
// one pass: frame t of the output is frame map(t - left) of x, where map reflects (edge not
// repeated), replicates the edge, or yields zeros.
enum class pad_mode { zeros, reflect, replicate };
ggml_tensor * pad_frames(ggml_context * ctx, ggml_tensor * x, int64_t left, int64_t right, pad_mode mode);

// SnakeBeta of x = (C, T) (rows may be strided): y = x + inv_beta[c] * sin^2(alpha[c] * x), with
// the per-channel alpha = exp(alpha_param) and inv_beta = 1 / (exp(beta_param) + 1e-9)
// precomputed, both f32 (C). Output contiguous (C, T). The vector paths take the sine of the exact
// product alpha * x (not of its float rounding); sin^2 is within ~1.5e-7 of the exact value for
// |alpha * x| up to 1e6 (beyond that the range reduction degrades). The fallback is ggml's sin of
// the rounded product, as PyTorch computes it in f32. With `history` (C, P), the output is
// (C, P + T): those frames, then SnakeBeta of x, in one pass (a causal convolution's input
// after its history, without copying the activations again).
ggml_tensor * snake_beta(ggml_context * ctx, ggml_tensor * x, ggml_tensor * alpha, ggml_tensor * inv_beta,
                         ggml_tensor * history = nullptr);

} // namespace qt
