// The matrix-vector products of the talker's and the code predictor's decoding steps: one column
// per request, several at once in a batched step; and a q4_K talker's prefill, one column per
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
// For q8_0 weights on x86 (the q8_0 models' talker and code predictor) the engine's own kernels
// do this, for one column too: each thread takes one contiguous range of rows and asks for them
// ahead of use, which ggml's vec_dot does not, and a lone column's sums stay in registers. A
// decoding step is largely a wait on the weights' memory, so these run the single steps faster
// than ggml_mul_mat with the same bits. q4_K matrices are interleaved at load on x86
// (interleaved-rows.h) and take that file's kernels, for any number of columns (a prefill's too),
// in a fixed order of their own.
#pragma once

#include "ggml.h"

namespace qt {

// y (N, B) = W x for W (K, N) of any ggml type and x (K, B) f32 with contiguous columns; column b
// of y is bit for bit ggml_mul_mat(W, column b of x).
ggml_tensor * mat_vecs(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x);

} // namespace qt
