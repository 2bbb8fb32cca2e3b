// The C API: parameter and ABI checks, the context, and the exception-to-status boundary.
#include "qwen3-tts.h"

#include "backend-loader.h"
#include "codec-decoder.h"
#include "codec-encoder.h"
#include "cpu-ops.h"
#include "gguf-names.h"
#include "graph.h"
#include "log.h"
#include "mel.h"
#include "model-loader.h"
#include "session.h"
#include "speaker-encoder.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <memory>
#include <new>
#include <string>
#include <thread>

// Longest reference clip: a minute of 24 kHz audio is far more than cloning benefits from.
static constexpr int32_t k_max_ref_samples = 60 * 24000;
// Shortest: one second; the speaker embedding of anything shorter is unreliable.
static constexpr int32_t k_min_ref_samples = 24000;
// Most frames one request may generate: the model's max_new_tokens (about 11 minutes).
static constexpr int32_t k_max_frames = 8192;

struct qt_context {
    qt::log_sink                      log;
    std::unique_ptr<qt::cpu_backend>  backend;
    qt::stage_dumper                  dumper;
    std::shared_ptr<void>             weights_map;  // the mapped model file: outlives weights_buf
    ggml_context_ptr                  weights_ctx;
    ggml_backend_buffer_ptr           weights_buf;
    qt::mel_frontend                  mel{ 24000 };
    qt::speaker_encoder               speaker;
    qt::codec_encoder                 codec_enc;
    qt::codec_decoder                 codec_dec;
    qt::talker                        talker;
    qt::prompt_builder                prompts;
    qt::code_predictor                predictor;
    // With a device: the talker, the code predictor and (where they fit) the codec decoder and the
    // speaker encoder again, their weights in its memory (the CPU's copies stay: the prompt's
    // embeddings are computed there, a stage runs there when the device runs out of memory, and
    // the codec encoder always does: its nearest-codebook decisions include near-ties, which the
    // device's f16 staging of products flips, 20 of the fixture's 608 codes on lavapipe).
    std::unique_ptr<qt::device_backend> device;
    std::string                         device_id = "cpu";
    std::string                         device_fallback;  // why the device asked for is not in use
    ggml_context_ptr                    device_weights_ctx;
    ggml_backend_buffer_ptr             device_weights_buf;
    qt::talker                          device_talker;
    qt::code_predictor                  device_predictor;
    qt::codec_decoder                   device_decoder;  // not loaded where it did not fit
    qt::speaker_encoder                 device_speaker;  // not loaded where it failed to
    // built on the first request; declared after what it uses (the device): destroyed before it
    std::unique_ptr<qt::code_predictor_state> predictor_state;
    qt::prefill_cache                 prefills;
    qt::primed_stream_cache           primed;  // of the CPU's decoder or the device's
    std::vector<std::string>          language_names;  // parallel to prompts.language_ids()
    int32_t                           eos_id = 0;
    qt_model_info                     info{};
    std::atomic<bool>                 busy{ false };  // a call is running (context_call)
};

namespace {

bool abi_in_range(int32_t v) { return v >= QT_ABI_MIN_VERSION && v <= QT_ABI_VERSION; }

// A call's hold on its context. A second call while one runs, from another thread or from a
// callback of the running one (which would free state that call still uses), is refused.
class context_call {
public:
    context_call(qt_context * ctx, const char * what) : ctx_(ctx), entered_(!ctx->busy.exchange(true)) {
        if (!entered_) {
            qt::set_last_error(qt::format("%s: the context is busy with another call (calls on one context must not "
                                          "overlap, nor call into it from its callbacks)", what));
        }
    }
    ~context_call() {
        if (entered_) {
            ctx_->busy.store(false);
        }
    }
    context_call(const context_call &) = delete;
    context_call & operator=(const context_call &) = delete;
    bool entered() const { return entered_; }

private:
    qt_context * ctx_;
    bool         entered_;
};

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
    return n ? std::min(int(n), GGML_MAX_N_THREADS) : 1;
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

// A malloc'd copy for the caller to free (never NULL for empty audio unless out of memory).
float * copy_audio(const std::vector<float> & pcm) {
    auto * out = static_cast<float *>(malloc(std::max<size_t>(pcm.size(), 1) * sizeof(float)));
    if (out) {
        std::copy(pcm.begin(), pcm.end(), out);
    }
    return out;
}

} // namespace

