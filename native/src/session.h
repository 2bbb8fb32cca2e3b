// One synthesis request, frame by frame: prompt -> talker prefill -> per frame, code0 from the
// talker's logits (host sampler), codes 1..15 from the code predictor, and the next talker
// input (the frame's codec-side vector plus the next trailing text vector, or the text pad).
// The codec decoder turns frames into audio as they come, in chunks.
#pragma once

#include "code-predictor.h"
#include "codec-decoder.h"
#include "graph.h"
#include "prompt.h"
#include "sampler.h"
#include "talker.h"

#include <cstdint>
#include <functional>
#include <list>
#include <vector>

namespace qt {

struct synthesis_request {
    prompt_request        prompt;
    talker_sampling       talker;
    cp_sampling           predictor;
    int64_t               max_frames = 0;
    // Polled once per frame and between the nodes of every graph.
    std::function<bool()> cancelled;
    // Widest decode chunk. With on_chunk (streaming) chunks grow 1, 2, 4, ... frames up to it;
    // without, every chunk but the last has this width.
    int64_t               chunk_frames = 1;
    // Receives each decoded chunk: its frames' codes and audio; false cancels (synthesize) or
    // ends this request where it is (synthesize_batch).
    // `last`: the request's final chunk (synthesize_batch ends every request with one, empty
    // where no frames remained; synthesize only marks a final chunk that holds frames).
    std::function<bool(const int32_t * codes, int64_t n_frames, int64_t first_frame, const float * pcm,
                       int64_t n_samples, int64_t first_sample, bool last)> on_chunk;
    // In-context mode: the reference codes the audio continues (the decoder is primed with them).
    const int32_t *       prime_codes = nullptr;
    int64_t               n_prime_frames = 0;
};

struct synthesis_result {
    std::vector<int32_t> codes;  // [n_frames][n_codebooks]
    int64_t              n_frames = 0;
    std::vector<float>   pcm;    // n_frames * frame_samples samples
    int                  n_codebooks = 0;
    bool                 reached_eos = false;
    bool                 stopped = false;  // on_chunk ended it (synthesize_batch)
};

// The talker's recent prefills, the most recently computed first. A request whose prompt is one
// of them (the same voice, language and text, whatever the seed or sampling) restores its cache
// rows and output instead of computing them: "generate again" and the runaway watchdog's retry
// cost no prefill. The prompts are compared by their embeddings, bit for bit. Only whole
// prompts are reused: a shared prefix with the rest computed on top would round differently
// from one prefill over all positions with quantized weights (measured at q8_0: other codes from
// the second frame), and the same request must give the same audio. Bounded in entries and
// bytes (an in-context voice's prefill holds ~0.2 MiB per reference frame at the 0.6B size).
class prefill_cache {
public:
    // The entry whose prompt is exactly `embeds` (n positions of `hidden` floats), or null.
    const talker_prefix * find(const float * embeds, int64_t n, int64_t hidden) const;
    void                  put(talker_prefix && prefix);
    void                  clear() { entries_.clear(); }

    static constexpr size_t k_max_entries = 8;
    static constexpr size_t k_max_bytes = size_t(64) << 20;

private:
    std::list<talker_prefix> entries_;
};

// The codec decoder's state after the reference codes of recent in-context requests, the most
// recent first: a request with the same reference (the same voice, whatever the text) starts
// from a copy instead of priming the decoder again, which takes ~0.2 s for a 10 s reference at
// the 0.6B size. A copy is the primed state bit for bit, so the audio is the same either way.
// Keyed by the decoder too: the CPU's and a device's differ in their last bits.
class primed_stream_cache {
public:
    const codec_stream * find(const codec_decoder & decoder, const int32_t * codes, int64_t n_codes) const;
    void                 put(const codec_decoder & decoder, const int32_t * codes, int64_t n_codes,
                             const codec_stream & stream);
    void                 clear() { entries_.clear(); }

    static constexpr size_t k_max_entries = 4;
    static constexpr size_t k_max_bytes = size_t(32) << 20;

private:
    struct entry {
        const codec_decoder * decoder;
        std::vector<int32_t>  codes;
        codec_stream          stream;

        bool   holds(const codec_decoder & d, const int32_t * c, int64_t n) const;
        size_t bytes() const { return stream.bytes() + codes.size() * sizeof(int32_t); }
    };
    std::list<entry> entries_;
};

// The loaded components, and the code predictor's frame graphs, which the context builds once
// and reuses for every request (its sampling parameters are graph inputs); for a batch its
// max_batch() bounds how many requests run side by side.
struct synthesis_models {
    const talker &         talker_model;
    const prompt_builder & prompts;
    code_predictor_state & predictor;
    const codec_decoder &  decoder;
    prefill_cache *        prefills = nullptr;  // none: every prefill is computed
    primed_stream_cache *  primed = nullptr;    // none: every in-context request primes the decoder
    // Where talker_model and predictor run (a device, with their weights there); null: the CPU
    // backend every other stage runs on.
    const compute_backend * generation = nullptr;
    // Where decoder runs (a device it was loaded for); null: the CPU backend.
    const compute_backend * decoding = nullptr;
};

// Throws qt::error (QT_STATUS_CANCELLED when `cancelled` or `on_chunk` said so). Dumps the prompt, the
// talker's prefill stages, the first frame's code predictor stages, "codes" and the first decode
// chunk's stages.
synthesis_result synthesize(const cpu_backend & backend, const stage_dumper & dumper, const synthesis_models & models,
                            const synthesis_request & req);

// Several requests, up to `max_batch` (at most models.predictor.max_batch()) generating side by
// side: each frame step runs the talker and the code predictor once for all of them, sharing
// every weight read, and a request that ends makes room for the next one, in order. Each
// request's codes and audio are exactly what synthesize() gives it alone (its own seed,
// sampling, frame cap and decode chunks); only the time differs. An on_chunk that returns false
// ends its own request there (stopped); `cancelled` of any request cancels them all. Throws
// qt::error.
std::vector<synthesis_result> synthesize_batch(const cpu_backend & backend, const synthesis_models & models,
                                               const std::vector<synthesis_request> & requests, int max_batch);

} // namespace qt
