#include "session.h"

#include "log.h"

#include <chrono>

namespace qt {

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

} // namespace

synthesis_result synthesize(const cpu_backend & backend, const stage_dumper & dumper, const synthesis_models & m,
                            const synthesis_request & req) {
    using clock = std::chrono::steady_clock;
    const auto t_start = clock::now();
    const prompt p = m.prompts.build(backend, dumper, req.prompt);
    const double t_prompt = ms_since(t_start);
    const int64_t H = p.hidden;
    const int n_books = m.prompts.n_codebooks();

    auto t0 = clock::now();
    talker_state state(m.talker_model, backend, p.n_prefill + req.max_frames + 1);
    talker_output out;
    state.prefill(dumper, p.prefill.data(), p.n_prefill, out);
    const double t_prefill = ms_since(t0);

    talker_sampler sampler(req.talker);
    code_predictor_state & predictor = m.predictor;
    predictor.set_sampling(req.predictor);
    synthesis_result result;
    result.n_codebooks = n_books;
    std::vector<int32_t> frame(size_t(n_books), 0);
    std::vector<float> codec_side(static_cast<size_t>(H)), next(static_cast<size_t>(H));
    double t_talker = 0.0, t_predictor = 0.0, t_first_frame = 0.0;
    for (int64_t f = 0; f < req.max_frames; ++f) {
        if (req.cancelled && req.cancelled()) {
            throw error(QT_STATUS_CANCELLED, "synthesis cancelled");
        }
        frame[0] = sampler.sample(out.logits.data(), int32_t(out.logits.size()));
        if (frame[0] == req.talker.eos_id) {
            result.reached_eos = true;
            break;
        }
        t0 = clock::now();
        predictor.predict(out.hidden.data(), frame[0], uint64_t(f), frame.data() + 1, codec_side.data(),
                          f == 0 ? &dumper : nullptr);
        t_predictor += ms_since(t0);
        result.codes.insert(result.codes.end(), frame.begin(), frame.end());
        ++result.n_frames;
        if (req.on_frame && !req.on_frame(frame.data(), f)) {
            throw error(QT_STATUS_CANCELLED, "synthesis cancelled by the chunk callback");
        }
        if (f == 0) {
            t_first_frame = ms_since(t_start);
        }
        if (f + 1 == req.max_frames) {
            break;  // the cap: no need for the talker's next step
        }
        t0 = clock::now();
        const float * text_side = f < p.n_trailing ? p.trailing.data() + f * H : p.tts_pad.data();
        for (int64_t c = 0; c < H; ++c) {
            next[size_t(c)] = codec_side[size_t(c)] + text_side[c];
        }
        state.step(next.data(), out);
        t_talker += ms_since(t0);
    }
    if (dumper.enabled()) {
        dumper.write("codes", result.codes.data(), { result.n_frames, n_books });
    }
    const double frames = double(std::max<int64_t>(result.n_frames, 1));
    QT_LOG_INFO("[Perf] prompt build: %.1f ms (%lld positions), prefill: %.1f ms, time to first frame: %.1f ms",
                t_prompt, (long long) p.n_prefill, t_prefill, t_first_frame);
    QT_LOG_INFO("[Perf] %lld frames%s: talker %.1f ms/frame, code predictor %.1f ms/frame, total %.1f ms",
                (long long) result.n_frames, result.reached_eos ? " (EOS)" : " (frame cap)", t_talker / frames,
                t_predictor / frames, ms_since(t_start));
    return result;
}

} // namespace qt
