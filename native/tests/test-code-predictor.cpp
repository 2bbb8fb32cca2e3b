// The code predictor and its in-graph sampler.
//
//     test-code-predictor --sampler                      in-graph sampler kernel vs sample_warped, no model
//     test-code-predictor REF_DIR F32.gguf [OTHER.gguf...]
//     test-code-predictor --bench MODEL.gguf [N_FRAMES [N_THREADS]]   ms per frame
//
// With a model: parity with the PyTorch reference tensors of a tiny fixture on the f32
// conversion, in both clone modes: frame 0 from the reference's code-predictor prefill (h and
// code0): prefill embeddings, the 15 logits rows (cosine >= 0.999) and greedy codes 1..15; then
// every frame with the talker teacher-forced on the reference step inputs: greedy codes and the
// codec side of the next talker input. Sampling: seeds reproduce, top_k 1 is greedy, and the
// in-graph picks equal sample_warped's on the same logits and uniforms. Further models (f16,
// q8_0, q4_k) report the frame-0 logits cosine and the share of identical picks with each step
// fed the reference's previous code; f16 and q8_0 must keep the cosine >= 0.99.
#include "code-predictor.h"
#include "test-model.h"
#include "test-util.h"

#include "gguf-names.h"
#include "graph.h"
#include "log.h"
#include "model-loader.h"
#include "sampler.h"
#include "talker.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

using test::check;
using test::row;

// ---- sampler kernel --------------------------------------------------------------------------

// cp_sample_row against sample_warped on random rows: plain, with ties at the top-k boundary,
// with -inf entries, peaked and flat, over temperatures, top-k and top-p.
void test_sampler_kernel() {
    const int32_t n = 2048;
    int64_t cases = 0, same = 0;
    std::vector<float> logits(n), copy(n);
    const float temps[] = { 0.0f, 0.5f, 0.9f, 1.0f, 1.7f };
    const int32_t ks[] = { 0, 1, 2, 50, 2047, 2048, 5000 };
    const float ps[] = { 1.0f, 0.95f, 0.8f, 0.3f, 0.0f };
    uint64_t counter = 0;
    for (int trial = 0; trial < 60; ++trial) {
        const float scale = trial % 3 == 0 ? 8.0f : trial % 3 == 1 ? 1.0f : 0.05f;
        for (int32_t i = 0; i < n; ++i) {
            logits[size_t(i)] = scale * float(qt::rng_uniform(trial, 9, uint64_t(i)) * 2.0 - 1.0);
        }
        if (trial % 4 == 1) {  // coarse values: many ties, also at the k-th value
            for (float & l : logits) {
                l = std::round(l * 4.0f) / 4.0f;
            }
        }
        if (trial % 5 == 2) {  // masked ids
            for (int32_t i = 0; i < n; i += 3) {
                logits[size_t(i)] = -INFINITY;
            }
        }
        for (float t : temps) {
            for (int32_t k : ks) {
                for (float p : ps) {
                    for (int d = 0; d < 4; ++d) {
                        const float u = d == 0 ? 0.0f : d == 3 ? 0.99999994f : qt::rng_uniform_f32(77, 3, counter++);
                        const int32_t got = qt::cp_sample_row(logits.data(), n, t, k, p, u);
                        copy = logits;
                        const int32_t want = t <= 0.0f ? qt::argmax(copy.data(), n)
                                                       : qt::sample_warped(copy.data(), n, t, k, p, double(u));
                        ++cases;
                        same += got == want;
                    }
                }
            }
        }
    }
    check(same == cases, "in-graph sampler kernel == sample_warped on %lld/%lld random rows and uniforms",
          (long long) same, (long long) cases);
    // a hand case: logits ln(1..4), u = 0.31 -> id 2 (cumulative 0.1 0.3 0.6 1.0)
    const float l4[] = { std::log(1.0f), std::log(2.0f), std::log(3.0f), std::log(4.0f) };
    check(qt::cp_sample_row(l4, 4, 1.0f, 0, 1.0f, 0.31f) == 2 && qt::cp_sample_row(l4, 4, 1.0f, 2, 1.0f, 0.43f) == 3 &&
              qt::cp_sample_row(l4, 4, 0.0f, 0, 1.0f, 0.0f) == 3,
          "sampler kernel hand cases");
}

