// Fuzzes model loading (qt_init): the GGUF parser, the checksums, the tensor types and shapes,
// and every hyperparameter check of every component. The input is a GGUF header (metadata and
// tensor table); the tensor data of $VOCABLE_FUZZ_MODEL follows it, so an unchanged header is
// that model and loads, and a changed value reaches the checks past the checksums. A model that
// loads then speaks two frames: values that each pass but disagree (the codebooks the talker
// writes and the decoder reads) fail only there. Any outcome but a clean load or a clean error
// (a crash, an abort, a sanitizer report) is a bug.
#include "fuzz-common.h"

#include <fstream>
#include <iterator>
#include <vector>

namespace {

// The model's tensor data: everything after its header (tools/fuzz.sh writes that header as
// the seed, `header` bytes long, into $VOCABLE_FUZZ_MODEL_HEADER_BYTES).
const std::vector<uint8_t> & model_data() {
    static const std::vector<uint8_t> data = [] {
        std::ifstream in(fuzz::model_path(), std::ios::binary);
        std::vector<uint8_t> all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        const char * header = std::getenv("VOCABLE_FUZZ_MODEL_HEADER_BYTES");
        const size_t skip = header ? size_t(std::strtoull(header, nullptr, 10)) : 0;
        if (skip == 0 || skip > all.size()) {
            fprintf(stderr, "set VOCABLE_FUZZ_MODEL_HEADER_BYTES to the model's header size (tools/fuzz.sh does)\n");
            std::exit(2);
        }
        return std::vector<uint8_t>(all.begin() + long(skip), all.end());
    }();
    return data;
}

// Two greedy frames in x-vector mode from a silent voice, decoded.
void speak_briefly(qt_context * ctx) {
    qt_model_info info{};
    qt_get_model_info(ctx, &info);
    std::vector<float> embedding(size_t(info.n_speaker_embd), 0.0f);
    qt_voice_ref       voice{};
    voice.speaker_embedding = embedding.data();
    voice.n_embd = info.n_speaker_embd;
    const int32_t text[] = { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9 };  // role, text, end marks: any ids the vocabulary has
    qt_tts_params p = qt_tts_default_params();
    p.text_ids = text;
    p.n_text_ids = int32_t(sizeof(text) / sizeof(text[0]));
    p.voice = &voice;
    p.talker_sampling.temperature = 0.0f;
    p.predictor_sampling.temperature = 0.0f;
    p.max_frames = 2;
    qt_tts_result result{};
    if (qt_synthesize(ctx, &p, &result) == QT_STATUS_OK) {
        qt_tts_result_free(&result);
    }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    static fuzz::memory_file file;
    const std::vector<uint8_t> & tensors = model_data();
    qt_init_params p = qt_init_default_params();
    p.model_path = file.write_all(data, size, tensors.data(), tensors.size());
    p.n_threads = 1;
    p.share_cores = 0;
    p.log_callback = fuzz::quiet_log;
    if (qt_context * ctx = qt_init(&p)) {
        speak_briefly(ctx);
        qt_free(ctx);
    }
    return 0;
}
