// The prompt of a clone request, as Qwen3TTSForConditionalGeneration.generate builds it: the
// talker's prefill embeddings (each position a text-side vector plus a codec-side vector), the
// trailing text vectors fed one per generated frame, and the text pad vector fed after them.
//
//   prefill = T(role) ++ (T(pad) x (n_codec - 2) ++ T(bos)) + codec[:-1] ++ tail
//   codec   = C(think, think_bos, language, think_eos) | C(nothink, think_bos, think_eos)
//             ++ speaker embedding ++ C(pad, bos)
//   x-vector tail: T(text[0]) + C(bos);       trailing: T(text[1:]) ++ T(tts_eos)
//   in-context tail: (T(ref_text ++ text) ++ T(tts_eos)) and (C(bos) ++ sum_q E_q(ref codes))
//             summed over the shorter length; the text surplus is the trailing text
// T(ids) = text_proj2(SiLU(text_proj1(text_embd[ids]))), C = the talker's codec embedding,
// E_0 = C and E_q = the code predictor's codec embedding q - 1.
#pragma once

#include "graph.h"
#include "model-loader.h"
#include "talker.h"

#include <cstdint>
#include <vector>

namespace qt {

struct prompt_request {
    const int32_t * text_ids = nullptr;  // ids of "<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"
    int64_t         n_text_ids = 0;
    const int32_t * ref_ids = nullptr;   // ids of "<|im_start|>assistant\n{ref_text}<|im_end|>\n" (in-context)
    int64_t         n_ref_ids = 0;
    const float *   speaker = nullptr;   // speaker embedding [hidden]
    const int32_t * ref_codes = nullptr; // reference codes [n_ref_frames][n_codebooks] (in-context)
    int64_t         n_ref_frames = 0;
    int32_t         language_id = -1;    // a codec language id, or < 0 for "auto"
    bool            in_context = false;
};

struct prompt {
    int64_t            hidden = 0;
    std::vector<float> prefill;   // [n_prefill][hidden]
    int64_t            n_prefill = 0;
    std::vector<float> trailing;  // [n_trailing][hidden]
    int64_t            n_trailing = 0;
    std::vector<float> tts_pad;   // [hidden]
};

class prompt_builder {
public:
    // Reads the special ids and the code predictor's codec embeddings (E_1..E_15).
    void load(model_loader & loader, const talker & model);

    // Validates the request (ids, lengths, language, codes) and builds its prompt. Throws
    // qt::error (QT_STATUS_INVALID_PARAMS or QT_STATUS_INVALID_MODE). Dumps "prefill_embeds",
    // "trailing_text" and "tts_pad_embed".
    prompt build(const cpu_backend & backend, const stage_dumper & dumper, const prompt_request & req) const;

    // Codec-side vectors of whole frames: sum over the codebooks q of E_q(codes[frame][q]).
    // codes: [n_frames][n_codebooks]; returns [n_frames][hidden].
    std::vector<float> frame_embed(const cpu_backend & backend, const int32_t * codes, int64_t n_frames) const;

    const std::vector<int32_t> & language_ids() const { return language_ids_; }
    int n_codebooks() const { return int(cp_codec_embd_.size()) + 1; }

private:
    const talker *             talker_ = nullptr;
    std::vector<table_rows>    cp_codec_embd_;  // E_1..E_15: (hidden, codebook_size)
    std::vector<int32_t>       language_ids_;
    int32_t codec_pad_ = 0, codec_bos_ = 0, think_ = 0, nothink_ = 0, think_bos_ = 0, think_eos_ = 0;
    int32_t tts_pad_ = 0, tts_bos_ = 0, tts_eos_ = 0;
};

} // namespace qt