// ---- model -----------------------------------------------------------------------------------

struct loaded_model : test::loaded_model {
    qt::code_predictor cp;
};

std::unique_ptr<loaded_model> load(const std::string & path, const qt::cpu_backend & backend) {
    auto m = test::load_talker<loaded_model>(path, backend);
    m->cp.load(*m->loader, m->talker);
    return m;
}

// The distinct types of the code predictor's matrices, e.g. "f16+q8_0".
std::string type_name_of(const loaded_model & m) {
    std::vector<std::string> heads;
    for (int q = 0; q < m.cp.hparams().n_codes; ++q) {
        heads.push_back("cp.head." + std::to_string(q) + ".weight");
    }
    return test::matrix_types(*m.loader, "cp", m.cp.hparams().layers, heads);
}

struct mode_result {
    double min_row_cos = 1.0;  // frame 0 logits under teacher forcing, worst of the 15 rows
    int    same_codes = 0;     // over every frame, codes 1..15
    int    n_codes = 0;
};

// Frame 0 from the reference's code-predictor prefill (h and code0), then every frame with the
// talker teacher-forced on the reference step inputs. With `strict`, the codes run free
// (greedy, each pick feeding the next step) and must all equal the reference; otherwise each
// step is fed the reference's previous code and its pick (the argmax) is compared, which keeps
// a quantized model's later rows comparable after a first differing pick.
mode_result run_mode(const std::string & ref, const char * mode, loaded_model & m, const qt::cpu_backend & backend,
                     bool strict) {
    const qt::code_predictor_hparams & hp = m.cp.hparams();
    const std::string p = ref + "/" + mode + "_";
    const test::npy_array pre_ref = test::npy_read(p + "cp_step0_prefill_embeds.npy");
    const test::npy_array logits_ref = test::npy_read(p + "cp_step0_logits.npy");
    const test::npy_array codes = test::npy_read(p + "codes.npy");
    const int64_t n_cb = codes.cols();
    const int64_t V = hp.vocab;
    mode_result r;

    qt::cp_sampling greedy;
    greedy.temperature = 0.0f;
    qt::code_predictor_state st(m.cp, backend, greedy);
    std::vector<int32_t> got(size_t(hp.n_codes));
    std::vector<float> next(size_t(hp.talker_hidden));

    // frame 0, teacher-forced: every logits row against the reference
    st.predict(pre_ref.f32.data(), codes.i32[0], 0, got.data(), nullptr, nullptr, &codes.i32[1]);
    const std::vector<float> forced_logits = st.last_logits();
    std::string row_cos;
    for (int q = 0; q < hp.n_codes; ++q) {
        const double c = test::cosine(&forced_logits[size_t(q * V)], &logits_ref.f32[size_t(q * V)], size_t(V));
        r.min_row_cos = std::min(r.min_row_cos, c);
        row_cos += qt::format(" %.6f", c);
    }
    if (strict) {
        check(logits_ref.rows() == hp.n_codes && logits_ref.cols() == V && n_cb == hp.n_codes + 1,
              "%s: reference shapes (%lld x %lld logits, %lld codebooks)", mode, (long long) logits_ref.rows(),
              (long long) logits_ref.cols(), (long long) n_cb);
        // frame 0 running free, with the stage dump
        const std::string dump_dir = test::make_temp_dir();
        qt::stage_dumper dumper(dump_dir);
        st.predict(pre_ref.f32.data(), codes.i32[0], 0, got.data(), next.data(), &dumper);
        const std::vector<float> logits = st.last_logits();
        int same0 = 0;
        for (int q = 0; q < hp.n_codes; ++q) {
            same0 += got[size_t(q)] == codes.i32[size_t(1 + q)];
        }
        const test::npy_array pre = test::npy_read(dump_dir + "/cp_step0_prefill_embeds.npy");
        check(pre.shape == pre_ref.shape && test::cosine(pre.f32, pre_ref.f32) >= 0.9999,
              "%s cp_step0_prefill_embeds: cos %.7f, max diff %.2g", mode, test::cosine(pre.f32, pre_ref.f32),
              test::max_abs_diff(pre.f32, pre_ref.f32));
        const test::npy_array dl = test::npy_read(dump_dir + "/cp_step0_logits.npy");
        check(dl.shape == logits_ref.shape && dl.f32 == logits,
              "%s: dumped cp_step0_logits [%lld, %lld] equal last_logits()", mode, (long long) dl.rows(),
              (long long) dl.cols());
        check(r.min_row_cos >= 0.999, "%s cp_step0_logits per row: min cos %.7f (rows:%s), max diff %.2g", mode,
              r.min_row_cos, row_cos.c_str(), test::max_abs_diff(logits, logits_ref.f32));
        check(same0 == hp.n_codes && logits == forced_logits,
              "%s frame 0: greedy codes 1..%d equal the reference (%d/%d), logits as under teacher forcing", mode,
              hp.n_codes, same0, hp.n_codes);
        test::remove_dir(dump_dir);
    }

    // every frame: the talker's prefill / teacher-forced steps give h, the reference gives code0
    const test::npy_array prefill = test::npy_read(p + "prefill_embeds.npy");
    const test::npy_array steps = test::npy_read(p + "step_embeds.npy");
    const test::npy_array trailing = test::npy_read(p + "trailing_text.npy");
    const test::npy_array pad = test::npy_read(p + "tts_pad_embed.npy");
    const int64_t F = codes.rows();
    const int64_t Ht = hp.talker_hidden;
    qt::talker_state ts(m.talker, backend, prefill.rows() + steps.rows());
    qt::talker_output out;
    qt::stage_dumper no_dump;
    ts.prefill(no_dump, prefill.f32.data(), prefill.rows(), out);
    double min_next_cos = 1.0;
    std::string mism;
    for (int64_t f = 0; f < F; ++f) {
        const int32_t * want = &codes.i32[size_t(f * n_cb + 1)];
        st.predict(out.hidden.data(), codes.i32[size_t(f * n_cb)], uint64_t(f), got.data(), next.data(), nullptr,
                   strict ? nullptr : want);
        const std::vector<float> logits = st.last_logits();
        for (int q = 0; q < hp.n_codes; ++q) {
            const int32_t pick = strict ? got[size_t(q)] : qt::argmax(&logits[size_t(q * V)], int32_t(V));
            ++r.n_codes;
            if (pick == want[q]) {
                ++r.same_codes;
            } else if (mism.size() < 300) {
                mism += qt::format(" f%lld q%d: %d vs %d;", (long long) f, q + 1, pick, want[q]);
            }
        }
        // the next talker input: codec side + trailing text row f (or the pad vector)
        const float * text = f < trailing.rows() ? &trailing.f32[size_t(f * Ht)] : pad.f32.data();
        std::vector<float> in(static_cast<size_t>(Ht));
        for (int64_t i = 0; i < Ht; ++i) {
            in[size_t(i)] = next[size_t(i)] + text[i];
        }
        min_next_cos = std::min(min_next_cos, test::cosine(in, row(steps, f)));
        ts.step(&steps.f32[size_t(f * Ht)], out);
    }
    if (strict) {
        check(r.same_codes == r.n_codes, "%s: greedy codes 1..%d of %lld frames (talker teacher-forced): %d/%d equal%s",
              mode, hp.n_codes, (long long) F, r.same_codes, r.n_codes, mism.c_str());
        check(min_next_cos >= 0.9999, "%s: next talker input (codec sum + text) vs step_embeds: min cos %.7f", mode,
              min_next_cos);
    }
    return r;
}

