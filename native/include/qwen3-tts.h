/*
 * qwen3-tts.h: C API of Vocable's native Qwen3-TTS 12 Hz Base engine (ggml, CPU).
 *
 * Usage:
 *
 *     qt_init_params ip = qt_init_default_params();
 *     ip.model_path = "qwen3-tts-0.6b-base-q8_0.gguf";
 *     qt_context * ctx = qt_init(&ip);
 *     if (!ctx) { fprintf(stderr, "%s\n", qt_last_error()); return 1; }
 *
 *     qt_voice_ref ref;                        // pcm: mono float32 at 24 kHz
 *     if (qt_extract_voice_ref(ctx, pcm, n_samples, &ref) != QT_STATUS_OK) { ... }
 *     ... ref.speaker_embedding[0 .. ref.n_embd), ref.codes[frame * ref.n_codebooks + q] ...
 *
 *     qt_tts_params tp = qt_tts_default_params();   // sampling defaults of the model card
 *     tp.text_ids = ids; tp.n_text_ids = n_ids;       // "<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"
 *     tp.voice = &ref;                                // x-vector mode; QT_CLONE_IN_CONTEXT adds the transcript
 *     qt_tts_result res;
 *     if (qt_synthesize(ctx, &tp, &res) == QT_STATUS_OK) { ... res.pcm[0 .. res.n_samples) at 24 kHz ... }
 *     qt_tts_result_free(&res);
 *     qt_voice_ref_free(&ref);
 *     qt_free(ctx);
 *
 * Thread safety: a context may be used by one thread at a time; distinct contexts are
 * independent and may run concurrently. qt_last_error() is per thread. A call on a context
 * while another runs on it (from a second thread, or from a callback of the running call) is
 * refused with QT_STATUS_INVALID_PARAMS.
 *
 * ABI: every params struct starts with `abi_version`. Fill structs with the matching
 * qt_*_default_params() (which sets QT_ABI_VERSION); entry points reject a version outside
 * the closed range [QT_ABI_MIN_VERSION, QT_ABI_VERSION] with QT_STATUS_INVALID_PARAMS (or NULL).
 */
#ifndef QWEN3_TTS_H
#define QWEN3_TTS_H

#include <stdbool.h>
#include <stdint.h>

#ifdef QT_SHARED
#    if defined(_WIN32) && !defined(__MINGW32__)
#        ifdef QT_BUILD
#            define QT_API __declspec(dllexport)
#        else
#            define QT_API __declspec(dllimport)
#        endif
#    else
#        define QT_API __attribute__((visibility("default")))
#    endif
#else
#    define QT_API
#endif

#define QT_ABI_VERSION     6
/* Version 3 added audio: qt_init_params.codec_chunk_sec, the audio fields of qt_chunk and
 * qt_tts_result (so their size changed) and qt_decode. Callers built for 1 or 2 are refused.
 * Version 4 added qt_init_params.share_cores at the end of the struct; a version 3 caller gets
 * its default (on). Version 5 added qt_synthesize_batch and qt_chunk.last at the end of the
 * struct (which the library fills and older callers do not read). Version 6 added
 * qt_init_params.device at the end; older callers get the CPU. */
#define QT_ABI_MIN_VERSION 3

/* Most requests qt_synthesize_batch runs side by side. */
#define QT_MAX_BATCH 16

/* Width of a buffered decode chunk when qt_init_params.codec_chunk_sec <= 0, in seconds. */
#define QT_DEFAULT_CODEC_CHUNK_SEC 2.0f

