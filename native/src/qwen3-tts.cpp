// The C API: parameter and ABI checks, the context, and the exception-to-status boundary.
#include "qwen3-tts.h"

#include "codec-encoder.h"
#include "gguf-names.h"
#include "graph.h"
#include "log.h"
#include "mel.h"
#include "model-loader.h"
#include "speaker-encoder.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <thread>

// Longest reference clip: a minute of 24 kHz audio is far more than cloning benefits from.
static constexpr int32_t k_max_ref_samples = 60 * 24000;
// Shortest: one second; the speaker embedding of anything shorter is unreliable.
static constexpr int32_t k_min_ref_samples = 24000;

struct qt_context {
    qt::log_sink                      log;
    std::unique_ptr<qt::cpu_backend>  backend;
    qt::stage_dumper                  dumper;
    ggml_context_ptr                  weights_ctx;
    ggml_backend_buffer_ptr           weights_buf;
    qt::mel_frontend                  mel{ 24000 };
    qt::speaker_encoder               speaker;
    qt::codec_encoder                 codec_enc;
    qt_model_info                     info{};
};

namespace {

bool abi_in_range(int32_t v) { return v >= QT_ABI_MIN_VERSION && v <= QT_ABI_VERSION; }

qt_status reject_abi(const char * what, int32_t v) {
    qt::set_last_error(qt::format("%s.abi_version is %d; this library supports ABI versions %d to %d", what, v,
                                  QT_ABI_MIN_VERSION, QT_ABI_VERSION));
    return QT_STATUS_INVALID_PARAMS;
}

// Runs `body`, turning exceptions into a status code and the last-error message.
template <typename F>
qt_status guarded(F && body) {
    try {
        body();
        qt::set_last_error("");
        return QT_STATUS_OK;
    } catch (const qt::error & e) {
        qt::set_last_error(e.what());
        QT_LOG_DEBUG("%s", e.what());
        return e.status;
    } catch (const std::bad_alloc &) {
        qt::set_last_error("out of memory");
        QT_LOG_DEBUG("out of memory");
        return QT_STATUS_OUT_OF_MEMORY;
    } catch (const std::exception & e) {
        qt::set_last_error(e.what());
        QT_LOG_DEBUG("%s", e.what());
        return QT_STATUS_FAILED;
    }
}

int default_threads() {
    const unsigned n = std::thread::hardware_concurrency();
    return n ? int(n) : 1;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void fill_model_info(qt::model_loader & loader, qt_model_info & info, const qt::speaker_encoder & spk,
                     const qt::codec_encoder & enc) {
    info.sample_rate = enc.hparams().sample_rate;
    info.samples_per_frame = enc.hparams().frame_samples;
    info.n_codebooks = enc.hparams().valid_quantizers;
    info.codebook_size = enc.hparams().codebook_size;
    info.n_speaker_embd = spk.hparams().enc_dim;
    info.talker_hidden = int32_t(loader.get_u32(QT_KEY_TALKER_HIDDEN));
    info.talker_layers = int32_t(loader.get_u32(QT_KEY_TALKER_LAYERS));
    info.predictor_hidden = int32_t(loader.get_u32(QT_KEY_CP_HIDDEN));
    info.predictor_layers = int32_t(loader.get_u32(QT_KEY_CP_LAYERS));
    info.weight_type = int32_t(loader.require("talker.blk.0.attn_q.weight")->type);
    const std::string size = loader.get_str(QT_KEY_MODEL_SIZE);
    const char * variant = size == "0b6" ? "0.6B" : size == "1b7" ? "1.7B" : size.c_str();
    snprintf(info.variant, sizeof(info.variant), "%s", variant);
    if (info.n_speaker_embd != info.talker_hidden) {
        throw qt::error(QT_STATUS_INVALID_PARAMS,
                        qt::format("%s is inconsistent: speaker embedding width %d differs from talker width %d",
                                   loader.path().c_str(), info.n_speaker_embd, info.talker_hidden));
    }
}

} // namespace

extern "C" {

const char * qt_version(void) { return QWEN3_TTS_VERSION; }
int32_t qt_abi_version(void) { return QT_ABI_VERSION; }
int32_t qt_abi_min_version(void) { return QT_ABI_MIN_VERSION; }
const char * qt_last_error(void) { return qt::last_error(); }
int32_t qt_voice_ref_min_samples(void) { return k_min_ref_samples; }
int32_t qt_voice_ref_max_samples(void) { return k_max_ref_samples; }

qt_init_params qt_init_default_params(void) {
    qt_init_params p = {
        /*.abi_version            =*/ QT_ABI_VERSION,
        /*.model_path             =*/ nullptr,
        /*.n_threads              =*/ 0,
        /*.dump_dir               =*/ nullptr,
        /*.log_callback           =*/ nullptr,
        /*.log_callback_user_data =*/ nullptr,
    };
    return p;
}

qt_context * qt_init(const qt_init_params * params) {
    if (!params) {
        qt::set_last_error("qt_init: params is NULL");
        return nullptr;
    }
    if (!abi_in_range(params->abi_version)) {
        reject_abi("qt_init_params", params->abi_version);
        return nullptr;
    }
    if (!params->model_path || !*params->model_path) {
        qt::set_last_error("qt_init: no model path given");
        return nullptr;
    }
    qt::log_scope scope({ params->log_callback, params->log_callback_user_data });
    std::unique_ptr<qt_context> ctx;
    const qt_status status = guarded([&] {
        const auto t0 = std::chrono::steady_clock::now();
        ctx = std::make_unique<qt_context>();
        ctx->log = { params->log_callback, params->log_callback_user_data };
        const int n_threads = params->n_threads > 0 ? params->n_threads : default_threads();
        ctx->backend = std::make_unique<qt::cpu_backend>(n_threads);
        ctx->dumper = qt::stage_dumper(params->dump_dir ? params->dump_dir : "");

        qt::model_loader loader(params->model_path, ctx->backend->get());
        ctx->speaker.load(loader);
        ctx->codec_enc.load(loader);
        fill_model_info(loader, ctx->info, ctx->speaker, ctx->codec_enc);
        const size_t weight_bytes = loader.weight_bytes();
        ctx->weights_ctx = loader.take_context();
        ctx->weights_buf = loader.take_buffer();
        QT_LOG_INFO("[Perf] model load: %.1f ms, %.1f MiB of weights, %d threads (%s)", ms_since(t0),
                    double(weight_bytes) / (1024.0 * 1024.0), n_threads, ctx->info.variant);
    });
    return status == QT_STATUS_OK ? ctx.release() : nullptr;
}

void qt_free(qt_context * ctx) { delete ctx; }

qt_status qt_get_model_info(const qt_context * ctx, qt_model_info * out) {
    if (!ctx || !out) {
        qt::set_last_error("qt_get_model_info: NULL argument");
        return QT_STATUS_INVALID_PARAMS;
    }
    *out = ctx->info;
    return QT_STATUS_OK;
}

qt_status qt_extract_voice_ref(qt_context * ctx, const float * pcm_24k, int32_t n_samples, qt_voice_ref * out) {
    if (out) {
        memset(out, 0, sizeof(*out));
    }
    if (!ctx || !pcm_24k || !out) {
        qt::set_last_error("qt_extract_voice_ref: NULL argument");
        return QT_STATUS_INVALID_PARAMS;
    }
    if (n_samples < k_min_ref_samples || n_samples > k_max_ref_samples) {
        qt::set_last_error(qt::format("reference clip has %d samples (%.2f s); it must be %.0f to %.0f s at 24 kHz",
                                      n_samples, n_samples / 24000.0, k_min_ref_samples / 24000.0,
                                      k_max_ref_samples / 24000.0));
        return QT_STATUS_INVALID_PARAMS;
    }
    for (int32_t i = 0; i < n_samples; ++i) {
        if (!std::isfinite(pcm_24k[i])) {
            qt::set_last_error(qt::format("reference clip has a non-finite sample at index %d", i));
            return QT_STATUS_INVALID_PARAMS;
        }
    }
    qt::log_scope scope(ctx->log);
    qt_voice_ref result{};
    const qt_status status = guarded([&] {
        auto t0 = std::chrono::steady_clock::now();
        const std::vector<float> mel = ctx->mel.compute(pcm_24k, n_samples, ctx->dumper);
        const int64_t n_mel_frames = qt::mel_frontend::n_frames(n_samples);
        const std::vector<float> embedding = ctx->speaker.embed(*ctx->backend, ctx->dumper, mel, n_mel_frames);
        const double t_embed = ms_since(t0);

        t0 = std::chrono::steady_clock::now();
        int64_t n_frames = 0;
        const std::vector<int32_t> codes = ctx->codec_enc.encode(*ctx->backend, ctx->dumper, pcm_24k, n_samples, &n_frames);
        const double t_codes = ms_since(t0);
        QT_LOG_INFO("[Perf] speaker embedding: %.1f ms, reference codes: %.1f ms (%.2f s clip, %lld frames)", t_embed,
                    t_codes, n_samples / 24000.0, (long long) n_frames);

        result.n_embd = int32_t(embedding.size());
        result.n_frames = int32_t(n_frames);
        result.n_codebooks = ctx->codec_enc.hparams().valid_quantizers;
        result.speaker_embedding = static_cast<float *>(malloc(embedding.size() * sizeof(float)));
        result.codes = static_cast<int32_t *>(malloc(codes.size() * sizeof(int32_t)));
        if (!result.speaker_embedding || !result.codes) {
            free(result.speaker_embedding);
            free(result.codes);
            throw std::bad_alloc();
        }
        memcpy(result.speaker_embedding, embedding.data(), embedding.size() * sizeof(float));
        memcpy(result.codes, codes.data(), codes.size() * sizeof(int32_t));
    });
    if (status == QT_STATUS_OK) {
        *out = result;
    }
    return status;
}

void qt_voice_ref_free(qt_voice_ref * ref) {
    if (!ref) {
        return;
    }
    free(ref->speaker_embedding);
    free(ref->codes);
    memset(ref, 0, sizeof(*ref));
}

} // extern "C"
