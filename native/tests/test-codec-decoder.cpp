// Codec decoder and audio synthesis through the C API, against the reference fixtures:
//   - every decoder stage and the waveform of the reference codes (one chunk),
//   - chunked decodes against the one-chunk decode (any split: residual >= 50 dB down),
//   - both modes' generated codes decoded, and greedy synthesis in both modes end to end,
//   - streaming: the chunk schedule, joined chunks == buffered result (>= 80 dB), and
//     cancellation from either callback, after which the context still synthesizes.
//
// usage: test-codec-decoder REFERENCE_DIR MODEL.gguf
#include "qwen3-tts.h"
#include "test-check.h"
#include "test-util.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

using namespace test;

namespace {

// Residual of `got` against `want`, in dB below want's energy (inf when identical).
double residual_db(const std::vector<float> & got, const std::vector<float> & want) {
    if (got.size() != want.size()) {
        return -INFINITY;
    }
    double signal = 0.0, noise = 0.0;
    for (size_t i = 0; i < want.size(); ++i) {
        signal += double(want[i]) * want[i];
        noise += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    }
    return noise == 0.0 ? INFINITY : 10.0 * std::log10(signal / noise);
}

std::vector<float> transpose(const std::vector<float> & a, int64_t rows, int64_t cols) {
    std::vector<float> t(a.size());
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
            t[size_t(c * rows + r)] = a[size_t(r * cols + c)];
        }
    }
    return t;
}

std::vector<float> decode(qt_context * ctx, const std::vector<int32_t> & codes, int32_t n_books, int32_t chunk) {
    qt_audio audio;
    const int32_t n_frames = int32_t(codes.size()) / n_books;
    if (qt_decode(ctx, codes.data(), n_frames, n_books, chunk, &audio) != QT_STATUS_OK) {
        fprintf(stderr, "qt_decode: %s\n", qt_last_error());
        return {};
    }
    std::vector<float> pcm(audio.pcm, audio.pcm + audio.n_samples);
    qt_audio_free(&audio);
    return pcm;
}

struct stream_capture {
    std::vector<float>   pcm;
    std::vector<int32_t> widths;
    int                  cancel_at_chunk = -1;  // return false from this chunk
    bool                 contiguous = true;
    int                  n_last = 0;            // chunks marked last
    bool                 after_last = false;    // a chunk came after the one marked last
};

bool on_chunk(const qt_chunk * c, void * user) {
    auto * s = static_cast<stream_capture *>(user);
    s->contiguous = s->contiguous && c->first_sample == int64_t(s->pcm.size()) &&
                    c->n_samples == c->n_frames * 1920 && c->codes != nullptr;
    s->pcm.insert(s->pcm.end(), c->pcm, c->pcm + c->n_samples);
    s->widths.push_back(c->n_frames);
    s->after_last = s->after_last || s->n_last > 0;
    s->n_last += c->last ? 1 : 0;
    return int(s->widths.size()) - 1 != s->cancel_at_chunk;
}

bool cancel_after(void * user) {
    int * polls = static_cast<int *>(user);
    return --*polls < 0;
}

// A chunk callback that calls into its own context, as a careless caller might: the nested
// call must be refused (it would free state the running call uses), the outer one go on.
struct reentry {
    qt_context *          ctx;
    const qt_tts_params * params;
    std::vector<qt_status> nested;
    std::string           error;
};

bool call_back_in(const qt_chunk * c, void * user) {
    auto *        r = static_cast<reentry *>(user);
    qt_tts_result out[2];
    const qt_tts_params two[2] = { *r->params, *r->params };
    r->nested.push_back(qt_synthesize_batch(r->ctx, two, 2, 2, out));
    r->error = qt_last_error();
    qt_audio audio;
    r->nested.push_back(qt_decode(r->ctx, c->codes, c->n_frames, c->n_codebooks, 0, &audio));
    return true;
}

} // namespace