// Sampling on the f32 model: reproducibility, seeds, top_k 1 == greedy, and the in-graph picks
// against sample_warped on the same logits and uniforms.
void test_sampling(const std::string & ref, loaded_model & m, const qt::cpu_backend & backend) {
    const qt::code_predictor_hparams & hp = m.cp.hparams();
    const test::npy_array pre = test::npy_read(ref + "/xvec_cp_step0_prefill_embeds.npy");
    const test::npy_array codes = test::npy_read(ref + "/xvec_codes.npy");
    const int n_frames = 8;
    auto run = [&](const qt::cp_sampling & s) {
        qt::code_predictor_state st(m.cp, backend, s);
        std::vector<int32_t> all(size_t(n_frames * hp.n_codes));
        for (int f = 0; f < n_frames; ++f) {
            st.predict(pre.f32.data(), codes.i32[0], uint64_t(f), &all[size_t(f * hp.n_codes)]);
        }
        return all;
    };
    qt::cp_sampling s;
    s.seed = 1234;
    const std::vector<int32_t> a = run(s), b = run(s);
    s.seed = 99;
    const std::vector<int32_t> c = run(s);
    int differ = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        differ += a[i] != c[i];
    }
    check(a == b, "same seed, same codes (%d frames)", n_frames);
    check(differ > 0, "another seed, other codes (%d of %zu differ)", differ, a.size());

    qt::cp_sampling g;
    g.temperature = 0.0f;
    qt::cp_sampling k1;
    k1.top_k = 1;
    k1.seed = 5;
    check(run(g) == run(k1), "top_k 1 equals greedy");

    // one state, parameters switched between frames (the graph takes them as inputs)
    const float temps[] = { 0.7f, 1.0f, 1.5f };
    const int32_t ks[] = { 0, 5, 50 };
    const float ps[] = { 1.0f, 0.8f, 0.3f };
    qt::code_predictor_state st(m.cp, backend, s);
    std::vector<int32_t> got(size_t(hp.n_codes));
    int64_t picks = 0, same = 0, distinct_frames = 0;
    uint64_t frame = 0;
    for (float t : temps) {
        for (int32_t k : ks) {
            for (float p : ps) {
                qt::cp_sampling sp;
                sp.temperature = t;
                sp.top_k = k;
                sp.top_p = p;
                sp.seed = 42 + frame;
                st.set_sampling(sp);
                for (int rep = 0; rep < 4; ++rep, ++frame) {
                    st.predict(pre.f32.data(), codes.i32[0], frame, got.data());
                    const std::vector<float> logits = st.last_logits();
                    bool differs_from_greedy = false;
                    for (int q = 0; q < hp.n_codes; ++q) {
                        std::vector<float> l(logits.begin() + q * hp.vocab, logits.begin() + (q + 1) * hp.vocab);
                        differs_from_greedy = differs_from_greedy || got[size_t(q)] != qt::argmax(l.data(), hp.vocab);
                        const float u = qt::rng_uniform_f32(sp.seed, 1, frame * uint64_t(hp.n_codes) + uint64_t(q));
                        const int32_t want = qt::sample_warped(l.data(), hp.vocab, t, k, p, double(u));
                        ++picks;
                        same += want == got[size_t(q)];
                    }
                    distinct_frames += differs_from_greedy;
                }
            }
        }
    }
    check(same == picks, "in-graph sampler == sample_warped on the same logits and uniforms: %lld/%lld picks "
          "(%lld of %llu frames not greedy)", (long long) same, (long long) picks, (long long) distinct_frames,
          (unsigned long long) frame);

    bool refused = false;
    try {
        st.predict(pre.f32.data(), hp.talker_vocab, 0, got.data());
    } catch (const qt::error & e) {
        refused = e.status == QT_STATUS_INVALID_PARAMS;
    }
    check(refused, "code0 past the talker vocabulary is refused");
}

