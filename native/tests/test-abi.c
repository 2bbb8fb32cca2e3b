/* C99 probe of the public header: compiles with -Wall -Werror -pedantic, loads no model,
 * and checks the defaults, NULL handling and the closed ABI range. */
#include "qwen3-tts.h"

#include <stdio.h>
#include <string.h>

static int failures = 0;

#define CHECK(cond)                                                        \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            ++failures;                                                    \
        }                                                                  \
    } while (0)

static void check_abi_rejected(int32_t version) {
    char expected_range[64];
    qt_init_params p = qt_init_default_params();
    p.abi_version = version;
    p.model_path = "does-not-matter.gguf";
    CHECK(qt_init(&p) == NULL);
    /* the message names the supported range */
    snprintf(expected_range, sizeof(expected_range), "%d to %d", QT_ABI_MIN_VERSION, QT_ABI_VERSION);
    CHECK(strstr(qt_last_error(), expected_range) != NULL);
    CHECK(strstr(qt_last_error(), "abi_version") != NULL);
}

static void check_tts_abi_rejected(int32_t version) {
    char expected_range[64];
    qt_tts_params p = qt_tts_default_params();
    qt_tts_result res;
    p.abi_version = version;
    /* a context is needed to reach the check; the range is checked before anything else of
     * the params, so a fake non-NULL context must never be touched */
    CHECK(qt_synthesize((qt_context *) &p, &p, &res) == QT_STATUS_INVALID_PARAMS);
    snprintf(expected_range, sizeof(expected_range), "%d to %d", QT_ABI_MIN_VERSION, QT_ABI_VERSION);
    CHECK(strstr(qt_last_error(), expected_range) != NULL);
    CHECK(strstr(qt_last_error(), "qt_tts_params.abi_version") != NULL);
    CHECK(res.codes == NULL && res.n_frames == 0);
}

int main(void) {
    qt_init_params p = qt_init_default_params();
    qt_tts_params tp = qt_tts_default_params();
    qt_tts_result res;
    qt_voice_ref ref;
    qt_model_info info;

    /* defaults */
    CHECK(p.abi_version == QT_ABI_VERSION);
    CHECK(p.model_path == NULL);
    CHECK(p.n_threads == 0);
    CHECK(p.dump_dir == NULL);
    CHECK(p.log_callback == NULL);
    CHECK(p.log_callback_user_data == NULL);
    CHECK(p.share_cores == 1);
    CHECK(QT_ABI_MIN_VERSION <= QT_ABI_VERSION);
    CHECK(qt_abi_version() == QT_ABI_VERSION);
    CHECK(qt_abi_min_version() == QT_ABI_MIN_VERSION);
    CHECK(qt_version() != NULL && strlen(qt_version()) > 0);
    CHECK(qt_voice_ref_min_samples() == 24000);
    CHECK(qt_voice_ref_max_samples() == 60 * 24000);

    /* the ABI range is closed on both ends */
    check_abi_rejected(QT_ABI_MIN_VERSION - 1);
    check_abi_rejected(QT_ABI_VERSION + 1);

    /* inside the range, the next check (the model path) is reached */
    p.model_path = NULL;
    CHECK(qt_init(&p) == NULL);
    CHECK(strstr(qt_last_error(), "model path") != NULL);
    p.model_path = "/nonexistent/model.gguf";
    CHECK(qt_init(&p) == NULL);
    CHECK(strstr(qt_last_error(), "/nonexistent/model.gguf") != NULL);

    /* NULL handling */
    CHECK(qt_init(NULL) == NULL);
    CHECK(strlen(qt_last_error()) > 0);
    qt_free(NULL);
    qt_voice_ref_free(NULL);
    memset(&ref, 0x7f, sizeof(ref));
    CHECK(qt_extract_voice_ref(NULL, NULL, 0, &ref) == QT_STATUS_INVALID_PARAMS);
    CHECK(ref.speaker_embedding == NULL && ref.codes == NULL && ref.n_frames == 0);
    CHECK(qt_get_model_info(NULL, &info) == QT_STATUS_INVALID_PARAMS);

    /* synthesis defaults: the model card's sampling, x-vector mode, auto language, derived cap */
    CHECK(tp.abi_version == QT_ABI_VERSION);
    CHECK(tp.text_ids == NULL && tp.n_text_ids == 0 && tp.ref_text_ids == NULL && tp.n_ref_text_ids == 0);
    CHECK(tp.voice == NULL && tp.mode == QT_CLONE_XVECTOR && tp.language == NULL);
    CHECK(tp.talker_sampling.temperature == 0.9f && tp.talker_sampling.top_k == 50);
    CHECK(tp.talker_sampling.top_p == 1.0f && tp.talker_sampling.repetition_penalty == 1.05f);
    CHECK(tp.predictor_sampling.temperature == 0.9f && tp.predictor_sampling.top_k == 50);
    CHECK(tp.predictor_sampling.top_p == 1.0f && tp.predictor_sampling.repetition_penalty == 1.0f);
    CHECK(tp.seed == 0 && tp.max_frames == 0);
    CHECK(tp.cancel_callback == NULL && tp.cancel_callback_user_data == NULL);
    CHECK(tp.chunk_callback == NULL && tp.chunk_callback_user_data == NULL);
    CHECK(qt_default_max_frames(0) == 37);
    CHECK(qt_default_max_frames(10) == 162);
    CHECK(qt_default_max_frames(100000) == 8192);
    check_tts_abi_rejected(QT_ABI_MIN_VERSION - 1);
    check_tts_abi_rejected(QT_ABI_VERSION + 1);
    CHECK(qt_synthesize(NULL, &tp, &res) == QT_STATUS_INVALID_PARAMS);
    CHECK(res.codes == NULL);
    qt_tts_result_free(NULL);

    /* status codes: success is zero, errors negative and distinct */
    CHECK(QT_STATUS_OK == 0);
    CHECK(QT_STATUS_INVALID_PARAMS < 0 && QT_STATUS_INVALID_MODE < 0 && QT_STATUS_FAILED < 0 &&
          QT_STATUS_OUT_OF_MEMORY < 0 && QT_STATUS_CANCELLED < 0);

    if (failures) {
        fprintf(stderr, "test-abi: %d check(s) failed\n", failures);
        return 1;
    }
    printf("test-abi: all checks passed\n");
    return 0;
}
