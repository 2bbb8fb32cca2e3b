// Fuzzes a synthesis request as a foreign caller or a damaged voice file would make it: the
// voice (embedding values and width, reference codes, their frames and codebooks), the text and
// reference-text ids, the clone mode, the language, the sampling settings (sometimes not
// numbers) and the frame cap, all taken from the input; sometimes as one request of a batch
// (qt_synthesize_batch) beside a well-formed copy with another seed and frame cap, at a width
// from the input. The engine must answer with a result or a clean error.
#include "fuzz-common.h"

#include <cstring>
#include <limits>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    qt_context *        ctx = fuzz::shared_context();
    fuzz::input_reader  in(data, size);
    qt_model_info       info{};
    qt_get_model_info(ctx, &info);

    // widths near the model's, and sometimes far off
    const int32_t n_embd = info.n_speaker_embd + int8_t(in.take<uint8_t>() % 5 == 0 ? in.take<int8_t>() : 0);
    const int32_t n_frames = in.take<uint8_t>() % 12;
    const int32_t n_codebooks = in.take<uint8_t>() % 3 == 0 ? int32_t(in.take<uint8_t>() % 20) : info.n_codebooks;
    const int32_t n_text = in.take<uint8_t>() % 16;
    const int32_t n_ref_text = in.take<uint8_t>() % 16;
    const uint8_t flags = in.take<uint8_t>();

    std::vector<float> embedding(static_cast<size_t>(n_embd > 0 ? n_embd : 0));
    for (float & v : embedding) {
        v = float(in.take<int16_t>()) / 1024.0f;
    }
    if ((flags & 1) && !embedding.empty()) {
        embedding[embedding.size() / 2] = std::numeric_limits<float>::quiet_NaN();
    }
    std::vector<int32_t> codes(static_cast<size_t>(n_frames * n_codebooks));
    for (int32_t & c : codes) {
        c = (flags & 2) ? in.take<int32_t>() : int32_t(in.take<uint16_t>() % 4096);
    }
    std::vector<int32_t> text(static_cast<size_t>(n_text)), ref_text(static_cast<size_t>(n_ref_text));
    for (auto * ids : { &text, &ref_text }) {
        for (int32_t & id : *ids) {
            id = (flags & 4) ? in.take<int32_t>() : int32_t(in.take<uint16_t>());
        }
    }

    qt_voice_ref voice{};
    voice.speaker_embedding = embedding.empty() ? nullptr : embedding.data();
    voice.n_embd = n_embd;
    voice.codes = codes.empty() ? nullptr : codes.data();
    voice.n_frames = n_frames;
    voice.n_codebooks = n_codebooks;

    static const char * const languages[] = { nullptr, "auto", "english", "chinese", "klingon", "" };
    qt_tts_params p = qt_tts_default_params();
    p.text_ids = text.empty() ? nullptr : text.data();
    p.n_text_ids = n_text;
    p.ref_text_ids = ref_text.empty() ? nullptr : ref_text.data();
    p.n_ref_text_ids = n_ref_text;
    p.voice = &voice;
    const int32_t mode = in.take<uint8_t>() % 3;  // 2 is no mode: stored as a C caller would
    memcpy(&p.mode, &mode, sizeof(mode));
    p.language = languages[in.take<uint8_t>() % 6];
    p.talker_sampling.temperature = float(in.take<int8_t>()) / 32.0f;
    p.talker_sampling.top_k = in.take<int8_t>();
    p.talker_sampling.top_p = float(in.take<int8_t>()) / 64.0f;
    p.talker_sampling.repetition_penalty = float(in.take<int8_t>()) / 32.0f;
    p.predictor_sampling.temperature = float(in.take<int8_t>()) / 32.0f;
    p.predictor_sampling.top_k = in.take<int8_t>();
    p.predictor_sampling.top_p = float(in.take<int8_t>()) / 64.0f;
    if (flags & 8) {  // values a foreign caller may pass: not numbers, or too small for a float's 1 / x
        p.talker_sampling.temperature = (flags & 16) ? std::numeric_limits<float>::quiet_NaN()
                                                     : std::numeric_limits<float>::denorm_min();
        p.predictor_sampling.top_p = (flags & 32) ? std::numeric_limits<float>::infinity() : p.predictor_sampling.top_p;
    }
    p.seed = in.take<uint64_t>();
    p.max_frames = int32_t(in.take<int8_t>()) % 4;
    if (flags & 8) {  // greedy, as a too small temperature is, finds no end on the tiny model: a few frames
        p.max_frames = 3;
    }

    const uint8_t batch = in.take<uint8_t>();
    if (batch % 4 != 0) {
        qt_tts_result result{};
        if (qt_synthesize(ctx, &p, &result) == QT_STATUS_OK) {
            qt_tts_result_free(&result);
        }
        return 0;
    }
    std::vector<qt_tts_params> params = { p, p, p };
    params[1].seed = p.seed + 1;
    params[2].max_frames = 2;
    const int32_t width = int32_t(batch / 4) % (QT_MAX_BATCH + 2);  // 0 and QT_MAX_BATCH + 1 are refused
    qt_tts_result results[3] = {};
    if (qt_synthesize_batch(ctx, params.data(), 3, width, results) == QT_STATUS_OK) {
        for (qt_tts_result & r : results) {
            qt_tts_result_free(&r);
        }
    }
    return 0;
}