extern "C" {

const char * qt_system_info(void) {
    // made once: a pointer handed out stays valid for the library's life
    static const std::string text = [] {
        try {
            return qt::cpu_backend_loaded().describe(qt::cpu_kernels_name(qt::cpu_kernels_best()));
        } catch (const std::exception & e) {
            return std::string("no CPU backend: ") + e.what();
        }
    }();
    return text.c_str();
}

namespace {

void copy_text(char * dst, size_t size, const std::string & text) {
    const size_t n = std::min(size - 1, text.size());
    memcpy(dst, text.data(), n);
    dst[n] = '\0';
}

} // namespace

int32_t qt_device_count(void) {
    int32_t n = -1;
    const qt_status status = guarded([&] { n = int32_t(qt::devices_loaded().devices.size()); });
    return status == QT_STATUS_OK ? n : -1;
}

qt_status qt_get_device(int32_t index, qt_device_info * out) {
    if (!out) {
        qt::set_last_error("qt_get_device: out is NULL");
        return QT_STATUS_INVALID_PARAMS;
    }
    memset(out, 0, sizeof(*out));
    return guarded([&] {
        const qt::devices_found found = qt::devices_loaded();
        if (index < 0 || size_t(index) >= found.devices.size()) {
            throw qt::error(QT_STATUS_INVALID_PARAMS, qt::format("qt_get_device: no device %d (there are %zu)", index,
                                                                 found.devices.size()));
        }
        const qt::device_info & d = found.devices[size_t(index)];
        copy_text(out->id, sizeof(out->id), d.id);
        copy_text(out->description, sizeof(out->description), d.description);
        copy_text(out->kind, sizeof(out->kind), d.kind);
        out->memory_total = d.memory_total;
        out->memory_free = d.memory_free;
    });
}

const char * qt_device_notes(void) {
    static const std::string text = [] {  // made once, as qt_system_info's
        std::string notes;
        try {
            for (const std::string & note : qt::devices_loaded().notes) {
                notes += (notes.empty() ? "" : "\n") + note;
            }
        } catch (const std::exception & e) {
            notes = std::string("no CPU backend: ") + e.what();
        }
        return notes;
    }();
    return text.c_str();
}

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
        /*.codec_chunk_sec        =*/ QT_DEFAULT_CODEC_CHUNK_SEC,
        /*.share_cores            =*/ 1,
        /*.device                 =*/ "cpu",
    };
    return p;
}