int main(int argc, char ** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s REFERENCE_DIR MODEL.gguf\n", argv[0]);
        return 2;
    }
    const std::string ref = argv[1];
    const std::string dump_dir = make_temp_dir();

    qt_init_params ip = qt_init_default_params();
    ip.model_path = argv[2];
    ip.n_threads = 2;
    ip.dump_dir = dump_dir.c_str();
    ip.codec_chunk_sec = 0.4f;  // 5 frames: the fixtures' 19-frame syntheses take several chunks
    qt_context * ctx = qt_init(&ip);
    if (!ctx) {
        fprintf(stderr, "qt_init: %s\n", qt_last_error());
        return 1;
    }
    qt_model_info info;
    qt_get_model_info(ctx, &info);
    check(info.codec_chunk_frames == 5, "codec_chunk_sec 0.4 resolves to %d frames", info.codec_chunk_frames);
    const int32_t Q = info.n_codebooks;

    // ---- stages of the reference codes, decoded as one chunk ----
    const npy_array ref_codes = npy_read(ref + "/ref_codes.npy");
    const int64_t   T = ref_codes.rows();
    const std::vector<float> whole = decode(ctx, ref_codes.i32, Q, int32_t(T));
    const npy_array wav = npy_read(ref + "/dec_wav.npy");
    check(cosine(whole, wav.f32) >= 0.999, "reference codes decoded: %zu samples, cos %.7f, max diff %.2g", whole.size(),
          cosine(whole, wav.f32), max_abs_diff(whole, wav.f32));
    // reference layouts: conv stages [C, T]; the transformer output [T, C] (as ours)
    const char * conv_stages[] = { "dec_quantized", "dec_pre_conv", "dec_upsample0", "dec_upsample", "dec_conv_in",
                                   "dec_block0",    "dec_block1",   "dec_block2",    "dec_block3" };
    for (const char * name : conv_stages) {
        const npy_array want = npy_read(ref + "/" + name + ".npy");
        const npy_array got = npy_read(dump_dir + "/" + name + ".npy");
        const std::vector<float> got_ct = transpose(got.f32, got.rows(), got.cols());
        check(cosine(got_ct, want.f32) >= 0.999, "stage %s [%lld, %lld]: cos %.7f", name, (long long) want.rows(),
              (long long) want.cols(), cosine(got_ct, want.f32));
    }
    {
        const npy_array want = npy_read(ref + "/dec_pre_transformer.npy");
        const npy_array got = npy_read(dump_dir + "/dec_pre_transformer.npy");
        check(cosine(got.f32, want.f32) >= 0.999, "stage dec_pre_transformer: cos %.7f", cosine(got.f32, want.f32));
    }

    // ---- chunked decodes: the state carried across chunks makes any split exact ----
    for (int32_t width : { 1, 2, 5, 16, 17, 37 }) {
        const std::vector<float> chunked = decode(ctx, ref_codes.i32, Q, width);
        const double db = residual_db(chunked, whole);
        check(db >= 50.0, "chunks of %d frames vs one chunk: residual %.1f dB below the signal", width, db);
    }

    // ---- both modes' generated codes ----
    const char * modes[] = { "xvec", "icl" };
    for (const char * mode : modes) {
        const npy_array codes = npy_read(ref + "/" + mode + "_codes_for_decode.npy");
        const npy_array want = npy_read(ref + "/" + mode + "_wav.npy");
        std::vector<float> pcm = decode(ctx, codes.i32, Q, 0);
        pcm.erase(pcm.begin(), pcm.end() - int64_t(want.f32.size()));  // in-context: the reference part is cut
        check(cosine(pcm, want.f32) >= 0.999, "%s codes decoded: cos %.7f", mode, cosine(pcm, want.f32));
    }

    // ---- greedy synthesis end to end, buffered and streamed ----
    const npy_array ids = npy_read(ref + "/input_ids.npy");
    const npy_array ref_ids = npy_read(ref + "/ref_ids.npy");
    const npy_array spk = npy_read(ref + "/speaker_embedding.npy");
    qt_voice_ref voice = { const_cast<float *>(spk.f32.data()), int32_t(spk.f32.size()),
                           const_cast<int32_t *>(ref_codes.i32.data()), int32_t(T), Q };
    for (int m = 0; m < 2; ++m) {
        const npy_array want = npy_read(ref + "/" + modes[m] + "_wav.npy");
        const npy_array want_codes = npy_read(ref + "/" + modes[m] + "_codes.npy");
        qt_tts_params tp = qt_tts_default_params();
        tp.text_ids = ids.i32.data();
        tp.n_text_ids = int32_t(ids.i32.size());
        tp.voice = &voice;
        tp.mode = m == 0 ? QT_CLONE_XVECTOR : QT_CLONE_IN_CONTEXT;
        if (m == 1) {
            tp.ref_text_ids = ref_ids.i32.data();
            tp.n_ref_text_ids = int32_t(ref_ids.i32.size());
        }
        tp.language = "english";
        tp.talker_sampling.temperature = 0.0f;
        tp.predictor_sampling.temperature = 0.0f;
        tp.max_frames = int32_t(want_codes.rows());

        qt_tts_result buffered;
        if (qt_synthesize(ctx, &tp, &buffered) != QT_STATUS_OK) {
            check(false, "%s: qt_synthesize: %s", modes[m], qt_last_error());
            continue;
        }
        std::vector<float> pcm(buffered.pcm, buffered.pcm + buffered.n_samples);
        check(pcm.size() == size_t(buffered.n_frames) * 1920 && cosine(pcm, want.f32) >= 0.999,
              "%s synthesis (buffered): %d frames, %zu samples, cos %.7f against the reference waveform", modes[m],
              buffered.n_frames, pcm.size(), cosine(pcm, want.f32));

        stream_capture streamed;
        tp.chunk_callback = on_chunk;
        tp.chunk_callback_user_data = &streamed;
        qt_tts_result res;
        const qt_status st = qt_synthesize(ctx, &tp, &res);
        std::string widths;
        for (int32_t w : streamed.widths) {
            widths += std::to_string(w) + " ";
        }
        // 19 frames, widest chunk 5: 1 2 4 5 5 2
        const std::vector<int32_t> schedule = { 1, 2, 4, 5, 5, 2 };
        check(st == QT_STATUS_OK && streamed.widths == schedule && streamed.contiguous,
              "%s streamed chunk widths: %s(1, 2, 4, then 5 = codec_chunk_frames)", modes[m], widths.c_str());
        const double db = residual_db(streamed.pcm, pcm);
        check(db >= 80.0, "%s streamed audio joined vs buffered: residual %.1f dB below the signal", modes[m], db);
        check(residual_db(std::vector<float>(res.pcm, res.pcm + res.n_samples), pcm) >= 80.0,
              "%s streamed result audio == buffered", modes[m]);
        qt_tts_result_free(&res);

        // cancellation from the chunk callback (third chunk) and from the cancel callback
        stream_capture cancelled;
        cancelled.cancel_at_chunk = 2;
        tp.chunk_callback_user_data = &cancelled;
        const qt_status by_chunk = qt_synthesize(ctx, &tp, &res);
        check(by_chunk == QT_STATUS_CANCELLED && res.pcm == nullptr && res.codes == nullptr && cancelled.widths.size() == 3,
              "%s: the chunk callback cancels (after %zu chunks)", modes[m], cancelled.widths.size());
        int polls = 3;
        tp.chunk_callback = nullptr;
        tp.cancel_callback = cancel_after;
        tp.cancel_callback_user_data = &polls;
        check(qt_synthesize(ctx, &tp, &res) == QT_STATUS_CANCELLED, "%s: the cancel callback cancels", modes[m]);
        tp.cancel_callback = nullptr;
        qt_tts_result again;
        const bool ok = qt_synthesize(ctx, &tp, &again) == QT_STATUS_OK;
        check(ok && residual_db(std::vector<float>(again.pcm, again.pcm + again.n_samples), pcm) >= 80.0,
              "%s: the context synthesizes the same audio after the cancellations", modes[m]);
        qt_tts_result_free(&again);
        qt_tts_result_free(&buffered);
    }

    // ---- several requests side by side (qt_synthesize_batch) ----
    {
        // both clone modes, sampled, other seeds and frame caps; each request alone first
        struct request {
            qt_tts_params  params;
            stream_capture alone, batched;
            qt_tts_result  result{};
        };
        std::vector<request> reqs(5);
        for (size_t i = 0; i < reqs.size(); ++i) {
            qt_tts_params & tp = reqs[i].params;
            tp = qt_tts_default_params();
            tp.text_ids = ids.i32.data();
            tp.n_text_ids = int32_t(ids.i32.size()) - int32_t(i % 3);
            tp.voice = &voice;
            tp.mode = i % 2 ? QT_CLONE_IN_CONTEXT : QT_CLONE_XVECTOR;
            if (tp.mode == QT_CLONE_IN_CONTEXT) {
                tp.ref_text_ids = ref_ids.i32.data();
                tp.n_ref_text_ids = int32_t(ref_ids.i32.size());
            }
            tp.seed = 1000 + i;
            tp.max_frames = int32_t(6 + 5 * i);
            tp.talker_sampling.temperature = i == 4 ? 0.0f : 0.9f;
            tp.chunk_callback = on_chunk;
        }
        reqs[2].batched.cancel_at_chunk = 1;  // ended by its own chunk callback in the batch
        bool same = true, marked = true;
        for (request & r : reqs) {
            r.params.chunk_callback_user_data = &r.alone;
            qt_tts_result alone;
            same = same && qt_synthesize(ctx, &r.params, &alone) == QT_STATUS_OK;
            r.result = alone;
            r.params.chunk_callback_user_data = &r.batched;
        }
        std::vector<qt_tts_params> params;
        for (const request & r : reqs) {
            params.push_back(r.params);
        }
        std::vector<qt_tts_result> out(reqs.size());
        const qt_status st = qt_synthesize_batch(ctx, params.data(), int32_t(params.size()), 3, out.data());
        check(st == QT_STATUS_OK, "qt_synthesize_batch of 5 requests, 3 at a time: %s",
              st == QT_STATUS_OK ? "ok" : qt_last_error());
        for (size_t i = 0; st == QT_STATUS_OK && i < reqs.size(); ++i) {
            request & r = reqs[i];
            const qt_tts_result & a = r.result;
            const qt_tts_result & b = out[i];
            marked = marked && r.batched.n_last == (i == 2 ? 0 : 1) && !r.batched.after_last;
            if (i == 2) {  // stopped after its second chunk: the frames of its first two
                const int32_t kept = r.batched.widths[0] + r.batched.widths[1];
                same = same && b.n_frames == kept && !b.reached_eos && b.n_samples == int64_t(kept) * 1920 &&
                       std::equal(b.codes, b.codes + size_t(kept) * size_t(Q), a.codes) &&
                       std::equal(b.pcm, b.pcm + b.n_samples, a.pcm);
                continue;
            }
            same = same && a.n_frames == b.n_frames && a.reached_eos == b.reached_eos && a.n_samples == b.n_samples &&
                   std::equal(a.codes, a.codes + size_t(a.n_frames) * size_t(Q), b.codes) &&
                   std::equal(a.pcm, a.pcm + a.n_samples, b.pcm) && r.batched.pcm == r.alone.pcm;
            std::vector<int32_t> widths = r.batched.widths;  // less an empty closing chunk
            if (!widths.empty() && widths.back() == 0) {
                widths.pop_back();
            }
            same = same && widths == r.alone.widths;
        }
        check(same, "each request of the batch has the codes, audio and chunks it has alone, bit for bit (the one "
                    "its callback ended: the frames up to there)");
        check(marked, "every request of the batch ends with one chunk marked last (but the one its callback ended)");
        for (request & r : reqs) {
            qt_tts_result_free(&r.result);
        }
        for (qt_tts_result & r : out) {
            qt_tts_result_free(&r);
        }
        const bool none_refused = qt_synthesize_batch(ctx, params.data(), 0, 3, out.data()) == QT_STATUS_INVALID_PARAMS;
        const bool wide_refused =
            qt_synthesize_batch(ctx, params.data(), 2, QT_MAX_BATCH + 1, out.data()) == QT_STATUS_INVALID_PARAMS;
        const std::string wide_error = qt_last_error();
        check(none_refused && wide_refused, "no requests, or too many at a time, are refused: %s", wide_error.c_str());
        params[1].voice = nullptr;
        const bool bad_refused = qt_synthesize_batch(ctx, params.data(), 3, 2, out.data()) == QT_STATUS_INVALID_PARAMS;
        const std::string bad_error = qt_last_error();
        check(bad_refused && bad_error.rfind("request 1:", 0) == 0 && out[0].codes == nullptr,
              "a bad request names itself and nothing is returned: %s", bad_error.c_str());
    }

    // ---- calls the API refuses ----
    {
        qt_tts_params tp = qt_tts_default_params();
        tp.text_ids = ids.i32.data();
        tp.n_text_ids = int32_t(ids.i32.size());
        tp.voice = &voice;
        tp.seed = 7;
        tp.max_frames = 6;
        qt_tts_result res;
        reentry r{ ctx, &tp, {}, {} };
        tp.chunk_callback = call_back_in;
        tp.chunk_callback_user_data = &r;
        const qt_status outer = qt_synthesize(ctx, &tp, &res);
        const bool all_refused = !r.nested.empty() && std::all_of(r.nested.begin(), r.nested.end(), [](qt_status s) {
            return s == QT_STATUS_INVALID_PARAMS;
        });
        check(outer == QT_STATUS_OK && res.n_frames == 6 && all_refused && r.error.find("busy") != std::string::npos,
              "calls from a callback into its own context are refused, the running call goes on: %s", r.error.c_str());
        qt_tts_result_free(&res);
        tp.chunk_callback = nullptr;

        qt_tts_result greedy, cold;
        tp.talker_sampling.temperature = 0.0f;
        tp.predictor_sampling.temperature = 0.0f;
        const bool greedy_ok = qt_synthesize(ctx, &tp, &greedy) == QT_STATUS_OK;
        tp.talker_sampling.temperature = 1e-40f;  // a denormal: logit / temperature overflows a float
        tp.predictor_sampling.temperature = 1e-40f;
        const bool cold_ok = qt_synthesize(ctx, &tp, &cold) == QT_STATUS_OK;
        check(greedy_ok && cold_ok && greedy.n_frames == cold.n_frames &&
                  std::equal(greedy.codes, greedy.codes + size_t(greedy.n_frames) * size_t(Q), cold.codes),
              "a temperature too small for a float samples as greedy does");
        qt_tts_result_free(&greedy);
        qt_tts_result_free(&cold);
        const float bad_values[] = { NAN, INFINITY };
        for (float bad : bad_values) {
            for (int which = 0; which < 4; ++which) {
                qt_tts_params b = tp;
                (which == 0 ? b.talker_sampling.temperature
                 : which == 1 ? b.predictor_sampling.top_p
                 : which == 2 ? b.talker_sampling.top_p
                              : b.talker_sampling.repetition_penalty) = bad;
                const qt_status st = qt_synthesize(ctx, &b, &res);
                check(st == QT_STATUS_INVALID_PARAMS && res.codes == nullptr, "sampling value %g refused (%d): %s",
                      double(bad), which, qt_last_error());
            }
        }
        tp.talker_sampling.repetition_penalty = 0.0f;
        check(qt_synthesize(ctx, &tp, &res) == QT_STATUS_INVALID_PARAMS, "a repetition penalty of 0 is refused: %s",
              qt_last_error());

        const char * info_text = qt_system_info();
        const std::string first(info_text);
        check(qt_system_info() == info_text && first == info_text && qt_device_notes() == qt_device_notes(),
              "qt_system_info and qt_device_notes hand out one string each, for the library's life");

        qt_init_params bad = qt_init_default_params();
        bad.model_path = ip.model_path;
        bad.n_threads = 100000;
        check(qt_init(&bad) == nullptr && std::string(qt_last_error()).find("at most 512") != std::string::npos,
              "100000 threads are refused: %s", qt_last_error());
        bad.n_threads = 2;
        bad.codec_chunk_sec = INFINITY;
        check(qt_init(&bad) == nullptr && std::string(qt_last_error()).find("codec_chunk_sec") != std::string::npos,
              "an infinite chunk width is refused: %s", qt_last_error());
        bad.codec_chunk_sec = 1e30f;
        qt_context * wide = qt_init(&bad);
        qt_model_info wide_info{};
        if (wide) {
            qt_get_model_info(wide, &wide_info);
            qt_free(wide);
        }
        check(wide_info.codec_chunk_frames == 8192, "a huge chunk width is the widest, 8192 frames: %d",
              wide_info.codec_chunk_frames);
    }

    // ---- errors ----
    {
        qt_audio audio;
        std::vector<int32_t> bad(size_t(Q), 0);
        bad[3] = info.codebook_size;
        qt_status st = qt_decode(ctx, bad.data(), 1, Q, 0, &audio);
        check(st == QT_STATUS_INVALID_PARAMS && audio.pcm == nullptr, "a code outside the codebook is refused: %s",
              qt_last_error());
        st = qt_decode(ctx, bad.data(), 1, Q - 1, 0, &audio);
        check(st == QT_STATUS_INVALID_PARAMS, "the wrong number of codebooks is refused: %s", qt_last_error());
        st = qt_decode(ctx, bad.data(), 0, Q, 0, &audio);
        check(st == QT_STATUS_INVALID_PARAMS, "zero frames are refused: %s", qt_last_error());
        std::vector<int32_t> padded(size_t(Q), -1);
        check(qt_decode(ctx, padded.data(), 1, Q, 0, &audio) == QT_STATUS_OK && audio.n_samples == 1920,
              "negative codes (padding) decode as code 0");
        qt_audio_free(&audio);
    }

    qt_free(ctx);
    remove_dir(dump_dir);
    return finish("all codec decoder checks passed");
}