#ifdef __cplusplus
extern "C" {
#endif

typedef struct qt_context qt_context;

/* Status codes: 0 is success, every error is negative. */
typedef enum qt_status {
    QT_STATUS_OK             =  0,
    QT_STATUS_INVALID_PARAMS = -1, /* NULL pointer, bad value or ABI version out of range */
    QT_STATUS_INVALID_MODE   = -2, /* a request the loaded model cannot serve */
    QT_STATUS_FAILED         = -3, /* computation failed; see qt_last_error() */
    QT_STATUS_OUT_OF_MEMORY  = -4,
    QT_STATUS_CANCELLED      = -5,
} qt_status;

typedef enum qt_log_level {
    QT_LOG_LEVEL_DEBUG = 0,
    QT_LOG_LEVEL_INFO  = 1,
    QT_LOG_LEVEL_WARN  = 2,
    QT_LOG_LEVEL_ERROR = 3,
} qt_log_level;

/* Receives one complete line (no trailing newline). May be called from any thread that
 * calls into the engine. */
typedef void (*qt_log_callback)(qt_log_level level, const char * text, void * user_data);

typedef struct qt_init_params {
    int32_t         abi_version;   /* QT_ABI_VERSION */
    const char *    model_path;    /* the engine's GGUF model (`vocable convert`) */
    int32_t         n_threads;     /* <= 0: the number of online CPU cores; at most 512 */
    const char *    dump_dir;      /* NULL or "": no dumps; else every stage writes <name>.npy there */
    qt_log_callback log_callback;  /* NULL: warnings and errors go to stderr */
    void *          log_callback_user_data;
    float           codec_chunk_sec; /* codec decode chunk width (buffered decode, and the
                                        largest streamed chunk); <= 0: QT_DEFAULT_CODEC_CHUNK_SEC.
                                        Resolved to whole frames when the model loads, 1 to
                                        8192; not finite: refused. */
    int32_t         share_cores;   /* nonzero (default): run each computation on as many of the
                                      n_threads as other processes leave cores free, measured
                                      every quarter second (Linux); 0: always n_threads */
    const char *    device;        /* where the talker, the code predictor, the codec decoder and
                                      the speaker encoder run (ABI 6): NULL or
                                      "cpu" (default), "auto" (the best GPU qt_get_device lists:
                                      discrete before integrated, then more memory; else the CPU) or a qt_device_info.id ("vulkan:0"). A device
                                      that is not found or fails to start leaves them on the CPU,
                                      with a warning in the log; qt_device_in_use says where they
                                      run. The decoder and the speaker encoder stay on the CPU
                                      where the device has no room for them; the codec encoder
                                      and the prompt's embeddings always run there. */
} qt_init_params;

/* What a loaded model is; filled by qt_get_model_info(). */
typedef struct qt_model_info {
    int32_t sample_rate;        /* of the waveform in and out: 24000 */
    int32_t samples_per_frame;  /* codec frame: 1920 samples, 80 ms */
    int32_t n_codebooks;        /* 16 */
    int32_t codebook_size;      /* 2048 */
    int32_t n_speaker_embd;     /* speaker embedding width = talker hidden size */
    int32_t talker_hidden;
    int32_t talker_layers;
    int32_t predictor_hidden;
    int32_t predictor_layers;
    int32_t weight_type;        /* ggml_type of the talker's matrices */
    int32_t codec_chunk_frames; /* qt_init_params.codec_chunk_sec resolved to frames */
    char    variant[16];        /* "0.6B", "1.7B" or the converter's size tag */
} qt_model_info;

/* The reference part of a voice: the speaker embedding and the codec codes of the clip. */
typedef struct qt_voice_ref {
    float *   speaker_embedding; /* [n_embd] */
    int32_t   n_embd;
    int32_t * codes;             /* [n_frames * n_codebooks], frame-major */
    int32_t   n_frames;
    int32_t   n_codebooks;
} qt_voice_ref;

/* How a voice is cloned. */
typedef enum qt_clone_mode {
    QT_CLONE_XVECTOR    = 0, /* from the speaker embedding alone */
    QT_CLONE_IN_CONTEXT = 1, /* speaker embedding + reference codes + reference transcript */
} qt_clone_mode;

typedef struct qt_sampling {
    float   temperature;        /* <= 0: greedy (the argmax after the penalty and suppression) */
    int32_t top_k;              /* <= 0: off */
    float   top_p;              /* >= 1: off */
    float   repetition_penalty; /* over previously generated code0 ids; 1: off (talker only) */
} qt_sampling;

/* Polled once per generated frame and, on the CPU, between the steps of every computation (so
 * a long decode stops early too; a device's computations are not interrupted), on the thread
 * that called qt_synthesize; keep it cheap. Return true to cancel (qt_synthesize then returns
 * QT_STATUS_CANCELLED). */
typedef bool (*qt_cancel_callback)(void * user_data);

/* What qt_tts_params.chunk_callback receives while generating: new frames and their audio.
 * Everything is valid during the call only. */
typedef struct qt_chunk {
    const int32_t * codes;        /* [n_frames * n_codebooks], frame-major */
    int32_t         n_frames;
    int32_t         n_codebooks;
    int32_t         first_frame;  /* index of the first of these frames in the whole result */
    const float *   pcm;          /* [n_samples] mono at the model's sample rate: these frames' audio */
    int32_t         n_samples;    /* n_frames * samples_per_frame */
    int64_t         first_sample; /* index of pcm[0] in the whole result's audio */
    bool            last;         /* the request's last chunk (ABI 5; see qt_synthesize_batch) */
} qt_chunk;

/* Streaming: called as audio is decoded during generation. The first chunk holds the first
 * frame; each next one twice as many frames as the one before, up to codec_chunk_frames; the
 * last holds what remains. Joined, the chunks equal qt_tts_result.pcm. `last` marks the final
 * chunk where the end is known when it is decoded (the frame cap; an EOS after frames still
 * pending); qt_synthesize's return marks it always. Return false to cancel (QT_STATUS_CANCELLED). */
typedef bool (*qt_chunk_callback)(const qt_chunk * chunk, void * user_data);

typedef struct qt_tts_params {
    int32_t             abi_version;        /* QT_ABI_VERSION */
    const int32_t *     text_ids;           /* "<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n" */
    int32_t             n_text_ids;
    const int32_t *     ref_text_ids;       /* "<|im_start|>assistant\n{ref_text}<|im_end|>\n" (in-context) */
    int32_t             n_ref_text_ids;
    const qt_voice_ref * voice;             /* speaker embedding; reference codes for in-context */
    qt_clone_mode       mode;
    const char *        language;           /* NULL or "auto", or a model language ("english", ...) */
    qt_sampling         talker_sampling;
    qt_sampling         predictor_sampling; /* repetition_penalty unused */
    uint64_t            seed;               /* the same seed and inputs give the same codes */
    int32_t             max_frames;         /* <= 0: qt_default_max_frames(n_text_ids) */
    qt_cancel_callback  cancel_callback;
    void *              cancel_callback_user_data;
    qt_chunk_callback   chunk_callback;     /* NULL: no streaming (the audio is decoded in
                                               codec_chunk_frames chunks as frames arrive) */
    void *              chunk_callback_user_data;
} qt_tts_params;

typedef struct qt_tts_result {
    int32_t * codes;        /* [n_frames * n_codebooks], frame-major; EOS not included */
    int32_t   n_frames;
    int32_t   n_codebooks;
    bool      reached_eos;  /* false when the frame cap stopped generation */
    float *   pcm;          /* [n_samples] mono at the model's sample rate; in-context mode
                               leaves the reference's own audio out */
    int64_t   n_samples;    /* n_frames * samples_per_frame */
} qt_tts_result;

/* Audio that the engine allocated. */
typedef struct qt_audio {
    float * pcm;        /* [n_samples] mono at the model's sample rate */
    int64_t n_samples;
} qt_audio;

/* The CPU backend this process runs on, loaded on the first call (as by qt_init): ggml's CPU
 * variant chosen for this processor (or forced by the environment variable
 * VOCABLE_CPU_VARIANT=<name>), the instruction sets it uses, the engine's own kernels beside it
 * (generic, avx2 or avx512) and every variant found, e.g. "zen4 (SSE3 SSSE3 AVX AVX2 F16C FMA
 * BMI2 AVX512 ...); kernels: avx512; variants: zen4, icelake, ..."; or why none could be loaded. The string lives as long as the library. */
QT_API const char * qt_system_info(void);

/* A device ggml can compute on. Strings are NUL-terminated and cut to fit. */
typedef struct qt_device_info {
    char     id[32];            /* "cpu", "vulkan:0": the backend and the device's index in it */
    char     description[128];  /* "AMD EPYC 7B13", "NVIDIA GeForce RTX 3060", "llvmpipe (...)" */
    char     kind[8];           /* "cpu", "gpu", "igpu" (integrated) or "accel" */
    uint64_t memory_total;      /* bytes, as the backend reports them (the CPU: system memory) */
    uint64_t memory_free;
} qt_device_info;

/* The devices found: the CPU, then those of the device backends shipped beside ggml (Vulkan;
 * CUDA and Metal where built), loaded on the first call. A backend that cannot load (no Vulkan
 * loader on this machine, say) or finds no device adds a line to qt_device_notes() and no
 * device. Mesa's software Vulkan driver (lavapipe) is listed only when selected with
 * GGML_VK_VISIBLE_DEVICES. Returns the count, or -1 when not even the CPU backend loads
 * (qt_last_error() says why). */
QT_API int32_t qt_device_count(void);
/* Device `index` (0 .. qt_device_count() - 1), its free memory as of this call. */
QT_API qt_status qt_get_device(int32_t index, qt_device_info * out);
/* Why a device backend gave no device, one line each ("" when none). Lives as long as the library. */
QT_API const char * qt_device_notes(void);

/* Library version string ("MAJOR.MINOR.PATCH") and the ABI range this build accepts. */
QT_API const char * qt_version(void);
QT_API int32_t      qt_abi_version(void);
QT_API int32_t      qt_abi_min_version(void);

/* Message of the last failed call on this thread ("" when none). Valid until the next call. */
QT_API const char * qt_last_error(void);

QT_API qt_init_params qt_init_default_params(void);

/* Loads a model. Returns NULL on failure (bad params, missing, truncated or corrupt file,
 * wrong model kind) with the reason in qt_last_error(). */
QT_API qt_context * qt_init(const qt_init_params * params);

/* Frees the context and everything it owns. NULL is a no-op. */
QT_API void qt_free(qt_context * ctx);

/* Returns QT_STATUS_OK, or QT_STATUS_INVALID_PARAMS on NULL arguments. */
QT_API qt_status qt_get_model_info(const qt_context * ctx, qt_model_info * out);

/* Where the context's talker and code predictor run (and the stages listed at
 * qt_init_params.device): "cpu" or a qt_device_info.id; and, when the
 * device asked for is not in use, why ("" otherwise). Both live as long as the context. */
QT_API const char * qt_device_in_use(const qt_context * ctx);
QT_API const char * qt_device_fallback(const qt_context * ctx);

/* The context keeps its last few talker prefills: a request whose prompt equals one of them
 * (same voice, language and text, any seed) restores it instead of computing it, with the same
 * output; and the codec decoder's state primed with its last few in-context references (same
 * voice, any text), likewise. This forgets both (to time a new prompt, or to free their memory,
 * at most 64 and 32 MiB: a larger prompt is not kept). Ignored while a call runs on the
 * context. NULL is a no-op. */
QT_API void qt_forget_prompts(qt_context * ctx);

/* Shortest and longest reference clip the engine accepts, in samples at 24 kHz. */
QT_API int32_t qt_voice_ref_min_samples(void);
QT_API int32_t qt_voice_ref_max_samples(void);

/* Computes the speaker embedding and the 16-codebook reference codes of a mono 24 kHz clip.
 * On success `out` owns heap memory: release it with qt_voice_ref_free().
 * Returns QT_STATUS_OK; QT_STATUS_INVALID_PARAMS for NULL arguments, a clip outside
 * [qt_voice_ref_min_samples(), qt_voice_ref_max_samples()] or non-finite samples;
 * QT_STATUS_OUT_OF_MEMORY or QT_STATUS_FAILED otherwise. On error `out` is zeroed. */
QT_API qt_status qt_extract_voice_ref(qt_context * ctx, const float * pcm_24k, int32_t n_samples,
                                      qt_voice_ref * out);

/* Releases what qt_extract_voice_ref() allocated and zeroes the struct. NULL is a no-op. */
QT_API void qt_voice_ref_free(qt_voice_ref * ref);

/* Defaults: the model card's sampling (talker and predictor temperature 0.9, top-k 50, top-p
 * 1.0, repetition penalty 1.05), x-vector mode, language "auto", seed 0, derived frame cap. */
QT_API qt_tts_params qt_tts_default_params(void);

/* The frame cap when qt_tts_params.max_frames <= 0. The model can run on without emitting EOS,
 * so generation stops after 3 s plus 1 s per text token (12.5 frames per second, at most 8192
 * frames): about three times what speech at a normal rate needs. */
QT_API int32_t qt_default_max_frames(int32_t n_text_ids);

/* Generates the codec codes of the text in the voice, frame by frame, until EOS or the frame
 * cap, and decodes them to audio as they come (streamed to chunk_callback when set). In-context
 * mode primes the decoder with the reference codes so the audio continues the reference.
 * Returns QT_STATUS_OK with `out` owning codes and audio (free with qt_tts_result_free);
 * QT_STATUS_INVALID_PARAMS for NULL or inconsistent arguments (ABI version, ids, language,
 * voice width); QT_STATUS_INVALID_MODE for in-context mode without transcript or codes;
 * QT_STATUS_CANCELLED when the cancel callback asked for it (nothing is kept; the context stays
 * usable); QT_STATUS_OUT_OF_MEMORY or QT_STATUS_FAILED otherwise. On error `out` is zeroed. */
QT_API qt_status qt_synthesize(qt_context * ctx, const qt_tts_params * params, qt_tts_result * out);

/* Several requests (the segments of a long text, say) generated side by side, up to max_batch
 * (1 to QT_MAX_BATCH) at a time: each frame step runs the talker and the code predictor once for
 * all of them, so they share every weight read, and when one ends the next one starts in its
 * place, in order. Each request's codes and audio equal what qt_synthesize() gives for the same
 * params, bit for bit; only the time differs. Each request streams to its own chunk_callback
 * (chunks of different requests interleave) and always ends with a chunk that has `last` set,
 * which holds no frames where none remained; a chunk callback that returns false ends its own
 * request there (its result keeps the frames up to that chunk, reached_eos false), while any
 * request's cancel_callback cancels the whole call. Returns QT_STATUS_OK with out[0 ..
 * n_requests) filled (free each with qt_tts_result_free); on error every out[i] is zeroed and
 * qt_last_error() names the request at fault. */
QT_API qt_status qt_synthesize_batch(qt_context * ctx, const qt_tts_params * params, int32_t n_requests,
                                     int32_t max_batch, qt_tts_result * out);

/* Releases what qt_synthesize() allocated and zeroes the struct. NULL is a no-op. */
QT_API void qt_tts_result_free(qt_tts_result * result);

/* Decodes codec codes ([n_frames * n_codebooks], frame-major; negative codes count as 0) to
 * n_frames * samples_per_frame samples. The codec decoder is causal and carries its state from
 * one chunk to the next (the transformer's keys and values over its sliding window, each causal
 * convolution's last inputs), so decoding in chunks of `chunk_frames` (<= 0: the context's
 * codec_chunk_frames) gives the same audio as one pass over all frames; the chunk width only
 * bounds memory. On success `out` owns the audio (free with qt_audio_free).
 * Returns QT_STATUS_INVALID_PARAMS for NULL arguments, n_frames < 1, the wrong number of
 * codebooks or a code >= codebook_size; QT_STATUS_OUT_OF_MEMORY or QT_STATUS_FAILED otherwise. */
QT_API qt_status qt_decode(qt_context * ctx, const int32_t * codes, int32_t n_frames, int32_t n_codebooks,
                           int32_t chunk_frames, qt_audio * out);

/* Releases what qt_decode() allocated and zeroes the struct. NULL is a no-op. */
QT_API void qt_audio_free(qt_audio * audio);

#ifdef __cplusplus
}
#endif

#endif /* QWEN3_TTS_H */