namespace {

// Frees everything the context keeps on its device (a code predictor state built there, the
// weights of the talker, the code predictor, the codec decoder and the speaker encoder, the
// backend) and forgets the cached prefills and primed decoder states, which may be the device's:
// the CPU runs everything from then on, with the CPU's output.
void release_device(qt_context & ctx) {
    ctx.prefills.clear();
    ctx.primed.clear();
    ctx.predictor_state.reset();
    ctx.device_predictor = qt::code_predictor();
    ctx.device_decoder = qt::codec_decoder();
    ctx.device_speaker = qt::speaker_encoder();
    ctx.device_talker = qt::talker();
    ctx.device_weights_buf.reset();
    ctx.device_weights_ctx.reset();
    ctx.device.reset();
    ctx.device_id = "cpu";
}

// Puts the talker, the code predictor and, where they fit, the codec decoder and the speaker
// encoder on `wanted` ("cpu", "auto" or a device id), loading their weights there; a device that is
// missing or fails to start leaves them on the CPU, said in the log and in ctx.device_fallback. A
// malformed name is an error.
void start_device(qt_context & ctx, const char * model_path, const std::string & wanted, int64_t max_chunk_frames) {
    if (wanted == "cpu") {
        return;
    }
    const bool auto_pick = wanted == "auto";
    const size_t colon = wanted.find(':');
    if (!auto_pick && (colon == std::string::npos || colon == 0 || colon + 1 == wanted.size() ||
                       wanted.find_first_not_of("0123456789", colon + 1) != std::string::npos)) {
        throw qt::error(QT_STATUS_INVALID_PARAMS, qt::format("device '%s': not cpu, auto or a device id such as "
                                                             "vulkan:0", wanted.c_str()));
    }
    const qt::devices_found found = qt::devices_loaded();
    auto device = found.devices.end();
    if (auto_pick) {
        // the best GPU: a discrete one before an integrated one, then the one with more memory
        const auto rank = [](const qt::device_info & d) { return d.kind == "gpu" ? 2 : d.kind == "igpu" ? 1 : 0; };
        for (auto d = found.devices.begin(); d != found.devices.end(); ++d) {
            if (rank(*d) > 0 && (device == found.devices.end() || rank(*d) > rank(*device) ||
                                 (rank(*d) == rank(*device) && d->memory_total > device->memory_total))) {
                device = d;
            }
        }
    } else {
        device = std::find_if(found.devices.begin(), found.devices.end(),
                              [&](const qt::device_info & d) { return d.id == wanted; });
    }
    if (device == found.devices.end()) {
        std::string listed;
        for (const qt::device_info & d : found.devices) {
            listed += (listed.empty() ? "" : ", ") + d.id;
        }
        ctx.device_fallback = auto_pick ? "no GPU was found (devices: " + listed + ")"
                                        : "no device " + wanted + " (devices: " + listed + ")";
        for (const std::string & note : found.notes) {
            ctx.device_fallback += "; " + note;
        }
        if (!auto_pick) {
            QT_LOG_WARN("%s: running on the CPU", ctx.device_fallback.c_str());
        }
        return;
    }
    try {
        ctx.device = std::make_unique<qt::device_backend>(device->device, *ctx.backend);
        qt::model_loader loader(model_path, ctx.device->get());
        ctx.device_talker.load(loader);
        ctx.device_predictor.load(loader, ctx.device_talker);
        try {
            ctx.device_decoder.load(loader, ctx.device.get());
            ctx.device_decoder.reserve(*ctx.device, max_chunk_frames);
        } catch (const std::exception & e) {
            ctx.device_decoder = qt::codec_decoder();
            QT_LOG_WARN("%s: the codec decoder stays on the CPU (%s)", device->id.c_str(), e.what());
        }
        try {  // its weights are in the loader's buffer already
            ctx.device_speaker.load(loader);
        } catch (const std::exception & e) {
            ctx.device_speaker = qt::speaker_encoder();
            QT_LOG_WARN("%s: the speaker encoder stays on the CPU (%s)", device->id.c_str(), e.what());
        }
        ctx.device_weights_ctx = loader.take_context();
        ctx.device_weights_buf = loader.take_buffer();
        ctx.device_id = device->id;
        QT_LOG_INFO("talker, code predictor%s%s on %s (%s)", ctx.device_decoder.loaded() ? ", codec decoder" : "",
                    ctx.device_speaker.loaded() ? ", speaker encoder" : "", device->id.c_str(),
                    device->description.c_str());
    } catch (const std::exception & e) {  // a backend's own exceptions too (ggml-vulkan throws vk:: errors)
        release_device(ctx);
        ctx.device_fallback = device->id + " (" + device->description + ") failed to start: " + e.what();
        QT_LOG_WARN("%s; running on the CPU", ctx.device_fallback.c_str());
    }
}

} // namespace

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
    if (params->n_threads > GGML_MAX_N_THREADS) {
        qt::set_last_error(qt::format("qt_init: %d threads; ggml runs at most %d", params->n_threads, GGML_MAX_N_THREADS));
        return nullptr;
    }
    if (!std::isfinite(params->codec_chunk_sec)) {
        qt::set_last_error("qt_init: codec_chunk_sec is not a finite number");
        return nullptr;
    }
    qt::log_scope scope({ params->log_callback, params->log_callback_user_data });
    std::unique_ptr<qt_context> ctx;
    const qt_status status = guarded([&] {
        const auto t0 = std::chrono::steady_clock::now();
        ctx = std::make_unique<qt_context>();
        ctx->log = { params->log_callback, params->log_callback_user_data };
        const int n_threads = params->n_threads > 0 ? params->n_threads : default_threads();
        const bool share_cores = params->abi_version < 4 || params->share_cores != 0;
        ctx->backend = std::make_unique<qt::cpu_backend>(n_threads, share_cores);
        ctx->dumper = qt::stage_dumper(params->dump_dir ? params->dump_dir : "");

        qt::model_loader loader(params->model_path, ctx->backend->get());
        ctx->speaker.load(loader);
        ctx->codec_enc.load(loader);
        ctx->codec_dec.load(loader);
        ctx->talker.load(loader);
        ctx->prompts.load(loader, ctx->talker);
        ctx->predictor.load(loader, ctx->talker);
        ctx->language_names = loader.get_str_array(QT_KEY_TALKER_LANG_NAMES);
        ctx->eos_id = int32_t(loader.get_u32(QT_KEY_CODEC_EOS_ID));
        if (ctx->language_names.size() != ctx->prompts.language_ids().size()) {
            throw qt::error(QT_STATUS_INVALID_PARAMS, qt::format("%s is corrupt: language names and ids differ in number",
                                                                 params->model_path));
        }
        fill_model_info(loader, ctx->info, ctx->speaker, ctx->codec_enc);
        const auto & dec = ctx->codec_dec.hparams();
        if (dec.sample_rate != ctx->info.sample_rate || dec.frame_samples != ctx->info.samples_per_frame ||
            dec.n_quantizers != ctx->info.n_codebooks || dec.codebook_size != ctx->info.codebook_size) {
            throw qt::error(QT_STATUS_INVALID_PARAMS,
                            qt::format("%s is inconsistent: the codec decoder's rate, frame or codebooks differ from "
                                       "the encoder's", params->model_path));
        }
        // What generation writes, the decoder must read: a frame's codebooks, each code within
        // its codebook, and an end-of-speech id apart from them (below the talker's vocabulary).
        const int32_t talker_vocab = int32_t(ctx->talker.hparams().vocab);
        if (ctx->prompts.n_codebooks() != ctx->info.n_codebooks ||
            ctx->predictor.hparams().vocab != ctx->info.codebook_size || talker_vocab <= ctx->info.codebook_size ||
            ctx->eos_id < ctx->info.codebook_size || ctx->eos_id >= talker_vocab) {
            throw qt::error(QT_STATUS_INVALID_PARAMS,
                            qt::format("%s is inconsistent: the talker makes %d codebooks of %d codes (end of speech "
                                       "%d of %d ids); the codec has %d codebooks of %d",
                                       params->model_path, ctx->prompts.n_codebooks(),
                                       int(ctx->predictor.hparams().vocab), ctx->eos_id, talker_vocab,
                                       ctx->info.n_codebooks, ctx->info.codebook_size));
        }
        const float  chunk_sec = params->codec_chunk_sec > 0.0f ? params->codec_chunk_sec : QT_DEFAULT_CODEC_CHUNK_SEC;
        const double frame_rate = double(dec.sample_rate) / dec.frame_samples;
        ctx->info.codec_chunk_frames =
            int32_t(std::lround(std::clamp(double(chunk_sec) * frame_rate, 1.0, double(k_max_frames))));
        const char * device = params->abi_version >= 6 && params->device && *params->device ? params->device : "cpu";
        start_device(*ctx, params->model_path, device, ctx->info.codec_chunk_frames);
        if (!ctx->device) {  // the CPU runs the talker and the code predictor: their matrices now, not at the first request
            ctx->talker.fill_interleaved();
            ctx->predictor.fill_interleaved();
        }
        const size_t weight_bytes = loader.weight_bytes();
        ctx->weights_ctx = loader.take_context();
        const bool mapped = loader.mapped();
        ctx->weights_map = loader.take_mapping();
        ctx->weights_buf = loader.take_buffer();
        QT_LOG_INFO("[Perf] model load: %.1f ms, %.1f MiB of weights (%s), %d threads%s (%s)", ms_since(t0),
                    double(weight_bytes) / (1024.0 * 1024.0), mapped ? "mapped" : "read", n_threads,
                    share_cores ? ", fewer while other processes keep cores busy" : "", ctx->info.variant);
    });
    return status == QT_STATUS_OK ? ctx.release() : nullptr;
}

