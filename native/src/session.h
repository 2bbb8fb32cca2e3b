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
};

struct synthesis_result {
    std::vector<int32_t> codes;  // [n_frames][n_codebooks]
    int64_t              n_frames = 0;
    int                  n_codebooks = 0;
    bool                 reached_eos = false;
};

struct synthesis_models {
    const talker &         talker_model;
    const prompt_builder & prompts;
    const code_predictor & predictor;
};

// Throws qt::error (QT_STATUS_CANCELLED when `cancelled` said so). Dumps the prompt, the
// talker's prefill stages, the first frame's code predictor stages and "codes".
synthesis_result synthesize(const cpu_backend & backend, const stage_dumper & dumper, const synthesis_models & models,
                            const synthesis_request & req);

} // namespace qt
