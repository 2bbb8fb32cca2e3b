// 12 Hz codec decoder: codes -> 24 kHz audio. Split RVQ dequantization, a causal conv, a
// transformer with a causal sliding window, two 2x upsampling stages (transposed conv +
// ConvNeXt block), a conv, four SnakeBeta decoder blocks (transposed conv + dilated residual
// units) and the output conv with a clamp.
//
// Every part is causal, so the decoder streams exactly: a codec_stream carries the state that a
// chunk boundary would otherwise cut (each layer's keys and values over the last window - 1
// frames, each causal convolution's last inputs), and decoding in chunks of any width gives the
// audio of one pass over all frames. Recomputing a left context instead (upstream decodes 300
// frames with 25 of context) costs that context per chunk and still only approximates it.
//
// On the CPU the products run through the engine's own kernels (weights packed or Winograd-
// transformed at load); a decoder loaded for a device keeps the weights as stored, in the
// device's memory, for graphs of ggml's standard ops.
#pragma once

#include "codec-hparams.h"
#include "graph.h"
#include "model-loader.h"

#include <cstdint>
#include <initializer_list>
#include <vector>

namespace qt {

// codebook_dim is the RVQ output width (each group's codebooks are half of it)
struct codec_decoder_hparams : codec_hparams {
    int latent_dim = 0;
    int decoder_dim = 0;
    int n_quantizers = 0;
    int n_semantic = 0;
    std::vector<int32_t> upsampling_ratios;  // before the decoder blocks (2, 2)
    std::vector<int32_t> upsample_rates;     // decoder blocks (8, 5, 4, 3)
};

class codec_decoder;

// A SnakeBeta activation's per-channel parameters (snake_beta in cpu-ops.h).
struct snake_params {
    ggml_tensor * alpha = nullptr;     // exp(alpha)
    ggml_tensor * inv_beta = nullptr;  // 1 / (exp(beta) + 1e-9)
};

// The decoder's state between chunks of one audio stream.
class codec_stream {
public:
    explicit codec_stream(const codec_decoder & decoder);

    int64_t frames() const { return frames_; }
    // What its state holds (the transformer's window and the convolutions' histories).
    size_t  bytes() const;

    // Decodes the next n_frames frames ([n_frames * n_quantizers], frame-major) and returns their
    // n_frames * frame_samples samples, on `backend`: the CPU, or the device the stream's decoder
    // was loaded for. Dumps the stages of the stream's first decoded chunk.
    std::vector<float> decode(const compute_backend & backend, const stage_dumper & dumper, const int32_t * codes,
                              int64_t n_frames);

    // Advances the state over frames whose audio is not wanted (in-context mode's reference):
    // the transformer sees all of them, the convolutions only the last receptive_frames(),
    // which is all their state depends on.
    void prime(const compute_backend & backend, const int32_t * codes, int64_t n_frames);

private:
    friend class codec_decoder;
    struct history_io;

    std::vector<float> run(const compute_backend & backend, const stage_dumper & dumper, const int32_t * codes,
                           int64_t n_frames, bool audio);
    // The codebooks, pre-conv and transformer over a chunk: its latent frames (latent_dim, T).
    std::vector<float> transform(const compute_backend & backend, const stage_dumper & dumper, const int32_t * codes,
                                 int64_t n_frames);
    // The convolutions from latent frames (latent_dim, T) to T * frame_samples samples.
    std::vector<float> convolve(const compute_backend & backend, const stage_dumper & dumper, const float * latent,
                                int64_t n_frames);
    // A causal convolution `c` (a codec_decoder::conv) of x, or of act's SnakeBeta of x, after
    // its history, in io's graph.
    template <class Conv>
    ggml_tensor * causal(history_io & io, const Conv & c, ggml_tensor * x, ggml_tensor * residual = nullptr,
                         const snake_params * act = nullptr);

    const codec_decoder &           dec_;
    int64_t                         frames_ = 0;
    int64_t                         convolved_ = 0;  // frames through the convolutions
    bool                            decoded_audio_ = false;
    int64_t                         n_cached_ = 0;     // frames in each layer's key/value cache
    std::vector<std::vector<float>> k_cache_, v_cache_;  // per layer: (head_dim * kv_heads, n_cached_)
    std::vector<std::vector<float>> history_;          // per causal conv: its last inputs (C, P)
};

class codec_decoder {
public:
    // `device`: load for that device's graphs (the loader's weights must be in its memory), with
    // the weights the decoder derives in its memory too; null: for the CPU's.
    void load(model_loader & loader, const compute_backend * device = nullptr);
    const codec_decoder_hparams & hparams() const { return hp_; }
    bool                          loaded() const { return derived_buf_ != nullptr; }

    // Decodes, on `backend`, a fresh stream's chunks of `max_chunk` frames until the transformer's
    // cache is full, so that the compute buffer has grown to what any request's chunks of at most
    // that width need (on a device: an out-of-memory shows here, at load, not mid-request).
    void reserve(const compute_backend & backend, int64_t max_chunk) const;

    // Frames of the transformer's output that decide the convolutions' state (their receptive
    // field, rounded up).
    int64_t receptive_frames() const { return receptive_frames_; }

private:
    friend class codec_stream;

