// Code predictor: the small Qwen3 decoder that turns the talker's code0 of a frame into the 15
// acoustic codes (codebooks 1..15), one position per code with a fresh KV cache every frame.
//
//   prefill (positions 0, 1): [proj(h), proj(C(code0))] -> head 0 at position 1  -> code1
//   step j = 2..15 (position j): proj(E_{j-1}(code_{j-1}))  -> head j-1          -> code_j
//
// h is the talker's last hidden state after its final norm, C the talker's codec embedding,
// E_q the code predictor's codec embedding q - 1 (tables of talker width), proj the identity
// when both decoders have the same width (0.6B) and a Linear with bias otherwise (1.7B; the
// reference's small_to_mtp_projection). Decoder layers as the talker's: RMSNorm, attention with
// per-head q/k RMSNorm and NEOX RoPE, GQA, SwiGLU, no biases; final RMSNorm before the heads.
//
// The whole frame is one static ggml graph built and allocated once per state: the prefill,
// the 14 steps and, after each head, the sampler as a custom op whose I32 result feeds the next
// step's embedding lookup, so a frame is one graph computation with no host round trip. Per
// frame only h, code0 and the 15 uniforms are uploaded. The frames of several requests can run
// as one graph (predict_batch), every position group's columns side by side:
//
//     code_predictor_state cp(model, backend, sampling);
//     cp.predict(talker_out.hidden.data(), code0, frame, codes, next_codec, dump_on_frame_0);
//
// On a device (a GPU through ggml's device backends), the frame is the same graph of ggml's
// standard ops but for the sampler, which a scheduler runs on the CPU between the passes.
//
// Threads: calls on one cpu_backend must not overlap (its thread pool computes every graph).
#pragma once

#include "graph.h"
#include "model-loader.h"
#include "qwen3-layer.h"
#include "talker.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace qt {

struct code_predictor_hparams : qwen3_hparams {
    int   vocab = 0;          // codebook size (rows of each head and embedding table)
    int   talker_hidden = 0;  // width of h, C and E_q
    int   talker_vocab = 0;   // rows of C (code0 must be below)
    int   n_codes = 0;        // codes per frame it predicts (num_code_groups - 1 = 15)
};

// Sampling of the acoustic codes (the reference's subtalker_* arguments). HF order:
// temperature, top-k (ties with the k-th value kept), top-p, then a multinomial draw made
// deterministic by a uniform u from rng_uniform_f32(seed, 1, frame * n_codes + q - 1) for
// code q: the first id (in id order) whose cumulative probability exceeds u.
struct cp_sampling {
    float    temperature = 0.9f;  // <= 0: greedy (argmax, first index of the maximum)
    int32_t  top_k = 50;          // <= 0 or >= vocab: off
    float    top_p = 1.0f;        // >= 1: off
    uint64_t seed = 0;
};

// The in-graph sampler's kernel on one row of logits, exposed for the tests: the same pick as
// sampler.h's sample_warped (which it mirrors, including its double-precision sums) for the same
// logits and u, but it only exponentiates the tokens top-k keeps.
int32_t cp_sample_row(const float * logits, int32_t n_vocab, float temperature, int32_t top_k, float top_p, float u);

class code_predictor {
public:
    // Reads the code predictor's hyperparameters and tensors, and the talker's codec embedding.
    void load(model_loader & loader, const talker & model);
    const code_predictor_hparams & hparams() const { return hp_; }

    // Bytes of weights one frame reads: the layers once per position group (prefill + 14
    // steps), the projection likewise, one head per code, the final norm per pass; embedding
    // lookups count one row each.
    size_t frame_weight_bytes() const;
    // As talker::fill_interleaved (a code_predictor_state on the CPU calls it).
    void   fill_interleaved() const { interleaved_.fill(); }

private:
    friend class code_predictor_state;

    using layer = qwen3_layer;

    code_predictor_hparams     hp_;
    std::vector<layer>         layers_;
    ggml_tensor *              output_norm_ = nullptr;
    std::vector<ggml_tensor *> heads_;        // head q - 1 gives code q: (hidden, vocab)
    std::vector<table_rows>    codec_embd_;   // E_q = codec_embd_[q - 1]: (talker_hidden, vocab)
    ggml_tensor *              in_proj_w_ = nullptr;  // (talker_hidden, hidden), or null (identity)
    ggml_tensor *              in_proj_b_ = nullptr;
    table_rows                 talker_codec_embd_;  // C: (talker_hidden, talker_vocab)
    interleaved_weights    interleaved_;        // q4_K matrices above, on x86 CPUs
};