void qt_free(qt_context * ctx) {
    delete ctx;
#if defined(__GLIBC__)
    // glibc keeps the freed model's pages for reuse; when the next model's buffers do not fit the
    // holes they leave, the process grows with every model change (the soak measured +42 MiB of
    // free-but-kept heap in 6 minutes of model changes). Freeing a model is rare: give them back.
    malloc_trim(0);
#endif
}

void qt_forget_prompts(qt_context * ctx) {
    if (!ctx) {
        return;
    }
    const context_call call(ctx, "qt_forget_prompts");
    if (call.entered()) {
        ctx->prefills.clear();
        ctx->primed.clear();
    }
}

const char * qt_device_in_use(const qt_context * ctx) { return ctx ? ctx->device_id.c_str() : ""; }

const char * qt_device_fallback(const qt_context * ctx) { return ctx ? ctx->device_fallback.c_str() : ""; }

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
    const context_call call(ctx, "qt_extract_voice_ref");
    if (!call.entered()) {
        return QT_STATUS_INVALID_PARAMS;
    }
    qt::log_scope scope(ctx->log);
    qt_voice_ref result{};
    const qt_status status = guarded([&] {
        // The speaker encoder on the device where it is there; a long clip that does not fit its
        // memory is embedded on the CPU instead, for this call alone, and a device that fails
        // otherwise (an op its backend lacks) leaves the embedding to the CPU from then on.
        auto t0 = std::chrono::steady_clock::now();
        const std::vector<float> mel = ctx->mel.compute(pcm_24k, n_samples, ctx->dumper);
        const int64_t n_mel_frames = qt::mel_frontend::n_frames(n_samples);
        bool embedded_on_device = false;
        std::vector<float> embedding;
        if (ctx->device_speaker.loaded()) {
            try {
                embedding = ctx->device_speaker.embed(*ctx->device, ctx->dumper, mel, n_mel_frames);
                embedded_on_device = true;
            } catch (const qt::error & e) {
                if (e.status == QT_STATUS_CANCELLED) {
                    throw;
                }
                const bool for_good = e.status != QT_STATUS_OUT_OF_MEMORY;
                QT_LOG_WARN("%s: the speaker embedding runs on the CPU%s (%s)", ctx->device_id.c_str(),
                            for_good ? " from now on" : "", e.what());
                if (for_good) {
                    ctx->device_speaker = qt::speaker_encoder();
                }
            }
        }
        if (!embedded_on_device) {
            embedding = ctx->speaker.embed(*ctx->backend, ctx->dumper, mel, n_mel_frames);
        }
        const double t_embed = ms_since(t0);

        t0 = std::chrono::steady_clock::now();
        int64_t n_frames = 0;
        const std::vector<int32_t> codes = ctx->codec_enc.encode(*ctx->backend, ctx->dumper, pcm_24k, n_samples, &n_frames);
        const double t_codes = ms_since(t0);
        QT_LOG_INFO("[Perf] speaker embedding: %.1f ms, reference codes: %.1f ms (%.2f s clip, %lld frames; "
                    "speaker embedding on %s)", t_embed, t_codes, n_samples / 24000.0, (long long) n_frames,
                    embedded_on_device ? ctx->device_id.c_str() : "cpu");

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

qt_tts_params qt_tts_default_params(void) {
    const qt_sampling card = {
        /*.temperature        =*/ 0.9f,
        /*.top_k              =*/ 50,
        /*.top_p              =*/ 1.0f,
        /*.repetition_penalty =*/ 1.05f,
    };
    qt_tts_params p = {
        /*.abi_version               =*/ QT_ABI_VERSION,
        /*.text_ids                  =*/ nullptr,
        /*.n_text_ids                =*/ 0,
        /*.ref_text_ids              =*/ nullptr,
        /*.n_ref_text_ids            =*/ 0,
        /*.voice                     =*/ nullptr,
        /*.mode                      =*/ QT_CLONE_XVECTOR,
        /*.language                  =*/ nullptr,
        /*.talker_sampling           =*/ card,
        /*.predictor_sampling        =*/ card,
        /*.seed                      =*/ 0,
        /*.max_frames                =*/ 0,
        /*.cancel_callback           =*/ nullptr,
        /*.cancel_callback_user_data =*/ nullptr,
        /*.chunk_callback            =*/ nullptr,
        /*.chunk_callback_user_data  =*/ nullptr,
    };
    p.predictor_sampling.repetition_penalty = 1.0f;
    return p;
}

int32_t qt_default_max_frames(int32_t n_text_ids) {
    const int64_t frames = int64_t(12.5 * (3.0 + std::max<int32_t>(n_text_ids, 0)));
    return int32_t(std::min<int64_t>(frames, k_max_frames));
}

namespace {

// Checks one request's parameters and fills `req` (its text, voice, sampling and callbacks
// point into `params`, which must outlive it). Sets the last error when the request is refused.
qt_status make_request(const qt_context * ctx, const qt_tts_params * params, qt::synthesis_request & req) {
    if (!abi_in_range(params->abi_version)) {
        return reject_abi("qt_tts_params", params->abi_version);
    }
    if (!params->voice || !params->voice->speaker_embedding) {
        qt::set_last_error("qt_synthesize: no voice given");
        return QT_STATUS_INVALID_PARAMS;
    }
    if (params->voice->n_embd != ctx->info.n_speaker_embd) {
        qt::set_last_error(qt::format("the voice's speaker embedding has %d values; this %s model needs %d (the voice "
                                      "was made with another model size)",
                                      params->voice->n_embd, ctx->info.variant, ctx->info.n_speaker_embd));
        return QT_STATUS_INVALID_PARAMS;
    }
    for (int32_t i = 0; i < params->voice->n_embd; ++i) {
        if (!std::isfinite(params->voice->speaker_embedding[i])) {
            qt::set_last_error(qt::format("the voice's speaker embedding is damaged: value %d is not a finite number "
                                          "(embed the reference again)", i));
            return QT_STATUS_INVALID_PARAMS;
        }
    }
    // read as the int a C caller may have stored: loading an out-of-range value as the C++ enum
    // would be undefined
    int32_t mode = 0;
    static_assert(sizeof(params->mode) == sizeof(mode), "qt_clone_mode is an int");
    memcpy(&mode, &params->mode, sizeof(mode));
    if (mode != QT_CLONE_XVECTOR && mode != QT_CLONE_IN_CONTEXT) {
        qt::set_last_error(qt::format("unknown clone mode %d", mode));
        return QT_STATUS_INVALID_MODE;
    }
    if (params->max_frames > k_max_frames) {
        qt::set_last_error(qt::format("max_frames %d is over the model's limit of %d frames (%.0f s)", params->max_frames,
                                      k_max_frames, k_max_frames / 12.5));
        return QT_STATUS_INVALID_PARAMS;
    }
    const bool in_context = mode == QT_CLONE_IN_CONTEXT;
    if (in_context && params->voice->n_codebooks != ctx->info.n_codebooks) {
        qt::set_last_error(qt::format("the voice's reference codes have %d codebooks; the model needs %d",
                                      params->voice->n_codebooks, ctx->info.n_codebooks));
        return QT_STATUS_INVALID_MODE;
    }
    const qt_sampling & ts = params->talker_sampling;
    const qt_sampling & ps = params->predictor_sampling;
    const auto finite = [](const qt_sampling & s) { return std::isfinite(s.temperature) && std::isfinite(s.top_p); };
    if (!finite(ts) || !finite(ps)) {
        qt::set_last_error(qt::format("sampling: temperature and top_p must be finite numbers (talker %g and %g, "
                                      "code predictor %g and %g)", double(ts.temperature), double(ts.top_p),
                                      double(ps.temperature), double(ps.top_p)));
        return QT_STATUS_INVALID_PARAMS;
    }
    if (!std::isfinite(ts.repetition_penalty) || ts.repetition_penalty <= 0.0f) {
        qt::set_last_error(qt::format("talker sampling: the repetition penalty %g must be a number above 0 (1: off)",
                                      double(ts.repetition_penalty)));
        return QT_STATUS_INVALID_PARAMS;
    }
    int32_t language_id = -1;
    const std::string language = params->language ? params->language : "auto";
    if (language != "auto") {
        const auto it = std::find(ctx->language_names.begin(), ctx->language_names.end(), language);
        if (it == ctx->language_names.end()) {
            std::string known = "auto";
            for (const auto & name : ctx->language_names) {
                known += ", " + name;
            }
            qt::set_last_error(qt::format("unknown language '%s'; the model knows: %s", language.c_str(), known.c_str()));
            return QT_STATUS_INVALID_PARAMS;
        }
        language_id = ctx->prompts.language_ids()[size_t(it - ctx->language_names.begin())];
    }

    req.prompt.text_ids = params->text_ids;
    req.prompt.n_text_ids = params->text_ids ? params->n_text_ids : 0;
    req.prompt.ref_ids = params->ref_text_ids;
    req.prompt.n_ref_ids = params->ref_text_ids ? params->n_ref_text_ids : 0;
    req.prompt.speaker = params->voice->speaker_embedding;
    req.prompt.ref_codes = params->voice->codes;
    req.prompt.n_ref_frames = params->voice->codes ? params->voice->n_frames : 0;
    req.prompt.language_id = language_id;
    req.prompt.in_context = in_context;
    req.talker.temperature = ts.temperature;
    req.talker.top_k = ts.top_k;
    req.talker.top_p = ts.top_p;
    req.talker.repetition_penalty = ts.repetition_penalty;
    req.talker.eos_id = ctx->eos_id;
    req.talker.suppress_begin = ctx->info.codebook_size;  // the control ids: vocab - 1024 on, as the reference
    req.talker.suppress_end = ctx->talker.hparams().vocab;
    req.talker.seed = params->seed;
    req.predictor.temperature = ps.temperature;
    req.predictor.top_k = ps.top_k;
    req.predictor.top_p = ps.top_p;
    req.predictor.seed = params->seed;
    req.max_frames = params->max_frames > 0 ? params->max_frames : qt_default_max_frames(params->n_text_ids);
    if (params->cancel_callback) {
        req.cancelled = [params] { return params->cancel_callback(params->cancel_callback_user_data); };
    }
    req.chunk_frames = ctx->info.codec_chunk_frames;
    if (params->chunk_callback) {
        const int32_t n_books = ctx->info.n_codebooks;
        req.on_chunk = [params, n_books](const int32_t * codes, int64_t n_frames, int64_t first_frame, const float * pcm,
                                         int64_t n_samples, int64_t first_sample, bool last) {
            const qt_chunk chunk = { codes, int32_t(n_frames), n_books, int32_t(first_frame),
                                     pcm,   int32_t(n_samples), first_sample, last };
            return params->chunk_callback(&chunk, params->chunk_callback_user_data);
        };
    }
    if (in_context) {
        req.prime_codes = params->voice->codes;
        req.n_prime_frames = params->voice->n_frames;
    }
    return QT_STATUS_OK;
}

// Hands a result over to the caller's struct (malloc'd, for qt_tts_result_free).
qt_status copy_result(const qt::synthesis_result & result, qt_tts_result * out) {
    out->n_frames = int32_t(result.n_frames);
    out->n_codebooks = result.n_codebooks;
    out->reached_eos = result.reached_eos;
    out->codes = static_cast<int32_t *>(malloc(std::max<size_t>(result.codes.size(), 1) * sizeof(int32_t)));
    if (!out->codes) {
        memset(out, 0, sizeof(*out));
        qt::set_last_error("out of memory");
        return QT_STATUS_OUT_OF_MEMORY;
    }
    std::copy(result.codes.begin(), result.codes.end(), out->codes);
    out->pcm = copy_audio(result.pcm);
    if (!out->pcm) {
        free(out->codes);
        memset(out, 0, sizeof(*out));
        qt::set_last_error("out of memory");
        return QT_STATUS_OUT_OF_MEMORY;
    }
    out->n_samples = int64_t(result.pcm.size());
    return QT_STATUS_OK;
}

// The context's code predictor state, for batches of up to `max_batch` requests.
qt::code_predictor_state & predictor_for(qt_context * ctx, int max_batch) {
    if (!ctx->predictor_state || ctx->predictor_state->max_batch() < max_batch) {
        ctx->predictor_state.reset();  // before the next is built: not both in memory
        ctx->predictor_state = ctx->device ? std::make_unique<qt::code_predictor_state>(
                                                 ctx->device_predictor, *ctx->device, qt::cp_sampling{}, max_batch)
                                           : std::make_unique<qt::code_predictor_state>(
                                                 ctx->predictor, *ctx->backend, qt::cp_sampling{}, max_batch);
    }
    return *ctx->predictor_state;
}

// The components a request runs through: the talker and the code predictor on the device when
// there is one.
qt::synthesis_models models_for(qt_context * ctx, int max_batch) {
    return { ctx->device ? ctx->device_talker : ctx->talker, ctx->prompts, predictor_for(ctx, max_batch),
             ctx->device_decoder.loaded() ? ctx->device_decoder : ctx->codec_dec, &ctx->prefills, &ctx->primed,
             ctx->device.get(),
             ctx->device_decoder.loaded() ? ctx->device.get() : nullptr };
}

// Gives the device up for this context (release_device); `why` goes to the log and
// qt_device_fallback.
void leave_device(qt_context * ctx, const std::string & why) {
    ctx->device_fallback = ctx->device_id + ": " + why;
    QT_LOG_WARN("%s; running on the CPU from now on", ctx->device_fallback.c_str());
    release_device(*ctx);
}

// Runs `run(models)` for the requests `reqs` on the context's device; where the device runs out
// of memory before any audio came out, it is given up (leave_device) and the requests run
// again on the CPU. A request's device memory is all allocated before its first frame.
void run_with_fallback(qt_context * ctx, const std::vector<qt::synthesis_request *> & reqs, int width,
                       const std::function<void(const qt::synthesis_models &)> & run) {
    if (!ctx->device) {
        run(models_for(ctx, width));
        return;
    }
    bool audio_out = false;
    std::vector<decltype(qt::synthesis_request::on_chunk)> chunk_callbacks;
    for (qt::synthesis_request * req : reqs) {
        chunk_callbacks.push_back(req->on_chunk);
        if (req->on_chunk) {
            req->on_chunk = [&audio_out, inner = req->on_chunk](const int32_t * codes, int64_t n_frames, int64_t first_frame,
                                                                const float * pcm, int64_t n_samples, int64_t first_sample,
                                                                bool last) {
                audio_out = true;
                return inner(codes, n_frames, first_frame, pcm, n_samples, first_sample, last);
            };
        }
    }
    const auto restore = [&] {
        for (size_t i = 0; i < reqs.size(); ++i) {
            reqs[i]->on_chunk = chunk_callbacks[i];
        }
    };
    try {
        run(models_for(ctx, width));
    } catch (const qt::error & e) {
        restore();
        if (e.status != QT_STATUS_OUT_OF_MEMORY || audio_out) {
            throw;
        }
        leave_device(ctx, std::string("out of memory (") + e.what() + ")");
        run(models_for(ctx, width));
        return;
    }
    restore();
}

} // namespace

qt_status qt_synthesize(qt_context * ctx, const qt_tts_params * params, qt_tts_result * out) {
    if (out) {
        memset(out, 0, sizeof(*out));
    }
    if (!ctx || !params || !out) {
        qt::set_last_error("qt_synthesize: NULL argument");
        return QT_STATUS_INVALID_PARAMS;
    }
    qt::synthesis_request req;
    if (const qt_status status = make_request(ctx, params, req); status != QT_STATUS_OK) {
        return status;
    }
    const context_call call(ctx, "qt_synthesize");
    if (!call.entered()) {
        return QT_STATUS_INVALID_PARAMS;
    }
    qt::log_scope scope(ctx->log);
    qt::synthesis_result result;
    const qt_status status = guarded([&] {
        run_with_fallback(ctx, { &req }, 1, [&](const qt::synthesis_models & models) {
            result = qt::synthesize(*ctx->backend, ctx->dumper, models, req);
        });
    });
    if (status != QT_STATUS_OK) {
        return status;
    }
    return copy_result(result, out);
}

qt_status qt_synthesize_batch(qt_context * ctx, const qt_tts_params * params, int32_t n_requests, int32_t max_batch,
                              qt_tts_result * out) {
    if (out && n_requests > 0) {
        memset(out, 0, sizeof(*out) * size_t(n_requests));
    }
    if (!ctx || !params || !out) {
        qt::set_last_error("qt_synthesize_batch: NULL argument");
        return QT_STATUS_INVALID_PARAMS;
    }
    if (n_requests < 1 || max_batch < 1 || max_batch > QT_MAX_BATCH) {
        qt::set_last_error(qt::format("qt_synthesize_batch: %d requests, %d at a time (at least 1 request; 1 to %d at "
                                      "a time)", n_requests, max_batch, QT_MAX_BATCH));
        return QT_STATUS_INVALID_PARAMS;
    }
    std::vector<qt::synthesis_request> reqs(static_cast<size_t>(n_requests));
    for (int32_t i = 0; i < n_requests; ++i) {
        if (const qt_status status = make_request(ctx, &params[i], reqs[size_t(i)]); status != QT_STATUS_OK) {
            qt::set_last_error(qt::format("request %d: %s", i, qt_last_error()));
            return status;
        }
    }
    const context_call call(ctx, "qt_synthesize_batch");
    if (!call.entered()) {
        return QT_STATUS_INVALID_PARAMS;
    }
    qt::log_scope scope(ctx->log);
    std::vector<qt::synthesis_result> results;
    const qt_status status = guarded([&] {
        const int width = std::min(max_batch, n_requests);
        std::vector<qt::synthesis_request *> each;
        for (qt::synthesis_request & r : reqs) {
            each.push_back(&r);
        }
        run_with_fallback(ctx, each, width, [&](const qt::synthesis_models & models) {
            results = qt::synthesize_batch(*ctx->backend, models, reqs, width);
        });
    });
    if (status != QT_STATUS_OK) {
        return status;
    }
    for (int32_t i = 0; i < n_requests; ++i) {
        if (const qt_status copied = copy_result(results[size_t(i)], &out[i]); copied != QT_STATUS_OK) {
            for (int32_t j = 0; j < i; ++j) {
                qt_tts_result_free(&out[j]);
            }
            return copied;
        }
    }
    return QT_STATUS_OK;
}

void qt_tts_result_free(qt_tts_result * result) {
    if (!result) {
        return;
    }
    free(result->codes);
    free(result->pcm);
    memset(result, 0, sizeof(*result));
}

qt_status qt_decode(qt_context * ctx, const int32_t * codes, int32_t n_frames, int32_t n_codebooks,
                    int32_t chunk_frames, qt_audio * out) {
    if (out) {
        memset(out, 0, sizeof(*out));
    }
    if (!ctx || !codes || !out) {
        qt::set_last_error("qt_decode: NULL argument");
        return QT_STATUS_INVALID_PARAMS;
    }
    if (n_frames < 1) {
        qt::set_last_error(qt::format("qt_decode: %d frames; at least one is needed", n_frames));
        return QT_STATUS_INVALID_PARAMS;
    }
    if (n_codebooks != ctx->info.n_codebooks) {
        qt::set_last_error(qt::format("qt_decode: codes have %d codebooks; the model needs %d", n_codebooks,
                                      ctx->info.n_codebooks));
        return QT_STATUS_INVALID_PARAMS;
    }
    const int64_t n_codes = int64_t(n_frames) * n_codebooks;
    for (int64_t i = 0; i < n_codes; ++i) {
        if (codes[i] >= ctx->info.codebook_size) {
            qt::set_last_error(qt::format("qt_decode: code %d of frame %lld is outside the codebook (size %d)", codes[i],
                                          (long long) (i / n_codebooks), ctx->info.codebook_size));
            return QT_STATUS_INVALID_PARAMS;
        }
    }
    const context_call call(ctx, "qt_decode");
    if (!call.entered()) {
        return QT_STATUS_INVALID_PARAMS;
    }
    qt::log_scope scope(ctx->log);
    std::vector<float> pcm;
    const qt_status status = guarded([&] {
        const auto    t0 = std::chrono::steady_clock::now();
        const int64_t width = chunk_frames > 0 ? chunk_frames : ctx->info.codec_chunk_frames;
        const auto decode_on = [&](const qt::codec_decoder & decoder, const qt::compute_backend & backend) {
            pcm.clear();
            qt::codec_stream stream(decoder);
            for (int64_t f = 0; f < n_frames; f += width) {
                const int64_t n = std::min<int64_t>(width, n_frames - f);
                const std::vector<float> part = stream.decode(backend, ctx->dumper, codes + f * n_codebooks, n);
                pcm.insert(pcm.end(), part.begin(), part.end());
            }
        };
        bool on_device = ctx->device_decoder.loaded();
        if (on_device) {
            try {
                decode_on(ctx->device_decoder, *ctx->device);
            } catch (const qt::error & e) {
                if (e.status != QT_STATUS_OUT_OF_MEMORY) {
                    throw;
                }
                // chunks wider than the requests' may not fit where theirs do: this call alone
                QT_LOG_WARN("%s: decoding on the CPU (%s)", ctx->device_id.c_str(), e.what());
                on_device = false;
            }
        }
        if (!on_device) {
            decode_on(ctx->codec_dec, *ctx->backend);
        }
        const double seconds = double(pcm.size()) / ctx->info.sample_rate;
        QT_LOG_INFO("[Perf] codec decode: %.1f ms per second of audio (%d frames in chunks of %lld, %s)",
                    ms_since(t0) / seconds, n_frames, (long long) width, on_device ? ctx->device_id.c_str() : "cpu");
    });
    if (status != QT_STATUS_OK) {
        return status;
    }
    out->pcm = copy_audio(pcm);
    if (!out->pcm) {
        qt::set_last_error("out of memory");
        return QT_STATUS_OUT_OF_MEMORY;
    }
    out->n_samples = int64_t(pcm.size());
    return QT_STATUS_OK;
}

void qt_audio_free(qt_audio * audio) {
    if (!audio) {
        return;
    }
    free(audio->pcm);
    memset(audio, 0, sizeof(*audio));
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
