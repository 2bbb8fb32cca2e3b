#include "session.h"

#include "log.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>

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
    if (prefix.bytes() > k_max_bytes) {  // kept, it would only push the others out, then go itself
        return;
    }
    entries_.remove_if([&](const talker_prefix & e) { return e.embeds == prefix.embeds; });
    entries_.push_front(std::move(prefix));
    size_t total = 0;
    for (const talker_prefix & e : entries_) {
        total += e.bytes();
    }
    while (entries_.size() > k_max_entries || total > k_max_bytes) {
        total -= entries_.back().bytes();
        entries_.pop_back();
    }
}

bool primed_stream_cache::entry::holds(const codec_decoder & d, const int32_t * c, int64_t n) const {
    return decoder == &d && int64_t(codes.size()) == n && std::equal(codes.begin(), codes.end(), c);
}

const codec_stream * primed_stream_cache::find(const codec_decoder & decoder, const int32_t * codes,
                                               int64_t n_codes) const {
    for (const entry & e : entries_) {
        if (e.holds(decoder, codes, n_codes)) {
            return &e.stream;
        }
    }
    return nullptr;
}

void primed_stream_cache::put(const codec_decoder & decoder, const int32_t * codes, int64_t n_codes,
                              const codec_stream & stream) {
    if (stream.bytes() + size_t(n_codes) * sizeof(int32_t) > k_max_bytes) {  // as prefill_cache::put
        return;
    }
    entries_.remove_if([&](const entry & e) { return e.holds(decoder, codes, n_codes); });
    entries_.push_front({ &decoder, std::vector<int32_t>(codes, codes + n_codes), stream });
    size_t total = 0;
    for (const entry & e : entries_) {
        total += e.bytes();
    }
    while (entries_.size() > k_max_entries || total > k_max_bytes) {
        total -= entries_.back().bytes();
        entries_.pop_back();
    }
}