// ---- bench -----------------------------------------------------------------------------------

// Frames of several requests predicted together (predict_batch, in groups of changing width,
// each with its own sampling, seed, frame index, hidden state and code0) give the codes and next
// talker inputs each gets alone, bit for bit.
void test_batch(const std::string & ref, loaded_model & m, const qt::cpu_backend & backend, const std::string & types) {
    const qt::code_predictor_hparams & hp = m.cp.hparams();
    const test::npy_array pre = test::npy_read(ref + "/xvec_cp_step0_prefill_embeds.npy");
    const test::npy_array codes = test::npy_read(ref + "/xvec_codes.npy");
    const int n_requests = 4;
    std::vector<std::vector<float>> hidden(n_requests);
    std::vector<qt::cp_sampling>    sampling(n_requests);
    for (int r = 0; r < n_requests; ++r) {
        hidden[size_t(r)].assign(pre.f32.begin(), pre.f32.begin() + hp.talker_hidden);
        for (int64_t c = 0; c < hp.talker_hidden; ++c) {
            hidden[size_t(r)][size_t(c)] += 0.1f * float(r) * float(qt::rng_uniform(3, uint64_t(r), uint64_t(c)) - 0.5);
        }
        sampling[size_t(r)].seed = 17 + uint64_t(r);
        sampling[size_t(r)].temperature = r == 3 ? 0.0f : 0.6f + 0.2f * float(r);
        sampling[size_t(r)].top_k = r == 1 ? 0 : 50;
    }
    const int32_t code0_at[n_requests] = { codes.i32[0], codes.i32[16], codes.i32[32], codes.i32[0] };
    qt::code_predictor_state together(m.cp, backend, {}, n_requests);
    qt::code_predictor_state alone(m.cp, backend);
    bool same = true;
    const std::vector<std::vector<int>> groups = { { 0, 1, 2, 3 }, { 2, 0 }, { 3 }, { 1, 3, 0 } };
    for (size_t g = 0; g < groups.size(); ++g) {
        const std::vector<int> & group = groups[g];
        const size_t n = group.size();
        std::vector<int32_t> got(n * size_t(hp.n_codes)), want(n * size_t(hp.n_codes));
        std::vector<float>   got_codec(n * size_t(hp.talker_hidden)), want_codec(n * size_t(hp.talker_hidden));
        std::vector<qt::cp_frame> frames(n);
        for (size_t i = 0; i < n; ++i) {
            const int r = group[i];
            frames[i] = { hidden[size_t(r)].data(), code0_at[r], uint64_t(g * 3 + size_t(r)), sampling[size_t(r)],
                          &got[i * size_t(hp.n_codes)], &got_codec[i * size_t(hp.talker_hidden)] };
            alone.set_sampling(sampling[size_t(r)]);
            alone.predict(frames[i].talker_hidden, frames[i].code0, frames[i].frame_index, &want[i * size_t(hp.n_codes)],
                          &want_codec[i * size_t(hp.talker_hidden)]);
        }
        together.predict_batch(frames.data(), int(n));
        same = same && got == want && got_codec == want_codec;
    }
    check(same, "%s: frames of 4 requests predicted together (groups of 4, 2, 1, 3) give the codes and talker inputs "
                "each gets alone", types.c_str());
}

