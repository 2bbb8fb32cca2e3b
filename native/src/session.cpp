#include "session.h"

#include "log.h"

#include <algorithm>
#include <chrono>
#include <cstring>

namespace qt {

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Lets graph computations see the request's cancel check while a synthesis runs.
class cancel_scope {
public:
    cancel_scope(const cpu_backend & backend, const std::function<bool()> & cancelled) : backend_(backend) {
        backend_.set_cancel(cancelled ? &cancelled : nullptr);
    }
    ~cancel_scope() { backend_.set_cancel(nullptr); }
    cancel_scope(const cancel_scope &) = delete;
    cancel_scope & operator=(const cancel_scope &) = delete;

private:
    const cpu_backend & backend_;
};

} // namespace

const talker_prefix * prefill_cache::find(const float * embeds, int64_t n, int64_t hidden) const {
    for (const talker_prefix & e : entries_) {
        if (e.n == n && int64_t(e.embeds.size()) == n * hidden &&
            memcmp(e.embeds.data(), embeds, e.embeds.size() * sizeof(float)) == 0) {
            return &e;
        }
    }
    return nullptr;
}

void prefill_cache::put(talker_prefix && prefix) {
    entries_.remove_if([&](const talker_prefix & e) { return e.embeds == prefix.embeds; });
    entries_.push_front(std::move(prefix));
    size_t total = 0;
    for (const talker_prefix & e : entries_) {
        total += e.bytes();
    }
    while (entries_.size() > 1 && (entries_.size() > k_max_entries || total > k_max_bytes)) {
        total -= entries_.back().bytes();
        entries_.pop_back();
    }
}

synthesis_result synthesize(const cpu_backend & backend, const stage_dumper & dumper, const synthesis_models & m,
                            const synthesis_request & req) {
    using clock = std::chrono::steady_clock;
    const auto t_start = clock::now();
    const cancel_scope cancel(backend, req.cancelled);
    const prompt p = m.prompts.build(backend, dumper, req.prompt);
    const double t_prompt = ms_since(t_start);
    const int64_t H = p.hidden;
    const int n_books = m.prompts.n_codebooks();

    auto t0 = clock::now();
    talker_state state(m.talker_model, backend, p.n_prefill + req.max_frames + 1);
    talker_output out;
    int64_t       reused = 0;  // prompt positions restored from the prefill cache
    const bool    use_cache = m.prefills && !dumper.enabled();  // a dump shows every prefill stage
    if (const talker_prefix * hit = use_cache ? m.prefills->find(p.prefill.data(), p.n_prefill, H) : nullptr) {
        state.load_prefix(*hit);
        out = hit->out;
        reused = hit->n;
    } else {
        state.prefill(dumper, p.prefill.data(), p.n_prefill, out);
        if (use_cache) {
            m.prefills->put(state.save_prefix(p.prefill.data(), out));
        }
    }
    const double t_prefill = ms_since(t0);

    talker_sampler sampler(req.talker);
    code_predictor_state & predictor = m.predictor;
    predictor.set_sampling(req.predictor);
    synthesis_result result;
    result.n_codebooks = n_books;
    std::vector<int32_t> frame(size_t(n_books), 0);
    std::vector<float> codec_side(static_cast<size_t>(H)), next(static_cast<size_t>(H));
    double t_talker = 0.0, t_predictor = 0.0, t_first_frame = 0.0;

    codec_stream audio(m.decoder);
    double       t_prime = 0.0;
    if (req.n_prime_frames > 0) {
        t0 = clock::now();
        audio.prime(backend, req.prime_codes, req.n_prime_frames);
        t_prime = ms_since(t0);
    }
    const int64_t frame_samples = m.decoder.hparams().frame_samples;
    const int64_t widest = std::max<int64_t>(req.chunk_frames, 1);
    int64_t       next_width = req.on_chunk ? 1 : widest;
    int64_t       decoded = 0, n_chunks = 0;
    double        t_decode = 0.0, t_first_audio = 0.0;
    // Decodes the pending frames once there are next_width of them, or all at the end.
    auto flush = [&](bool last) {
        const int64_t pending = result.n_frames - decoded;
        if (pending == 0 || (!last && pending < next_width)) {
            return;
        }
        const auto             td = clock::now();
        const int32_t *        codes = result.codes.data() + decoded * n_books;
        const std::vector<float> pcm = audio.decode(backend, dumper, codes, pending);
        t_decode += ms_since(td);
        result.pcm.insert(result.pcm.end(), pcm.begin(), pcm.end());
        if (n_chunks++ == 0) {
            t_first_audio = ms_since(t_start);
        }
        if (req.on_chunk && !req.on_chunk(codes, pending, decoded, pcm.data(), int64_t(pcm.size()),
                                          decoded * frame_samples)) {
            throw error(QT_STATUS_CANCELLED, "synthesis cancelled by the chunk callback");
        }
        decoded += pending;
        if (req.on_chunk) {
            next_width = std::min(next_width * 2, widest);
        }
    };
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
        if (f == 0) {
            t_first_frame = ms_since(t_start);
        }
        flush(false);
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
    flush(true);
    if (dumper.enabled()) {
        dumper.write("codes", result.codes.data(), { result.n_frames, n_books });
    }
    const double frames = double(std::max<int64_t>(result.n_frames, 1));
    const double audio_s = double(result.pcm.size()) / double(m.decoder.hparams().sample_rate);
    const double wall_ms = ms_since(t_start);
    QT_LOG_INFO("[Perf] prompt build: %.1f ms (%lld positions), prefill: %.1f ms (%lld positions from the cache), "
                "time to first frame: %.1f ms",
                t_prompt, (long long) p.n_prefill, t_prefill, (long long) reused, t_first_frame);
    QT_LOG_INFO("[Perf] %lld frames%s: talker %.1f ms/frame, code predictor %.1f ms/frame, total %.1f ms",
                (long long) result.n_frames, result.reached_eos ? " (EOS)" : " (frame cap)", t_talker / frames,
                t_predictor / frames, wall_ms);
    if (req.n_prime_frames > 0) {
        QT_LOG_INFO("[Perf] codec decoder primed with %lld reference frames: %.1f ms", (long long) req.n_prime_frames,
                    t_prime);
    }
    QT_LOG_INFO("[Perf] codec decode: %.1f ms per second of audio (%lld frames in %lld chunks)",
                audio_s > 0.0 ? t_decode / audio_s : 0.0, (long long) result.n_frames, (long long) n_chunks);
    QT_LOG_INFO("[Perf] time to first audio: %.1f ms", t_first_audio);
    QT_LOG_INFO("[Perf] synthesis: %.2f s of audio in %.2f s, real-time factor %.3f", audio_s, wall_ms / 1000.0,
                audio_s > 0.0 ? wall_ms / 1000.0 / audio_s : 0.0);
    return result;
}

} // namespace qt
