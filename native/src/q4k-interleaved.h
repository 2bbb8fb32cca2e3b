// q4_K weight matrices with their rows interleaved by 16, for the matrix-vector products of the
// talker's and the code predictor's steps on x86 CPUs with AVX2.
//
// Stored q4_K rows are dotted one row at a time: each block's nibbles and 6-bit scales are
// unpacked for a single row, and every column then pays a multiply of byte pairs, a multiply by
// the sub-block's scale and a horizontal sum for 256 products of that one row. Interleaved,
// 16 rows share every instruction: a 64-byte vector holds four consecutive weights of each of
// the 16 rows, so one VNNI dot (vpdpbusd) takes 64 products with no unpacking beyond a mask, the
// scales apply once per sub-block to 16 rows at once, and each column's bytes are broadcast
// straight from memory. Measured on Zen 5 (2 threads, the 0.6B shapes): 10 sequences side by side
// spent 2.8x fewer perf samples in the q4_K products than with the former row-at-a-time kernel
// (15.8k against 44.6k), and a lone sequence's step reads its weights at 67 GB/s, where that kernel
// reached 41-54.
//
// Layout, for each 16-row group and each 256-value block (2304 bytes, exactly the 16 rows'
// 144-byte blocks, so the matrix keeps its size):
//   qs[j][q][row][4]  2048 bytes: bytes 4q..4q+3 of the row's 32-byte chunk j (low nibbles:
//                     sub-block 2j, high nibbles: sub-block 2j + 1), j < 4, q < 8
//   scales[w][row]    192 bytes: the row's packed 6-bit scales and mins, as 32-bit words, w < 3
//   d[row], dmin[row] 32 + 32 bytes: f16
//
// The products sum in one fixed order, whatever the instruction set and however many columns: per
// block, the exact integer sums (scales times byte dots, mins times the column's 32-value sums),
// each converted to float and added with one fused multiply-add. Every column of a batched step
// thus gets the same bits as that column alone, on AVX2 and AVX512 machines alike (ggml's own
// q4_K dot adds eight partial lanes instead, so the bits differ from ggml_mul_mat's, not the
// accuracy).
#pragma once

#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "ggml.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace qt {

class model_loader;

constexpr int64_t k_interleaved_rows = 16;

// Whether this CPU and the loaded ggml run the interleaved kernels (AVX2 and ggml's q4_K layout).
bool q4k_interleave_supported();

// The name suffix that marks an interleaved matrix (its rows are not ggml's q4_K rows).
constexpr const char * k_interleaved_q4k_suffix = "#q4k-rows16";

// Whether w is an interleaved matrix (a q4_K tensor whose name ends with the suffix).
bool is_interleaved_q4k(const ggml_tensor * w);

// `n_rows` stored q4_K rows of `k` values (n_rows % 16 == 0, k % 256 == 0) written interleaved
// to `out`, which has the same size.
void interleave_q4k(const void * rows, void * out, int64_t n_rows, int64_t k);

// dst (N, B) f32 = W x for an interleaved W (K, N) and B columns of x in q8_K, `xq_stride` bytes
// apart: thread ith of nth's share (whole 16-row groups).
void interleaved_q4k_product(const ggml_tensor * w, const char * xq, size_t xq_stride, ggml_tensor * dst, int ith,
                             int nth);

// For tests and measurements: the AVX512 kernels without VNNI even where the CPU has it
// (process-wide), so that both AVX512 forms run on one machine.
void interleaved_q4k_avoid_vnni(bool avoid);

// A column of k floats (k % 256 == 0) in q8_K, the interleaved kernels' column type: the same
// bits as ggml's quantize_row_q8_K.
void quantize_q8_k(const float * x, void * out_blocks, int64_t k);

// The q4_K matrices of one component, interleaved into a CPU buffer of their own. adopt() each
// matrix, then commit() once: the stored rows are read one matrix at a time and released (where
// the weights are mapped), so loading never holds both forms of more than one matrix.
class interleaved_q4k_weights {
public:
    // The stand-in for w that commit() fills, or w itself where its rows stay as stored (another
    // type, a shape the kernels do not take, no AVX2, weights on a device).
    ggml_tensor * adopt(const model_loader & loader, ggml_tensor * w);
    void          commit(const model_loader & loader);

private:
    struct pending {
        ggml_tensor * stored;
        ggml_tensor * interleaved;
    };
    ggml_context_ptr        ctx_;
    ggml_backend_buffer_ptr buffer_;
    std::vector<pending>    pending_;
};

} // namespace qt
