// Several matrix-vector products with one weight read: the batched decoding steps of the talker
// and the code predictor, where each column of x belongs to another request.
//
// ggml_mul_mat computes a lone column with one vec_dot per weight row, but from two columns on it
// hands f32, f16 and q8_0 weights to llamafile's tiled GEMM, which sums in another order; a
// request decoded in a batch would then not reproduce the same request decoded alone (a sampled
// code flips sooner or later). mat_vecs() gives every column exactly the bits ggml_mul_mat gives
// it alone: the column converted to the weight's dot type, then ggml's own vec_dot per row,
// with each block of weight rows read once for all the columns.
#pragma once

#include "ggml.h"

namespace qt {

// y (N, B) = W x for W (K, N) of any ggml type and x (K, B) f32 with contiguous columns; column b
// of y is bit for bit ggml_mul_mat(W, column b of x). One column is ggml_mul_mat itself.
ggml_tensor * mat_vecs(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x);

} // namespace qt
