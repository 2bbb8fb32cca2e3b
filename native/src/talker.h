// Talker: the Qwen3 decoder that turns the prompt embeddings into code0 (the semantic codebook)
// one frame at a time, plus the text and codec embeddings the prompt builder sums into its
// inputs. Decoder layers: RMSNorm, attention with per-head q/k RMSNorm and RoPE (NEOX, the
// multimodal RoPE of the reference with identical positions in its three sections), GQA, SwiGLU,
// no biases; final RMSNorm, codec_head -> vocab logits.
//
// The loaded model (`talker`) is immutable and shared; a request's decoding state (KV cache and
// its step graph) is a `talker_state`:
//
//     talker_state st(model, backend, n_prompt + max_frames);
//     st.prefill(dumper, prompt, n_prompt, out);   // out.logits, out.hidden of the last position
//     while (...) { st.step(next_embedding, out); }
//
// Threads: a talker may serve several states, but every call computes on the context's
// compute_backend (the CPU's thread pool and, for text_embed/codec_embed/prefill, its shared compute
// allocator), so calls on one backend must not overlap.
#pragma once

#include "graph.h"
#include "model-loader.h"
#include "qwen3-layer.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace qt {

struct talker_hparams : qwen3_hparams {
    int   vocab = 0;        // codec vocabulary (codec_head rows)
    int   text_hidden = 0;  // text embedding width
    int   text_vocab = 0;
};

// Logits of the last position and its hidden state after the final norm (the code predictor's
// input).
struct talker_output {
    std::vector<float> logits;  // [vocab]
    std::vector<float> hidden;  // [hidden]
};

// The cache rows and the last output of a prefill: another request with the same prompt
// restores them instead of computing them again (prefill_cache, session.h).
struct talker_prefix {
    std::vector<float>                embeds;  // (hidden, n) position-major: the prompt it holds
    int64_t                           n = 0;
    std::vector<std::vector<uint8_t>> k, v;    // per layer: kv_heads blocks of n cache rows
    talker_output                     out;     // after position n - 1
    size_t bytes() const;
};

class talker {
public:
    void load(model_loader & loader);
    const talker_hparams & hparams() const { return hp_; }

    // text_proj2(SiLU(text_proj1(text_embd[ids]))) with biases: n vectors of `hidden` floats,
    // position-major ([n, hidden], ggml ne = (hidden, n)). Ids must be < text_vocab.
    std::vector<float> text_embed(const compute_backend & backend, const int32_t * ids, int64_t n) const;
    // codec_embd[ids], same layout. Ids must be < vocab.
    std::vector<float> codec_embed(const compute_backend & backend, const int32_t * ids, int64_t n) const;

    // Bytes of weights one decoding step reads (every layer matrix, the norms and codec_head).
    size_t step_weight_bytes() const;
    // Writes the interleaved copies of the quantized matrices (interleaved-rows.h), once: before
    // the CPU first runs this talker's graphs (a talker_state on the CPU does it).
    void   fill_interleaved() const { interleaved_.fill(); }

private:
    friend class talker_state;

    using layer = qwen3_layer;

    // One decoder layer over x = (hidden, T). `attend(q, k, v)` gets the roped queries (head_dim,
    // heads, T), keys (head_dim, kv_heads, T) and the values (kv_heads * head_dim, T), writes K
    // and V to the cache and returns the attention output (heads * head_dim, T).
    // `prefill`: x holds consecutive positions of one sequence (a GEMM); else one position of
    // each of x's sequences (matrix-vector products).
    template <typename Attend>
    ggml_tensor * layer_forward(ggml_context * ctx, ggml_tensor * x, const layer & l, ggml_tensor * pos, bool prefill,
                                Attend && attend) const;
    ggml_tensor * linear(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, bool prefill) const;

    talker_hparams     hp_;
    std::vector<layer> layers_;
    ggml_tensor *      output_norm_ = nullptr;
    table_rows         codec_embd_;  // (hidden, vocab)
    table_rows         text_embd_;   // (text_hidden, text_vocab)
    ggml_tensor *      text_proj1_w_ = nullptr;
    ggml_tensor *      text_proj1_b_ = nullptr;
    ggml_tensor *      text_proj2_w_ = nullptr;
    ggml_tensor *      text_proj2_b_ = nullptr;
    ggml_tensor *      codec_head_ = nullptr;  // (hidden, vocab)
    interleaved_weights interleaved_;     // q4_K matrices above, on x86 CPUs
};

