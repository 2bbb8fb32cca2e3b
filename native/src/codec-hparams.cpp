#include "codec-hparams.h"

#include "gguf-names.h"
#include "log.h"

namespace qt {

codec_hparams read_codec_hparams(const model_loader & ml, const std::string & prefix, const char * norm_eps_key,
                                 const char * what) {
    auto size = [&](const char * key) { return ml.get_size((prefix + key).c_str()); };
    codec_hparams hp;
    hp.sample_rate = size(QT_KEY_MIMI_SAMPLE_RATE);
    hp.frame_samples = size(QT_KEY_MIMI_FRAME_SAMPLES);
    hp.codebook_size = size(QT_KEY_MIMI_CODEBOOK_SIZE);
    hp.codebook_dim = size(QT_KEY_MIMI_CODEBOOK_DIM);
    hp.hidden = size(QT_KEY_MIMI_HIDDEN);
    hp.ffn = size(QT_KEY_MIMI_FFN);
    hp.layers = int(ml.get_u32((prefix + QT_KEY_MIMI_LAYERS).c_str()));
    hp.heads = size(QT_KEY_MIMI_HEADS);
    hp.kv_heads = size(QT_KEY_MIMI_KV_HEADS);
    hp.head_dim = size(QT_KEY_MIMI_HEAD_DIM);
    hp.sliding_window = size(QT_KEY_MIMI_SLIDING_WINDOW);
    hp.rope_theta = ml.get_f32((prefix + QT_KEY_MIMI_ROPE_THETA).c_str());
    hp.norm_eps = ml.get_f32(norm_eps_key);
    if (hp.heads % hp.kv_heads != 0) {
        throw error(QT_STATUS_INVALID_PARAMS, format("%s: unsupported %s geometry (%d/%d heads)", ml.path().c_str(),
                                                     what, hp.heads, hp.kv_heads));
    }
    return hp;
}

} // namespace qt
