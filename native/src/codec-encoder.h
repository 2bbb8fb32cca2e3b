// 12 Hz codec encoder: the Mimi encoder of the speech tokenizer (SEANet convolutions, a
// sliding-window transformer at 25 Hz, a stride-2 downsample to 12.5 Hz) and the split
// residual vector quantizer, of which the first `valid_quantizers` codebooks are kept.
#pragma once

#include "graph.h"
#include "model-loader.h"

#include <vector>

namespace qt {

struct codec_encoder_hparams {
    int sample_rate = 24000;
    int frame_samples = 1920;
    int hidden = 0;
    int num_filters = 0;
    int residual_layers = 0;
    std::vector<int32_t> ratios;   // SEANet strides, in the order the config lists them
    int kernel_size = 0;
    int last_kernel_size = 0;
    int residual_kernel_size = 0;
    int dilation_growth = 0;
    int compress = 0;
    int layers = 0;
    int heads = 0;
    int kv_heads = 0;
    int head_dim = 0;
    int ffn = 0;
    float norm_eps = 0.0f;
    float rope_theta = 0.0f;
    int sliding_window = 0;
    int codebook_size = 0;
    int codebook_dim = 0;
    int semantic_quantizers = 0;
    int valid_quantizers = 0;
    pad_mode pad = pad_mode::zeros;
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
    codec_encoder_hparams hp_;
};

} // namespace qt