// The decoding state of one request, or of several decoded side by side: a KV cache with room
// for `max_positions` per sequence, and one-position step graphs, each built and allocated once
// with its own compute buffer and reused for every step. A step advances one position of one
// sequence, or of several at once (step_batch): their columns share every weight read and each
// gets exactly the bits it would get stepped alone (mat-vecs.h), so a request decoded in a batch
// gives the same codes as alone. Per step only the input embeddings and the positions (which are
// also the cache rows written and the valid lengths attended over) are uploaded. The step's
// attention is a custom kernel that reads only the valid cache rows of each sequence, each once
// for the query heads that share it (on a device: ggml's flash attention over the whole cache
// with a mask of the valid rows); the prefill uses ggml's flash attention with a causal mask.
// f16 halves the bytes a step reads from the cache (keys and values are rounded once, when
// written); f32 is exact.
class talker_state {
public:
    talker_state(const talker & model, const compute_backend & backend, int64_t max_positions,
                 ggml_type kv_type = GGML_TYPE_F32, int n_seqs = 1);
    ~talker_state();
    talker_state(const talker_state &) = delete;
    talker_state & operator=(const talker_state &) = delete;

    int     n_seqs() const { return int(n_past_.size()); }
    int64_t n_past(int seq = 0) const { return n_past_[size_t(seq)]; }
    int64_t capacity() const { return capacity_; }

    // Runs the prompt embeddings (hidden, n) (position-major floats) of sequence `seq` from its
    // position n_past(seq). Dumps "talker_hidden_layer{i}" (residual stream after layer i, [n,
    // hidden]), "talker_hidden_norm" and "talker_step0_logits" when the prefill starts at 0.
    void prefill(const stage_dumper & dumper, const float * embeds, int64_t n, talker_output & out, int seq = 0);
    // One position of sequence 0.
    void step(const float * embed, talker_output & out);
    // One position of each of the n sequences seqs[i] (distinct), from embeds + i * hidden, into
    // outs[i].
    void step_batch(const int * seqs, int n, const float * embeds, talker_output * outs);
    // Empties sequence `seq` for another request.
    void reset(int seq) { n_past_[size_t(seq)] = 0; }

    // The first n_past(seq) positions of `seq`, whose prompt embeddings were `embeds`, and `out`
    // after them.
    talker_prefix save_prefix(const float * embeds, const talker_output & out, int seq = 0) const;
    // Starts sequence `seq` (empty) after all of `prefix`: n_past(seq) becomes prefix.n.
    void load_prefix(const talker_prefix & prefix, int seq = 0);

private:
    // The step graph over `width` sequences with its inputs (in their own buffer: the compute
    // buffer never holds anything that must survive a step).
    struct step_graph {
        ggml_context_ptr        inputs_ctx;
        ggml_backend_buffer_ptr inputs_buf;
        ggml_context_ptr        ctx;
        ggml_cgraph *           graph = nullptr;
        ggml_gallocr_ptr        alloc;
        ggml_tensor *           embed = nullptr;   // (hidden, width) f32
        ggml_tensor *           pos = nullptr;     // (width) i32: position = valid length - 1
        ggml_tensor *           slot = nullptr;    // (width) i64: the cache row written
        ggml_tensor *           base = nullptr;    // (width) i32: the sequence's first cache row
        ggml_tensor *           mask = nullptr;    // on a device: (cache rows, width) f16, 0 where attended
        ggml_tensor *           logits = nullptr;  // (vocab, width)
        ggml_tensor *           hidden = nullptr;  // (hidden, width)
    };
    step_graph & graph_for(int width);
    // Cache rows of sequence `seq` start at this row.
    int64_t first_row(int seq) const { return int64_t(seq) * capacity_; }

    const talker &          model_;
    const compute_backend & backend_;
    int64_t              capacity_;  // per sequence
    std::vector<int64_t> n_past_;    // per sequence

    ggml_context_ptr           cache_ctx_;
    ggml_backend_buffer_ptr    cache_buf_;
    std::vector<ggml_tensor *> k_cache_;  // per layer (head_dim, n_seqs * capacity, kv_heads)
    std::vector<ggml_tensor *> v_cache_;

    std::vector<std::unique_ptr<step_graph>> steps_;  // by width - 1, built when first used
};

} // namespace qt
