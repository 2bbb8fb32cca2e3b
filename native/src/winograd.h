// Causal dilated convolutions by Winograd's minimal filtering: F(4, 7) for 7 taps, F(4, 2) for 2.
//
// The codec decoder's residual units spend about three quarters of its multiply-adds in 7-tap
// convolutions (dilations 1, 3 and 9). F(4, 7) computes 4 outputs of such a filter from 10
// point-wise products instead of 28: the input tiles and the weights are transformed into 10
// points (Toom-Cook at 0, +-1, +-2, +-1/2, +-3/4 and infinity, the set with the lowest f32 error
// of those measured), each point is one GEMM over the channels, and the results are transformed
// back. In f32 the outputs stay within ~1.6e-6 (relative RMS) of the direct convolution. Larger
// tiles round worse: F(6, 7) (4e-6) decoded the fixtures' streams 8 dB further from their
// whole decode than F(4, 7) (72.5 against 80.5 dB; the direct convolution gives 96.6), below the
// 80 dB the tests hold streaming to. The transformed weights must be f32 (rounded to f16 they
// lose 3e-3), 10/7 of the f32 taps and 20/7 of the f16 ones, so they are not kept: the GEMM
// computes each panel of them from the stored taps while it packs the panel (about 7 multiply-
// adds per weight against one per weight and tile for the product itself).
//
// The transposed convolutions' phases are 2-tap convolutions over their input frames (a frame and
// the one before it give `stride` output frames); F(4, 2) computes 4 of their outputs from 5
// products instead of 8.
#pragma once

#include "cpu-ops.h"
#include "ggml.h"

#include <cstdint>

namespace qt {

constexpr int k_winograd_outputs = 4;  // per tile, for every filter
constexpr int k_winograd_max_taps = 7;

// Whether winograd_conv computes filters of this many taps (7 and 2).
bool winograd_taps_supported(int taps);

// The weight transform of a filter of `taps` taps: U_p = sum_k coef[p][k] W_k for the taps W_k
// (dense_taps in cpu-ops.h), p < 4 + taps - 1.
const tap_combination & winograd_weight_transform(int taps);

// Transformed inputs and products per piece of tiles (winograd_conv).
constexpr int64_t k_winograd_piece_bytes = int64_t(8) << 20;

// y (C_out, T) = the convolution of x (C_in, (K - 1) * dilation + T) with the K taps w (C_in, K,
// C_out; f32, f16 or q8_0, as stored; K = 7 or 2), plus b (C_out) when given: y[:, t] = sum_k W_k
// x[:, t + k * dilation], i.e. a causal convolution whose history is x's first (K - 1) * dilation
// frames. x's rows may be strided. The tiles go through in pieces of at most piece_bytes of
// transformed inputs and products (at least one tile each), with the same bits for any piece size.
ggml_tensor * winograd_conv(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, ggml_tensor * b, int dilation,
                            int64_t piece_bytes = k_winograd_piece_bytes);

} // namespace qt