    // A causal convolution: `history` input frames of the previous chunk come before the chunk.
    struct conv {
        ggml_tensor * w = nullptr;  // (C_in, K, C_out); null where `packed` replaces it
        ggml_tensor * b = nullptr;  // (C_out) or null
        bool          winograd = false;  // computed by F(4, K) from w (winograd.h)
        packed_weight packed;            // (K * C_in, C_out) packed at load (dilation 1)
        int           kernel = 1;
        int           dilation = 1;
        int64_t       c_in = 0;
        int64_t       history = 0;  // dilation * (K - 1)
        int           slot = -1;    // index of its history in codec_stream
        int64_t       frame_samples = 0;  // Winograd: its inputs per frame of the stream (codec_stream::causal)
        int64_t       tile_history = 0;   // Winograd: history frames before the taps' (codec_stream::causal)
    };
    // A causal transposed convolution (kernel m * stride, the right overhang dropped), run as a
    // convolution over m frames that yields `stride` output frames per input frame.
    struct tconv {
        conv    phases;    // w (C_in, m, stride * C_out), b (stride * C_out)
        int64_t c_out = 0;
        int     stride = 0;
    };
    using snake = snake_params;
    struct convnext {
        tconv         up;
        ggml_tensor * dw_w = nullptr;  // (C, 7): depthwise causal conv taps
        ggml_tensor * dw_b = nullptr;
        int           dw_slot = -1;
        ggml_tensor * norm_w = nullptr;
        ggml_tensor * norm_b = nullptr;
        packed_weight pw1_w;
        ggml_tensor * pw1_b = nullptr;
        packed_weight pw2_w;
        ggml_tensor * pw2_b = nullptr;
        ggml_tensor * gamma = nullptr;
    };
    struct residual_unit {
        snake act1;
        conv  conv1;  // k7, dilated
        snake act2;
        conv  conv2;  // k1
    };
    struct block {
        snake                      act;
        tconv                      up;
        std::vector<residual_unit> res;
    };
    struct layer {
        ggml_tensor * attn_norm = nullptr;
        packed_weight q;
        packed_weight k;
        packed_weight v;
        packed_weight o;
        ggml_tensor * attn_scale = nullptr;
        ggml_tensor * ffn_norm = nullptr;
        packed_weight gate;
        packed_weight up;
        packed_weight down;
        ggml_tensor * ffn_scale = nullptr;
    };

    conv  load_conv(model_loader & ml, const std::string & name, int64_t c_in, int64_t c_out, int kernel,
                    int dilation, bool bias);
    // A tensor of the weights derived at load, holding a copy of `data` (its ggml_nbytes) once
    // derive_weights() allocates them.
    ggml_tensor * derived_tensor(ggml_type type, std::initializer_list<int64_t> ne, const void * data);
    // N rows of K f16 values packed for dense() (cpu-ops.h), as a derived tensor.
    packed_weight packed_rows(const uint16_t * rows, int64_t k, int64_t n);
    // The f16 weight matrix w (K, N) packed for dense() where that pays (cpu-ops.h), the mapped
    // rows given back; else w as stored.
    packed_weight pack_matrix(model_loader & ml, ggml_tensor * w, int64_t k, int64_t n);
    // A convolution of dilation 1 with its weight packed (run on sliding windows).
    void          pack_conv(model_loader & ml, conv & c);
    // Whether this decoder computes convolutions of `taps` taps of this weight type by Winograd's
    // algorithm: on the CPU, for the filters winograd.h has.
    bool  winograd_takes(ggml_type type, int taps) const;
    // A convolution of 7 or 2 taps computed by F(4, K) on the CPU (winograd.h), from its taps as
    // stored, at a rate of frame_samples inputs per frame of the stream. Its tiles sit at the same
    // positions of the stream whatever the chunks (codec_stream::causal), for which its history
    // holds a tile's span (4 x dilation) less one frame more, unless every frame holds whole tiles.
    void  to_winograd(conv & c, int64_t frame_samples);
    // frame_samples: its input frames per frame of the stream (for F(4, 2) on its phases).
    tconv load_tconv(model_loader & ml, const std::string & name, int64_t c_in, int64_t c_out, int kernel, int stride,
                     int64_t frame_samples);
    snake load_snake(model_loader & ml, const std::string & name, int64_t channels);
    void  derive_weights(model_loader & ml);

    codec_decoder_hparams      hp_;
    bool                       cpu_kernels_ = true;  // packed and Winograd weights (the CPU's form)
    ggml_backend_buffer_type_t derived_type_ = nullptr;
    std::vector<table_rows>    codebooks_;   // per quantizer: (codebook_dim / 2, codebook_size)
    ggml_tensor *              out_proj_first_ = nullptr;  // (codebook_dim / 2, codebook_dim)
    ggml_tensor *              out_proj_rest_ = nullptr;
    conv                       pre_conv_;
    packed_weight              tf_in_w_;
    ggml_tensor *              tf_in_b_ = nullptr;
    std::vector<layer>         layers_;
    ggml_tensor *              tf_norm_ = nullptr;
    packed_weight              tf_out_w_;
    ggml_tensor *              tf_out_b_ = nullptr;
    std::vector<convnext>      upsample_;
    conv                       conv_in_;
    std::vector<block>         blocks_;
    snake                      act_out_;
    conv                       conv_out_;
    int                        n_slots_ = 0;
    std::vector<int64_t>       slot_channels_;
    std::vector<int64_t>       slot_frames_;
    int64_t                    receptive_frames_ = 0;

    // Weights derived at load time (SnakeBeta factors, transposed convs as phase convs,
    // depthwise taps), owned here.
    struct pending_derived {
        ggml_tensor *        tensor;
        std::vector<uint8_t> bytes;
    };
    std::vector<pending_derived> pending_;
    ggml_context_ptr             derived_ctx_;
    ggml_backend_buffer_ptr      derived_buf_;
};

} // namespace qt