// What the code predictor needs of one request's frame, and where its codes go.
struct cp_frame {
    const float * talker_hidden = nullptr;  // h: talker_hidden floats
    int32_t       code0 = 0;
    uint64_t      frame_index = 0;
    cp_sampling   sampling;
    int32_t *     codes = nullptr;       // n_codes codes 1..n_codes
    float *       next_codec = nullptr;  // null, or talker_hidden floats: C(code0) + sum_q E_q(code_q)
};

// The code-predictor state of up to `max_batch` requests: a frame graph per batch width (each
// with its own compute buffer, built when first used) and a small persistent buffer for the
// inputs, the per-layer KV rows of the frame and the constant positions. Sampling parameters
// are graph inputs, so one graph serves any of them. The frames of several requests predicted
// together (predict_batch) share every weight read, and each gets the bits it gets alone
// (mat-vecs.h), so a request gives the same codes in a batch as alone.
class code_predictor_state {
public:
    code_predictor_state(const code_predictor & model, const compute_backend & backend, const cp_sampling & sampling = {},
                         int max_batch = 1);
    ~code_predictor_state();
    code_predictor_state(const code_predictor_state &) = delete;
    code_predictor_state & operator=(const code_predictor_state &) = delete;

    int                 max_batch() const { return max_batch_; }
    void                set_sampling(const cp_sampling & sampling);
    const cp_sampling & sampling() const { return sampling_; }

    // Predicts the codes 1..n_codes of frame `frame_index` from the talker's last hidden state
    // h (talker_hidden floats) and its code0, with sampling(). Writes n_codes codes; when
    // `next_codec` is given, also the codec side of the talker's next input, C(code0) + sum_q
    // E_q(code_q) (talker_hidden floats; the caller adds the text vector). With an enabled
    // `dump`, writes "cp_step0_prefill_embeds" [2, talker_hidden] (before the projection) and
    // "cp_step0_logits" [n_codes, vocab] (raw head outputs). Throws qt::error.
    // `forced` (n_codes values, for tests): feed these codes to the following steps instead of
    // the sampled ones (teacher forcing; `codes` then returns them), so that the logits of
    // every step can be compared with the reference's even where a pick differs.
    void predict(const float * talker_hidden, int32_t code0, uint64_t frame_index, int32_t * codes,
                 float * next_codec = nullptr, const stage_dumper * dump = nullptr, const int32_t * forced = nullptr);
    // The frames of n (<= max_batch()) requests in one graph computation, each with its own
    // sampling.
    void predict_batch(const cp_frame * frames, int n);

    // The raw logits of the last single predict(), [n_codes][vocab] (the sampler's input).
    std::vector<float> last_logits() const;

private:
    struct frame_graph {
        ggml_context_ptr           ctx;
        ggml_cgraph *              graph = nullptr;
        ggml_gallocr_ptr           alloc;
        ggml_backend_sched_ptr     sched;           // on a device: its sampler runs on the CPU
        std::vector<ggml_tensor *> codes;           // n_codes x (width) i32
        std::vector<ggml_tensor *> logits;          // n_codes x (vocab, width) f32
        ggml_tensor *              prefill = nullptr;  // (talker_hidden, 2, width) f32
        ggml_tensor *              codec = nullptr;    // (talker_hidden, width) f32
    };
    frame_graph & graph_for(int width);
    void          run(const cp_frame * frames, int n, const int32_t * forced);

    const code_predictor &  model_;
    const compute_backend & backend_;
    cp_sampling            sampling_;
    int                    max_batch_;

    ggml_context_ptr           state_ctx_;
    ggml_backend_buffer_ptr    state_buf_;
    std::vector<ggml_tensor *> k_rows_;  // per layer (head_dim, n_codes + 1, kv_heads, max_batch)
    std::vector<ggml_tensor *> v_rows_;
    ggml_tensor *              in_hidden_ = nullptr;    // (talker_hidden, max_batch) f32
    ggml_tensor *              in_code0_ = nullptr;     // (max_batch) i32
    ggml_tensor *              in_uniform_ = nullptr;   // (max_batch, n_codes) f32
    ggml_tensor *              in_sampling_ = nullptr;  // (3, max_batch) f32: temperature, top_k, top_p
    ggml_tensor *              in_forced_ = nullptr;    // (max_batch, n_codes) i32: a code to feed instead, or -1
    bool                       forcing_ = false;        // in_forced_ holds codes (else all -1)
    // Per pass (q - 1), each its own tensor (a device reads an index tensor from the start of
    // its buffer, not from an offset view): the positions, i32, 0 and 1 per request for the
    // prefill then q for each; the KV rows written, i64, 0 and 1 then q.
    std::vector<ggml_tensor *> c_pass_pos_;
    std::vector<ggml_tensor *> c_pass_slots_;
    ggml_tensor *              c_mask_ = nullptr;       // (2, 2) f16: causal mask of the prefill

    std::vector<std::unique_ptr<frame_graph>> graphs_;  // by width - 1
};

} // namespace qt