int bench(const std::string & path, int n_frames, int n_threads) {
    qt::cpu_backend backend(n_threads);
    auto ms_since = [](std::chrono::steady_clock::time_point t) {
        return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
    };
    auto t0 = std::chrono::steady_clock::now();
    auto m = load(path, backend);
    const qt::code_predictor_hparams & hp = m->cp.hparams();
    printf("model %s (code predictor matrices %s), loaded in %.0f ms; %d threads\n", path.c_str(),
           type_name_of(*m).c_str(), ms_since(t0), n_threads);
    std::vector<float> h(size_t(hp.talker_hidden));
    for (size_t i = 0; i < h.size(); ++i) {
        h[i] = float(qt::rng_uniform(3, 7, i) * 2.0 - 1.0);
    }
    t0 = std::chrono::steady_clock::now();
    qt::code_predictor_state st(m->cp, backend, qt::cp_sampling{});
    printf("state (graph build + allocation): %.1f ms\n", ms_since(t0));
    std::vector<int32_t> codes(size_t(hp.n_codes));
    std::vector<float> next(size_t(hp.talker_hidden));
    for (int rep = 0; rep < 2; ++rep) {  // the first pass faults the weights in
        std::vector<double> times;
        for (int f = 0; f < n_frames; ++f) {
            t0 = std::chrono::steady_clock::now();
            st.predict(h.data(), f % 2048, uint64_t(f), codes.data(), next.data());
            times.push_back(ms_since(t0));
        }
        std::sort(times.begin(), times.end());
        double mean = 0;
        for (double t : times) {
            mean += t;
        }
        mean /= double(times.size());
        const double mb = double(m->cp.frame_weight_bytes()) / 1e6;
        printf("%s: %d frames, ms/frame mean %.2f, median %.2f, min %.2f, max %.2f; reads %.0f MB of weights per "
               "frame = %.1f GB/s at the median\n",
               rep ? "timed " : "warmup", n_frames, mean, times[times.size() / 2], times.front(), times.back(), mb,
               mb / times[times.size() / 2]);
    }
    return 0;
}

} // namespace

