#include "codec-encoder.h"

#include "log.h"

namespace qt {

void codec_encoder::load(model_loader & ml) {
    throw error(QT_STATUS_FAILED, "codec encoder: work in progress");
}

std::vector<int32_t> codec_encoder::encode(const cpu_backend &, const stage_dumper &, const float *, int64_t,
                                           int64_t *) const {
    throw error(QT_STATUS_FAILED, "codec encoder: work in progress");
}

} // namespace qt
