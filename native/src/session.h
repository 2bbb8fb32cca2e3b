// One synthesis request, frame by frame: prompt -> talker prefill -> per frame, code0 from the
// talker's logits (host sampler), codes 1..15 from the code predictor, and the next talker
// input (the frame's codec-side vector plus the next trailing text vector, or the text pad).
#pragma once

#include "code-predictor.h"
#include "graph.h"
#include "prompt.h"
#include "sampler.h"
#include "talker.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace qt {

struct synthesis_request {
    prompt_request        prompt;
    talker_sampling       talker;
    cp_sampling           predictor;
    int64_t               max_frames = 0;
    std::function<bool()> cancelled;  // polled once per frame
    // Receives each new frame's codes (n_codebooks values) and its index; false cancels.
    std::function<bool(const int32_t * codes, int64_t frame)> on_frame;
};

struct synthesis_result {
    std::vector<int32_t> codes;  // [n_frames][n_codebooks]
    int64_t              n_frames = 0;
    int                  n_codebooks = 0;
    bool                 reached_eos = false;
};

// The loaded components, and the code predictor's frame graph, which the context builds once
// and reuses for every request (its sampling parameters are graph inputs).
struct synthesis_models {
    const talker &         talker_model;
    const prompt_builder & prompts;
    code_predictor_state & predictor;
};

// Throws qt::error (QT_STATUS_CANCELLED when `cancelled` or `on_frame` said so). Dumps the prompt, the
// talker's prefill stages, the first frame's code predictor stages and "codes".
synthesis_result synthesize(const cpu_backend & backend, const stage_dumper & dumper, const synthesis_models & models,
                            const synthesis_request & req);

} // namespace qt