int main(int argc, char ** argv) {
    setvbuf(stdout, nullptr, _IONBF, 0);
    if (argc == 2 && std::string(argv[1]) == "--sampler") {
        test_sampler_kernel();
        return test::finish("all sampler kernel tests passed");
    }
    if (argc >= 3 && std::string(argv[1]) == "--bench") {
        return test::run_or_fail(
            [&] { return bench(argv[2], argc > 3 ? atoi(argv[3]) : 50, argc > 4 ? atoi(argv[4]) : 2); });
    }
    if (argc < 3) {
        fprintf(stderr, "usage: %s --sampler | --bench MODEL [N_FRAMES [N_THREADS]] | REF_DIR F32.gguf [OTHER.gguf...]\n",
                argv[0]);
        return 2;
    }
    const std::string ref = argv[1];
    return test::run_or_fail([&] {
        qt::cpu_backend backend(2);
        auto m = load(argv[2], backend);
        const qt::code_predictor_hparams & hp = m->cp.hparams();
        printf("code predictor: hidden %d (talker %d, %s), %d layers, %d/%d heads of %d, ffn %d, %d codes of %d (%s)\n",
               hp.hidden, hp.talker_hidden, hp.hidden == hp.talker_hidden ? "no projection" : "projected", hp.layers,
               hp.heads, hp.kv_heads, hp.head_dim, hp.ffn, hp.n_codes, hp.vocab, type_name_of(*m).c_str());
        for (const char * mode : { "xvec", "icl" }) {
            run_mode(ref, mode, *m, backend, true);
        }
        test_sampling(ref, *m, backend);
        test_batch(ref, *m, backend, type_name_of(*m));
        for (int i = 3; i < argc; ++i) {
            auto q = load(argv[i], backend);
            const std::string types = type_name_of(*q);
            test_batch(ref, *q, backend, types);
            for (const char * mode : { "xvec", "icl" }) {
                const mode_result r = run_mode(ref, mode, *q, backend, false);
                test::check_conversion(argv[i], types, mode, { r.min_row_cos, r.same_codes, r.n_codes },
                                       "frame-0 logits min row cos", "picks");
            }
        }
        return test::finish("all code predictor tests passed");
    });
}
