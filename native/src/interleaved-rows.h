// Quantized weight matrices (q4_K, q8_0) with their rows interleaved by 16, for the
// matrix-vector products of the talker's and the code predictor's steps on x86 CPUs with AVX2.
//
// Stored rows are dotted one row at a time: each block is unpacked for a single row, and every
// column then pays byte-pair multiplies, the sub-block scales and a horizontal sum for that one
// row. Interleaved, 16 rows share every instruction: a 64-byte vector holds four consecutive
// weights of each of the 16 rows, so one VNNI dot (vpdpbusd) takes 64 products with no unpacking
// beyond a mask, the scales apply to 16 rows at once, and each column's bytes are broadcast
// straight from memory. Measured on Zen 5 (2 threads, the 0.6B shapes) against the former
// row-at-a-time kernels: at q4_K, 10 sequences side by side spent 2.8x fewer perf samples in the
// products (15.8k against 44.6k) and a lone step reads its weights at 67 GB/s (41-54 before); at
// q8_0, the talker's step for 4 sequences took 15.2-15.4 ms (17.8-19.2 before) and a 10-position
// prefill 17-19 ms (71: the packed f32 GEMM), while a lone step, bound by memory, did not change.
//
// Layouts, per 16-row group, records in depth order, each exactly its rows' blocks rearranged
// (a matrix keeps its size):
//   q4_K, one 256-value block (2304 bytes):
//     qs[j][q][row][4]  2048 bytes: bytes 4q..4q+3 of the row's 32-byte chunk j (low nibbles:
//                       sub-block 2j, high nibbles: sub-block 2j + 1), j < 4, q < 8
//     scales[w][row]    192 bytes: the row's packed 6-bit scales and mins, as 32-bit words, w < 3
//     d[row], dmin[row] 32 + 32 bytes: f16
//   q8_0, two 32-value blocks (1088 bytes, so that vectors stay 64-byte aligned):
//     qs[b][q][row][4]  1024 bytes: values 4q..4q+3 of the row's block b, q < 8
//     d[b][row]         64 bytes: f16
//
// The products sum in one fixed order, whatever the instruction set and however many columns: per
// block, the exact integer sums (q4_K: scales times byte dots, mins times the column's 32-value
// sums), each converted to float and added with one fused multiply-add. Every column of a batched
// step thus gets the same bits as that column alone, on AVX2 and AVX512 machines alike (ggml's own
// dots add eight partial lanes instead, so the bits differ from ggml_mul_mat's, not the accuracy).
//
// Kernels: 512-bit with VNNI (vpdpbusd) or without (AVX512BW byte-pair multiplies), and 256-bit
// with AVX-VNNI (the VEX vpdpbusd of Alder Lake and later cores, which lack AVX512, and of Zen 5)
// or plain AVX2 (Haswell to Zen 3). Measured on Zen 5 through ggml's alderlake variant (2 threads,
// q4_K, the 0.6B talker), AVX-VNNI against AVX2: a 4-sequence step 12.3-12.4 ms against
// 16.4-16.7, a 4 x 64-position prefill 550-558 ms against 769-790, a lone step 5.9-6.1 against
// 6.4-6.5 (bound by memory). Without VNNI, a q4_K sub-block's byte-pair products add up in 16 bits
// and take their scale in one vpmaddwd, and the 256-bit q8_0 kernel reads each record once for up
// to 4 columns: on a Zen 4 (AVX2 kernels, one thread, in cache) 11-19 % less time at q4_K, and a
// lone q8_0 step's generation 30 % faster from memory (README, AVX2 and AVX512).
#pragma once

#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "ggml.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace qt {

class model_loader;

constexpr int64_t k_interleaved_rows = 16;

// Whether this CPU and the loaded ggml run the interleaved kernels for `type` (AVX2, and ggml's
// block layouts as these kernels know them).
bool interleave_supported(ggml_type type);

// The name suffix that marks an interleaved matrix (its rows are not ggml's rows).
constexpr const char * k_interleaved_suffix = "#rows16";

// Whether w is an interleaved matrix (a q4_K or q8_0 tensor whose name ends with the suffix).
bool is_interleaved(const ggml_tensor * w);

// `n_rows` stored rows of `k` values of `type` written interleaved to `out`, which has the same
// size. n_rows % 16 == 0; k % 256 == 0 for q4_K, k % 64 == 0 for q8_0.
void interleave_rows(ggml_type type, const void * rows, void * out, int64_t n_rows, int64_t k);

// dst (N, B) f32 = W x for an interleaved W (K, N) and B columns of x in W's dot type (q8_K for
// q4_K, q8_0 for q8_0), `xq_stride` bytes apart: thread ith of nth's share (whole 16-row groups).
void interleaved_product(const ggml_tensor * w, const char * xq, size_t xq_stride, ggml_tensor * dst, int ith,
                         int nth);

// For tests and measurements, process-wide: the dot instructions of the kernels, so that every
// form runs on one machine. `variant`: VNNI where the ggml variant has it (AVX512_VNNI for the
// 512-bit kernels, AVX_VNNI for the 256-bit ones), the default; `no_vnni`: none; `avx_vnni`: the
// 256-bit kernels with AVX-VNNI wherever the processor has it, whatever the variant.
enum class interleaved_dots { variant, no_vnni, avx_vnni };
void interleaved_force_dots(interleaved_dots dots);

// A column of k floats (k % 256 == 0) in q8_K, the q4_K kernels' column type: the same bits as
// ggml's quantize_row_q8_K.
void quantize_q8_k(const float * x, void * out_blocks, int64_t k);

// The quantized matrices of one component, interleaved into a CPU buffer of their own: adopt()
// each matrix, commit() once all are, and fill() before the CPU's graphs first use them. fill()
// reads the stored rows one matrix at a time and gives their pages back where they are mapped, so
// the process never holds both forms of more than one matrix; until then the buffer is untouched
// and takes no memory, so an engine that runs on a GPU, whose CPU copy of the weights goes unused
// unless the device fails, never holds it.
class interleaved_weights {
public:
    // The stand-in for w that fill() writes, or w itself where its rows stay as stored (another
    // type, a shape the kernels do not take, no AVX2, weights on a device).
    ggml_tensor * adopt(const model_loader & loader, ggml_tensor * w);
    // Allocates the stand-ins' buffer (untouched).
    void          commit(const model_loader & loader);
    // Writes the stand-ins, the first time it is called (from any thread); the weights' mapping
    // must still be alive.
    void          fill() const;

private:
    struct pending {
        ggml_tensor * stored;
        ggml_tensor * interleaved;
        bool          mapped;  // the stored rows lie in the file mapping: their pages go back
    };
    ggml_context_ptr                ctx_;
    ggml_backend_buffer_ptr         buffer_;
    std::vector<pending>            pending_;
    std::unique_ptr<std::once_flag> filled_ = std::make_unique<std::once_flag>();
};

} // namespace qt
