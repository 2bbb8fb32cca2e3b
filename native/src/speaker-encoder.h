// ECAPA-TDNN speaker encoder (Qwen3TTSSpeakerEncoder): log-mel -> speaker embedding of the
// talker's hidden width. Convolutions use "same" reflect padding and ReLU, no BatchNorm.
#pragma once

#include "graph.h"
#include "model-loader.h"

#include <vector>

namespace qt {

struct speaker_encoder_hparams {
    int mel_dim = 128;
    int enc_dim = 0;                   // embedding width
    std::vector<int32_t> channels;     // TDNN, 3 x SE-Res2Net, MFA
    std::vector<int32_t> kernel_sizes;
    std::vector<int32_t> dilations;
    int attention_channels = 0;
    int res2net_scale = 0;
    int se_channels = 0;
    int sample_rate = 0;
};

class speaker_encoder {
public:
    // The weights stay where the loader put them: the CPU, or a device's memory.
    void load(model_loader & loader);
    bool loaded() const { return frontend_.w != nullptr; }
    const speaker_encoder_hparams & hparams() const { return hp_; }

    // mel: ne = (mel_dim, T). Returns the embedding [enc_dim], computed on `backend` (the CPU, or
    // the device whose loader the encoder was loaded from). Dumps "spk_block0".."spk_block3",
    // "spk_mfa", "spk_asp" and "speaker_embedding".
    std::vector<float> embed(const compute_backend & backend, const stage_dumper & dumper, const std::vector<float> & mel,
                             int64_t n_frames) const;

private:
    struct conv {
        ggml_tensor * w = nullptr;  // (C_in, K, C_out)
        ggml_tensor * b = nullptr;
        int           dilation = 1;
    };
    struct se_res2net_block {
        conv              tdnn1, tdnn2, se1, se2;
        std::vector<conv> res2net;  // scale - 1 convs
    };

    ggml_tensor * tdnn(ggml_context * ctx, ggml_tensor * x, const conv & c) const;

    speaker_encoder_hparams       hp_;
    conv                          frontend_;
    std::vector<se_res2net_block> blocks_;
    conv                          mfa_, asp_tdnn_, asp_conv_, fc_;
};

} // namespace qt
