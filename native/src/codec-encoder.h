// 12 Hz codec encoder: the Mimi encoder of the speech tokenizer (SEANet convolutions, a
// causal transformer at 25 Hz, a stride-2 downsample to 12.5 Hz) and the split residual
// vector quantizer, of which the first `valid_quantizers` codebooks are kept.
#pragma once

#include "codec-hparams.h"
#include "graph.h"
#include "model-loader.h"

#include <string>
#include <vector>

namespace qt {

struct codec_encoder_hparams : codec_hparams {
    int num_filters = 0;
    int residual_layers = 0;
    std::vector<int32_t> ratios;   // SEANet strides, in the order the config lists them
    int kernel_size = 0;
    int last_kernel_size = 0;
    int residual_kernel_size = 0;
    int dilation_growth = 0;
    int compress = 0;
    int semantic_quantizers = 0;
    int valid_quantizers = 0;
    pad_mode pad = pad_mode::zeros;  // SEANet convolutions; the downsample always replicates
    int downsample_kernel = 0;
    int downsample_stride = 2;
};

class codec_encoder {
public:
    void load(model_loader & loader);
    const codec_encoder_hparams & hparams() const { return hp_; }

    // Codes of a mono clip at sample_rate, frame-major [n_frames * valid_quantizers] with
    // n_frames = ceil(n_samples / frame_samples). Dumps "enc_seanet", "enc_transformer",
    // "enc_latent" and "ref_codes".
    std::vector<int32_t> encode(const cpu_backend & backend, const stage_dumper & dumper, const float * pcm,
                                int64_t n_samples, int64_t * n_frames) const;

private:
    // A causal convolution (MimiConv1d).
    struct conv {
        ggml_tensor * w = nullptr;  // (C_in, K, C_out)
        ggml_tensor * b = nullptr;  // (C_out) or null
        int           kernel = 0;
        int           stride = 1;
        int           dilation = 1;
        pad_mode      pad = pad_mode::zeros;
    };
    struct res_block {
        conv c1;  // ELU -> conv residual_kernel_size, dim -> dim / compress, dilated
        conv c2;  // ELU -> conv 1x1 back to dim
    };
    struct seanet_stage {
        std::vector<res_block> res;
        conv                   down;  // ELU -> conv k = 2 * ratio, stride ratio
    };
    struct layer {
        ggml_tensor * attn_norm_w = nullptr;
        ggml_tensor * attn_norm_b = nullptr;
        ggml_tensor * q = nullptr;
        ggml_tensor * k = nullptr;
        ggml_tensor * v = nullptr;
        ggml_tensor * o = nullptr;
        ggml_tensor * attn_scale = nullptr;
        ggml_tensor * ffn_norm_w = nullptr;
        ggml_tensor * ffn_norm_b = nullptr;
        ggml_tensor * up = nullptr;
        ggml_tensor * down = nullptr;
        ggml_tensor * ffn_scale = nullptr;
    };
    struct rvq {
        ggml_tensor *              in_proj = nullptr;  // (hidden, codebook_dim), null = identity
        std::vector<ggml_tensor *> codebooks;          // (codebook_dim, codebook_size)
        std::vector<ggml_tensor *> norms;              // (codebook_size): squared entry norms
    };

    conv load_conv(model_loader & ml, const std::string & name, int64_t c_in, int64_t c_out, int kernel, int stride,
                   int dilation, pad_mode pad, bool bias);
    void prepare_codebook_norms(model_loader & ml);
    ggml_tensor * conv_forward(ggml_context * ctx, ggml_tensor * x, const conv & c, bool elu = false,
                               ggml_tensor * residual = nullptr) const;
    ggml_tensor * transformer_layer(ggml_context * ctx, ggml_tensor * x, ggml_tensor * pos, const layer & l) const;
    std::vector<ggml_tensor *> quantize(ggml_context * ctx, ggml_tensor * latent, const rvq & q, int n_books) const;

    codec_encoder_hparams     hp_;
    conv                      first_;
    std::vector<seanet_stage> stages_;
    conv                      last_;
    std::vector<layer>        layers_;
    conv                      downsample_;
    rvq                       semantic_;
    rvq                       acoustic_;
    // Squared codebook norms, derived at load time and owned here.
    ggml_context_ptr          derived_ctx_;
    ggml_backend_buffer_ptr   derived_buf_;
};

} // namespace qt