namespace {

// One request on its way: its prompt, sampler, decoder state and result so far.
struct track {
    const synthesis_request * req = nullptr;
    size_t                    index = 0;  // in the request list
    int                       seq = 0;    // its sequence in the talker state
    prompt                    p;
    talker_output             out;
    std::unique_ptr<talker_sampler> sampler;
    std::unique_ptr<codec_stream>   audio;
    synthesis_result          result;
    int64_t                   frame = 0;  // the next frame's index
    int64_t                   decoded = 0, next_width = 1, n_chunks = 0;
    bool                      ended = false;
    bool                      sent_last = false;  // its on_chunk has had the last chunk
    std::vector<int32_t>      codes;       // the frame being predicted
    std::vector<float>        codec_side;  // its codec-side vector for the next talker input
    // timings of a lone request (ms)
    double t_start_ms = 0, t_prompt = 0, t_prefill = 0, t_prime = 0, t_first_frame = 0, t_first_audio = 0,
           t_decode = 0;
    int64_t reused = 0;
    bool    prime_reused = false;
};

// Requests through one talker state and one code predictor, up to `width` at a time. `batch`:
// synthesize_batch's contract (an on_chunk false ends only its request); else one request,
// dumped, with synthesize()'s log lines.
std::vector<synthesis_result> run_requests(const cpu_backend & backend, const stage_dumper & dumper,
                                           const synthesis_models & m, const std::vector<synthesis_request> & reqs,
                                           int width, bool batch) {
    using clock = std::chrono::steady_clock;
    const auto t_start = clock::now();
    const size_t n = reqs.size();
    // Any request's cancel check stops every computation.
    const std::function<bool()> any_cancelled = [&reqs] {
        return std::any_of(reqs.begin(), reqs.end(), [](const synthesis_request & r) { return r.cancelled && r.cancelled(); });
    };
    const cancel_scope cancel(backend, any_cancelled);
    const int n_books = m.prompts.n_codebooks();
    const int64_t frame_samples = m.decoder.hparams().frame_samples;
    const bool use_cache = m.prefills && !dumper.enabled();  // a dump shows every prefill stage
    const bool keep_primed = m.primed && !dumper.enabled();
    const compute_backend & decoding = m.decoding ? *m.decoding : backend;

    // The prompts first: their lengths size the cache.
    std::vector<prompt> prompts;
    int64_t capacity = 1;
    for (const synthesis_request & r : reqs) {
        prompts.push_back(m.prompts.build(backend, dumper, r.prompt));
        capacity = std::max(capacity, prompts.back().n_prefill + r.max_frames + 1);
    }
    const double t_prompts = ms_since(t_start);
    width = int(std::min<size_t>(size_t(std::max(width, 1)), n));
    talker_state state(m.talker_model, m.generation ? *m.generation : backend, capacity, GGML_TYPE_F32, width);
    code_predictor_state & predictor = m.predictor;
    if (!batch) {
        predictor.set_sampling(reqs[0].predictor);
    }
    const int64_t H = m.talker_model.hparams().hidden;

    std::vector<synthesis_result>        results(n);
    std::vector<std::unique_ptr<track>>  slots(static_cast<size_t>(width));
    size_t                               next_request = 0;
    double t_talker = 0.0, t_predictor = 0.0;
    int64_t talker_steps = 0, predictor_steps = 0;

    auto start = [&](int seq) {
        auto t = std::make_unique<track>();
        t->index = next_request++;
        t->req = &reqs[t->index];
        t->seq = seq;
        t->p = std::move(prompts[t->index]);
        t->t_start_ms = ms_since(t_start);
        t->t_prompt = t_prompts;
        const auto t0 = clock::now();
        state.reset(seq);
        const prompt & p = t->p;
        if (const talker_prefix * hit = use_cache ? m.prefills->find(p.prefill.data(), p.n_prefill, H) : nullptr) {
            state.load_prefix(*hit, seq);
            t->out = hit->out;
            t->reused = hit->n;
        } else {
            state.prefill(dumper, p.prefill.data(), p.n_prefill, t->out, seq);
            if (use_cache) {
                m.prefills->put(state.save_prefix(p.prefill.data(), t->out, seq));
            }
        }
        t->t_prefill = ms_since(t0);
        t->sampler = std::make_unique<talker_sampler>(t->req->talker);
        const int32_t * prime_codes = t->req->prime_codes;
        const int64_t   n_prime_codes = t->req->n_prime_frames * n_books;
        const codec_stream * primed = keep_primed && n_prime_codes > 0
                                          ? m.primed->find(m.decoder, prime_codes, n_prime_codes)
                                          : nullptr;
        if (primed) {
            t->audio = std::make_unique<codec_stream>(*primed);
            t->prime_reused = true;
        } else {
            t->audio = std::make_unique<codec_stream>(m.decoder);
            if (n_prime_codes > 0) {
                const auto tp = clock::now();
                t->audio->prime(decoding, prime_codes, t->req->n_prime_frames);
                t->t_prime = ms_since(tp);
                if (keep_primed) {
                    m.primed->put(m.decoder, prime_codes, n_prime_codes, *t->audio);
                }
            }
        }
        t->result.n_codebooks = n_books;
        t->next_width = t->req->on_chunk ? 1 : std::max<int64_t>(t->req->chunk_frames, 1);
        t->codes.assign(size_t(n_books), 0);
        t->codec_side.assign(size_t(H), 0.0f);
        slots[size_t(seq)] = std::move(t);
    };
    // Decodes the pending frames once there are next_width of them, or all of them when `last`
    // (the request ends with them). False: the request's on_chunk asked to end it.
    auto flush = [&](track & t, bool last) {
        synthesis_result & r = t.result;
        const int64_t pending = r.n_frames - t.decoded;
        if (!last && pending < t.next_width) {
            return true;
        }
        if (pending == 0 && (!batch || t.sent_last)) {
            return true;  // a lone request's return marks its end
        }
        const auto      td = clock::now();
        const int32_t * codes = r.codes.data() + t.decoded * n_books;
        const std::vector<float> pcm = pending > 0 ? t.audio->decode(decoding, dumper, codes, pending) : std::vector<float>();
        t.t_decode += ms_since(td);
        r.pcm.insert(r.pcm.end(), pcm.begin(), pcm.end());
        if (pending > 0 && t.n_chunks++ == 0) {
            t.t_first_audio = ms_since(t_start);
        }
        t.sent_last = last;
        const synthesis_request & req = *t.req;
        const bool go_on = !req.on_chunk || req.on_chunk(codes, pending, t.decoded, pcm.data(), int64_t(pcm.size()),
                                                         t.decoded * frame_samples, last);
        t.decoded += pending;
        if (req.on_chunk) {
            t.next_width = std::min(t.next_width * 2, std::max<int64_t>(req.chunk_frames, 1));
        }
        if (!go_on && !batch) {
            throw error(QT_STATUS_CANCELLED, "synthesis cancelled by the chunk callback");
        }
        return go_on;
    };
    auto finish = [&](track & t) {
        if (!t.result.stopped) {
            flush(t, true);
        }
        if (dumper.enabled()) {
            dumper.write("codes", t.result.codes.data(), { t.result.n_frames, n_books });
        }
        if (!batch) {
            const synthesis_result & r = t.result;
            const double frames = double(std::max<int64_t>(r.n_frames, 1));
            const double audio_s = double(r.pcm.size()) / double(m.decoder.hparams().sample_rate);
            const double wall_ms = ms_since(t_start);
            QT_LOG_INFO("[Perf] prompt build: %.1f ms (%lld positions), prefill: %.1f ms (%lld positions from the cache), "
                        "time to first frame: %.1f ms",
                        t.t_prompt, (long long) t.p.n_prefill, t.t_prefill, (long long) t.reused, t.t_first_frame);
            QT_LOG_INFO("[Perf] %lld frames%s: talker %.1f ms/frame, code predictor %.1f ms/frame, total %.1f ms",
                        (long long) r.n_frames, r.reached_eos ? " (EOS)" : " (frame cap)", t_talker / frames,
                        t_predictor / frames, wall_ms);
            if (t.req->n_prime_frames > 0) {
                QT_LOG_INFO("[Perf] codec decoder primed with %lld reference frames: %.1f ms%s",
                            (long long) t.req->n_prime_frames, t.t_prime,
                            t.prime_reused ? " (its state from the cache)" : "");
            }
            QT_LOG_INFO("[Perf] codec decode: %.1f ms per second of audio (%lld frames in %lld chunks)",
                        audio_s > 0.0 ? t.t_decode / audio_s : 0.0, (long long) r.n_frames, (long long) t.n_chunks);
            QT_LOG_INFO("[Perf] time to first audio: %.1f ms", t.t_first_audio);
            QT_LOG_INFO("[Perf] synthesis: %.2f s of audio in %.2f s, real-time factor %.3f", audio_s, wall_ms / 1000.0,
                        audio_s > 0.0 ? wall_ms / 1000.0 / audio_s : 0.0);
        }
        results[t.index] = std::move(t.result);
        const int seq = t.seq;
        slots[size_t(seq)].reset();
        if (next_request < n) {
            start(seq);
        }
    };

    for (int seq = 0; seq < width && next_request < n; ++seq) {
        start(seq);
    }
    std::vector<track *>        going;
    std::vector<cp_frame>       frames;
    std::vector<int>            seqs;
    std::vector<float>          embeds;
    std::vector<talker_output>  outs;
    for (;;) {
        if (any_cancelled()) {
            throw error(QT_STATUS_CANCELLED, "synthesis cancelled");
        }
        // code0 of each request's next frame; a request at EOS ends
        going.clear();
        frames.clear();
        for (auto & slot : slots) {
            if (!slot) {
                continue;
            }
            track & t = *slot;
            if (t.frame >= t.req->max_frames) {
                t.ended = true;
                continue;
            }
            t.codes[0] = t.sampler->sample(t.out.logits.data(), int32_t(t.out.logits.size()));
            if (t.codes[0] == t.req->talker.eos_id) {
                t.result.reached_eos = true;
                t.ended = true;
                continue;
            }
            going.push_back(&t);
            cp_frame f;
            f.talker_hidden = t.out.hidden.data();
            f.code0 = t.codes[0];
            f.frame_index = uint64_t(t.frame);
            f.sampling = t.req->predictor;
            f.codes = t.codes.data() + 1;
            f.next_codec = t.codec_side.data();
            frames.push_back(f);
        }
        // codes 1..15 of those frames, all at once
        if (!frames.empty()) {
            const auto t0 = clock::now();
            if (batch) {
                predictor.predict_batch(frames.data(), int(frames.size()));
            } else {
                const cp_frame & f = frames[0];
                predictor.predict(f.talker_hidden, f.code0, f.frame_index, f.codes, f.next_codec,
                                  f.frame_index == 0 ? &dumper : nullptr);
            }
            t_predictor += ms_since(t0);
            ++predictor_steps;
        }
        seqs.clear();
        embeds.clear();
        for (track * tp : going) {
            track & t = *tp;
            synthesis_result & r = t.result;
            r.codes.insert(r.codes.end(), t.codes.begin(), t.codes.end());
            ++r.n_frames;
            if (t.frame == 0) {
                t.t_first_frame = ms_since(t_start) - t.t_start_ms + t.t_prompt;
            }
            ++t.frame;
            const bool capped = t.frame == t.req->max_frames;  // no need for the talker's next step
            if (!flush(t, capped)) {
                r.stopped = true;
                t.ended = true;
                continue;
            }
            if (capped) {
                t.ended = true;
                continue;
            }
            const int64_t f = t.frame - 1;
            const float * text_side = f < t.p.n_trailing ? t.p.trailing.data() + f * H : t.p.tts_pad.data();
            for (int64_t c = 0; c < H; ++c) {
                t.codec_side[size_t(c)] += text_side[c];
            }
            seqs.push_back(t.seq);
            embeds.insert(embeds.end(), t.codec_side.begin(), t.codec_side.end());
        }
        if (!seqs.empty()) {
            const auto t0 = clock::now();
            outs.resize(seqs.size());
            state.step_batch(seqs.data(), int(seqs.size()), embeds.data(), outs.data());
            for (size_t i = 0; i < seqs.size(); ++i) {
                std::swap(slots[size_t(seqs[i])]->out, outs[i]);
            }
            t_talker += ms_since(t0);
            ++talker_steps;
        }
        bool any = false;
        for (auto & slot : slots) {
            if (slot && slot->ended) {
                finish(*slot);  // may start the next request in this slot
            }
            any = any || slot;
        }
        if (!any) {
            break;
        }
    }
    if (batch) {
        double audio_s = 0.0;
        for (const synthesis_result & r : results) {
            audio_s += double(r.pcm.size()) / double(m.decoder.hparams().sample_rate);
        }
        const double wall_s = ms_since(t_start) / 1000.0;
        QT_LOG_INFO("[Perf] batch of %zu requests, %d at a time: %.2f s of audio in %.2f s (%.2f s of audio per second); "
                    "talker %.1f ms per step, code predictor %.1f ms per step",
                    n, width, audio_s, wall_s, wall_s > 0.0 ? audio_s / wall_s : 0.0,
                    talker_steps ? t_talker / double(talker_steps) : 0.0,
                    predictor_steps ? t_predictor / double(predictor_steps) : 0.0);
    }
    return results;
}

} // namespace

synthesis_result synthesize(const cpu_backend & backend, const stage_dumper & dumper, const synthesis_models & m,
                            const synthesis_request & req) {
    return std::move(run_requests(backend, dumper, m, { req }, 1, false).front());
}

std::vector<synthesis_result> synthesize_batch(const cpu_backend & backend, const synthesis_models & m,
                                               const std::vector<synthesis_request> & requests, int max_batch) {
    if (requests.empty()) {
        return {};
    }
    if (max_batch < 1 || max_batch > m.predictor.max_batch()) {
        throw error(QT_STATUS_INVALID_PARAMS, format("a batch of %d requests at a time (the code predictor takes "
                                                     "1 to %d)", max_batch, m.predictor.max_batch()));
    }
    const stage_dumper no_dump;
    return run_requests(backend, no_dump, m, requests, max_batch, true);
}

} // namespace qt
