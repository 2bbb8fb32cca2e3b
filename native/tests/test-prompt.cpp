// Parity of the prompt builder with the reference's talker inputs, on a converted tiny model:
// both clone modes' prefill embeddings, trailing text and text pad vector, plus the errors.
//
//   test-prompt FIXTURE_REFERENCE_DIR MODEL.gguf
#include "prompt.h"
#include "test-check.h"
#include "test-util.h"

#include "gguf-names.h"
#include "log.h"
#include "model-loader.h"
#include "talker.h"

#include <cstdio>

namespace {

void compare(const char * what, const std::vector<float> & ours, const test::npy_array & ref) {
    const double c = test::cosine(ours, ref.f32);
    test::check(ours.size() == ref.f32.size() && c >= 0.9999, "%s: %zu vs %zu values, cosine %.7f, max abs diff %.3g",
                what, ours.size(), ref.f32.size(), c, test::max_abs_diff(ours, ref.f32));
}

} // namespace

int main(int argc, char ** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: test-prompt FIXTURE_REFERENCE_DIR MODEL.gguf\n");
        return 2;
    }
    const std::string ref = argv[1];
    return test::run_or_fail([&] {
        qt::cpu_backend backend(2);
        qt::model_loader ml(argv[2], backend.get());
        qt::talker model;
        model.load(ml);
        qt::prompt_builder builder;
        builder.load(ml, model);
        const int32_t english = 2050;

        const test::npy_array ids = test::npy_read(ref + "/input_ids.npy");
        const test::npy_array ref_ids = test::npy_read(ref + "/ref_ids.npy");
        const test::npy_array spk = test::npy_read(ref + "/speaker_embedding.npy");
        const test::npy_array codes = test::npy_read(ref + "/ref_codes.npy");
        qt::stage_dumper no_dump;

        for (const bool icl : { false, true }) {
            const std::string mode = icl ? "icl" : "xvec";
            qt::prompt_request req;
            req.text_ids = ids.i32.data();
            req.n_text_ids = int64_t(ids.i32.size());
            req.speaker = spk.f32.data();
            req.language_id = english;
            req.in_context = icl;
            if (icl) {
                req.ref_ids = ref_ids.i32.data();
                req.n_ref_ids = int64_t(ref_ids.i32.size());
                req.ref_codes = codes.i32.data();
                req.n_ref_frames = codes.rows();
            }
            const qt::prompt p = builder.build(backend, no_dump, req);
            compare((mode + " prefill embeddings").c_str(), p.prefill, test::npy_read(ref + "/" + mode + "_prefill_embeds.npy"));
            compare((mode + " trailing text").c_str(), p.trailing, test::npy_read(ref + "/" + mode + "_trailing_text.npy"));
            compare((mode + " text pad").c_str(), p.tts_pad, test::npy_read(ref + "/" + mode + "_tts_pad_embed.npy"));
        }

        // "auto" drops the language tag: one position fewer
        qt::prompt_request req;
        req.text_ids = ids.i32.data();
        req.n_text_ids = int64_t(ids.i32.size());
        req.speaker = spk.f32.data();
        req.language_id = english;
        const int64_t with_language = builder.build(backend, no_dump, req).n_prefill;
        req.language_id = -1;
        test::check(builder.build(backend, no_dump, req).n_prefill == with_language - 1,
                    "auto language: no language tag");

        auto rejects = [&](qt::prompt_request r, qt_status status, const char * what) {
            try {
                builder.build(backend, no_dump, r);
                test::check(false, "%s", what);
            } catch (const qt::error & e) {
                test::check(e.status == status, "%s (%s)", what, e.what());
            }
        };
        qt::prompt_request bad = req;
        bad.n_text_ids = 8;  // role and end only
        rejects(bad, QT_STATUS_INVALID_PARAMS, "empty text is rejected");
        bad = req;
        bad.language_id = 7;
        rejects(bad, QT_STATUS_INVALID_PARAMS, "unknown language is rejected");
        bad = req;
        bad.in_context = true;
        rejects(bad, QT_STATUS_INVALID_MODE, "in-context without transcript and codes is rejected");
        bad = req;
        std::vector<int32_t> big(ids.i32);
        big[4] = 1 << 30;
        bad.text_ids = big.data();
        rejects(bad, QT_STATUS_INVALID_PARAMS, "out-of-range token id is rejected");
        return test::finish("test-prompt: all checks passed");
    });
}
