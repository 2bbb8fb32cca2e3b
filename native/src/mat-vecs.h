// The matrix-vector products of the talker's and the code predictor's decoding steps: one column
// per request, several at once in a batched step; and a quantized talker's prefill, one column per
// position.
//
// ggml_mul_mat computes a lone column with one vec_dot per weight row, but from two columns on it
// hands f32, f16 and q8_0 weights to llamafile's tiled GEMM, which sums in another order; a
// request decoded in a batch would then not reproduce the same request decoded alone (a sampled
// code flips sooner or later). mat_vecs() gives every column exactly the bits that column gets
// alone: for weights as stored, the bits of ggml_mul_mat (the column converted to the weight's
// dot type, then ggml's own vec_dot per row), with each block of weight rows read once for all
// the columns.
//
// q4_K and q8_0 matrices interleaved at load on x86 (interleaved-rows.h: the quantized models'
// talker and code predictor) take that file's kernels instead, for any number of columns, in a
// fixed order of their own: a lone step as fast as the row kernels they replaced, which outran
// ggml's vec_dot (q4_K faster still), and several columns far faster (16 rows share each
// instruction).
#pragma once

#include "ggml.h"

namespace qt {

// y (N, B) = W x for W (K, N) of any ggml type and x (K, B) f32 with contiguous columns; column b
// of y is bit for bit ggml_mul_mat(W, column b of x).
ggml_tensor * mat_vecs(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x);

} // namespace qt
