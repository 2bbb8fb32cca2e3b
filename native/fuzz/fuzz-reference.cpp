// Fuzzes the reference path (qt_extract_voice_ref: mel frontend, speaker encoder, codec
// encoder) with any samples: lengths from nothing to past the limit, silence, full scale,
// NaN and infinities, denormals. A clean voice or a clean error, nothing else.
#include "fuzz-common.h"

#include <cmath>
#include <limits>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    qt_context *       ctx = fuzz::shared_context();
    fuzz::input_reader in(data, size);
    const uint8_t      shape = in.take<uint8_t>();
    // mostly short clips (the encoders are slow on long ones), sometimes around the limits
    int32_t n = int32_t(in.take<uint16_t>()) * 4;
    if (shape % 16 == 0) {
        n = qt_voice_ref_min_samples() - 1 + int32_t(shape % 3);
    } else if (shape % 16 == 1) {
        n = qt_voice_ref_max_samples() + 1;
    }
    std::vector<float> pcm(static_cast<size_t>(n > 0 ? n : 0));
    for (size_t i = 0; i < pcm.size(); ++i) {
        const int16_t v = in.left() ? in.take<int16_t>() : int16_t(i * 2654435761u >> 16);
        pcm[i] = float(v) / 32768.0f;
    }
    if (!pcm.empty()) {
        static const float specials[] = { std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                                          -std::numeric_limits<float>::infinity(), 1e30f, 1e-42f };
        if (shape & 0x20) {
            pcm[pcm.size() / 3] = specials[(shape >> 6) % 5];
        }
    }
    qt_voice_ref ref{};
    if (qt_extract_voice_ref(ctx, pcm.empty() ? nullptr : pcm.data(), n, &ref) == QT_STATUS_OK) {
        qt_voice_ref_free(&ref);
    }
    return 0;
}
