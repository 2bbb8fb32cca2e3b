// The talker and the code predictor on a device of a ggml device backend (Vulkan; in CI Mesa's
// software driver, lavapipe) against the same model on the CPU: weights and KV caches in the
// device's memory, graphs of ggml's standard ops (the code predictor's sampler runs on the CPU
// between its passes). Text and codec embeddings, a prefill, teacher-forced steps of one
// sequence and of two side by side (the step's mask of each sequence's cache rows), each at
// cosine >= 0.999 with the same greedy code0; code-predictor frames: greedy with the same codes,
// sampled (fed the CPU's draws) at cosine >= 0.999 in every pass; states made and freed on the
// device request after request.
//
//     test-device MODEL.gguf     exit 77 (skipped), with the reason, where no device is found
#include "backend-loader.h"
#include "code-predictor.h"
#include "graph.h"
#include "talker.h"
#include "test-model.h"
#include "test-util.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace {

using test::check;
using test::cosine;

constexpr int    k_skipped = 77;  // ctest's SKIP_RETURN_CODE
constexpr double k_min_cosine = 0.999;

int argmax(const std::vector<float> & v) { return int(std::max_element(v.begin(), v.end()) - v.begin()); }

// The same output from both sides: logits and hidden state close, the same greedy code0.
void compare(const char * what, const qt::talker_output & cpu, const qt::talker_output & dev) {
    const double cl = cosine(cpu.logits, dev.logits), ch = cosine(cpu.hidden, dev.hidden);
    check(cl >= k_min_cosine && ch >= k_min_cosine && argmax(cpu.logits) == argmax(dev.logits),
          "%s: logits cosine %.6f, hidden cosine %.6f, code0 %d (cpu) vs %d (device)", what, cl, ch, argmax(cpu.logits),
          argmax(dev.logits));
}

int run(const std::string & path) {
    const qt::devices_found found = qt::devices_loaded();
    const auto device = std::find_if(found.devices.begin(), found.devices.end(),
                                     [](const qt::device_info & d) { return d.kind != "cpu"; });
    if (device == found.devices.end()) {
        std::string notes;
        for (const std::string & n : found.notes) {
            notes += "; " + n;
        }
        printf("skipped: no device besides the CPU%s\n", notes.c_str());
        return k_skipped;
    }
    printf("device %s: %s\n", device->id.c_str(), device->description.c_str());

    qt::cpu_backend    cpu(2);
    qt::device_backend dev(device->device, cpu);
    auto               on_cpu = test::load_talker(path, cpu);
    auto               on_dev = test::load_talker(path, dev);
    const qt::talker & tc = on_cpu->talker;
    const qt::talker & td = on_dev->talker;
    const qt::talker_hparams & hp = tc.hparams();

    std::vector<int32_t> text_ids(12);
    for (size_t i = 0; i < text_ids.size(); ++i) {
        text_ids[i] = int32_t((i * 7919 + 11) % size_t(hp.text_vocab));
    }
    const int64_t      n = int64_t(text_ids.size());
    std::vector<float> prompt = tc.text_embed(cpu, text_ids.data(), n);
    const double       ce = cosine(prompt, td.text_embed(dev, text_ids.data(), n));
    check(ce >= k_min_cosine, "text embeddings of %lld ids: cosine %.6f", (long long) n, ce);
    const int32_t codec_ids[] = { 0, hp.vocab / 3, hp.vocab - 1 };
    const double  cc = cosine(tc.codec_embed(cpu, codec_ids, 3), td.codec_embed(dev, codec_ids, 3));
    check(cc >= k_min_cosine, "codec embeddings: cosine %.6f", cc);

    // one sequence: prefill, then steps fed with the CPU's greedy code0
    const qt::stage_dumper no_dump;
    qt::talker_state       sc(tc, cpu, 64), sd(td, dev, 64);
    qt::talker_output      oc, od;
    sc.prefill(no_dump, prompt.data(), n, oc);
    sd.prefill(no_dump, prompt.data(), n, od);
    compare("prefill", oc, od);
    for (int s = 0; s < 8; ++s) {
        const int32_t      code = argmax(oc.logits);
        std::vector<float> e = tc.codec_embed(cpu, &code, 1);
        sc.step(e.data(), oc);
        sd.step(e.data(), od);
        compare(("step " + std::to_string(s)).c_str(), oc, od);
    }

    // two sequences of different lengths stepped side by side
    qt::talker_state bc(tc, cpu, 32, GGML_TYPE_F32, 2), bd(td, dev, 32, GGML_TYPE_F32, 2);
    qt::talker_output pc[2], pd[2];
    for (int seq = 0; seq < 2; ++seq) {
        const int64_t len = n - 4 * seq;
        bc.prefill(no_dump, prompt.data(), len, pc[seq], seq);
        bd.prefill(no_dump, prompt.data(), len, pd[seq], seq);
        compare(("prefill of sequence " + std::to_string(seq) + " of 2").c_str(), pc[seq], pd[seq]);
    }
    const int seqs[] = { 0, 1 };
    for (int s = 0; s < 4; ++s) {
        const int32_t      codes[] = { argmax(pc[0].logits), argmax(pc[1].logits) };
        std::vector<float> e = tc.codec_embed(cpu, codes, 2);
        bc.step_batch(seqs, 2, e.data(), pc);
        bd.step_batch(seqs, 2, e.data(), pd);
        for (int seq = 0; seq < 2; ++seq) {
            compare(("batch step " + std::to_string(s) + ", sequence " + std::to_string(seq)).c_str(), pc[seq],
                    pd[seq]);
        }
    }

    // the code predictor: its frames on the device, its sampler on the CPU between the passes;
    // the talker's hidden state and code0 of each frame from the CPU
    qt::code_predictor cpc, cpd;
    cpc.load(*on_cpu->loader, tc);
    cpd.load(*on_dev->loader, td);
    const int                n_codes = cpc.hparams().n_codes;
    qt::code_predictor_state on_cpu_cp(cpc, cpu), on_dev_cp(cpd, dev);
    for (const float temperature : { 0.0f, 0.9f }) {
        qt::cp_sampling sampling;
        sampling.temperature = temperature;
        sampling.top_k = 50;
        sampling.seed = 7;
        on_cpu_cp.set_sampling(sampling);
        on_dev_cp.set_sampling(sampling);
        qt::talker_state st(tc, cpu, 64);
        qt::talker_output        out;
        st.prefill(no_dump, prompt.data(), n, out);
        int    same = 0, total = 0;
        double logits_cos = 1.0, next_cos = 1.0;
        for (uint64_t frame = 0; frame < 4; ++frame) {
            const int32_t        code0 = argmax(out.logits);
            std::vector<int32_t> codes_c(static_cast<size_t>(n_codes)), codes_d(static_cast<size_t>(n_codes));
            std::vector<float>   next_c(static_cast<size_t>(hp.hidden)), next_d(static_cast<size_t>(hp.hidden));
            on_cpu_cp.predict(out.hidden.data(), code0, frame, codes_c.data(), next_c.data());
            // sampled: the device is fed the CPU's draws (teacher forcing), so that every pass is compared
            // even after a draw whose probability moved across the uniform by a rounding
            on_dev_cp.predict(out.hidden.data(), code0, frame, codes_d.data(), next_d.data(), nullptr,
                       temperature > 0 ? codes_c.data() : nullptr);
            for (int q = 0; q < n_codes; ++q) {
                same += codes_c[size_t(q)] == codes_d[size_t(q)];
            }
            total += n_codes;
            logits_cos = std::min(logits_cos, cosine(on_cpu_cp.last_logits(), on_dev_cp.last_logits()));
            next_cos = std::min(next_cos, cosine(next_c, next_d));
            st.step(next_c.data(), out);
        }
        if (temperature > 0) {
            check(logits_cos >= k_min_cosine && next_cos >= k_min_cosine,
                  "code predictor, sampled (temperature 0.9, top-k 50), teacher-forced over 4 frames: logits cosine "
                  ">= %.6f, next input cosine >= %.6f",
                  logits_cos, next_cos);
        } else {
            check(same == total && logits_cos >= k_min_cosine && next_cos >= k_min_cosine,
                  "code predictor, greedy: %d/%d codes identical over 4 frames; logits cosine >= %.6f, next input "
                  "cosine >= %.6f",
                  same, total, logits_cos, next_cos);
        }
    }

    // A request's states are made and freed on the device, request after request, as the engine
    // does: each round gives the same greedy codes (Mesa 22.3's lavapipe freed buffers here that
    // its queue thread still used: a heap corruption in about half the runs; Mesa 25 does not).
    std::vector<int32_t> first_round;
    for (int round = 0; round < 4; ++round) {
        qt::talker_state         st(td, dev, 48 + 16 * (round % 2));
        qt::code_predictor_state cp(cpd, dev);
        qt::talker_output        out;
        st.prefill(no_dump, prompt.data(), n, out);
        std::vector<int32_t> codes;
        for (uint64_t frame = 0; frame < 4; ++frame) {
            std::vector<int32_t> frame_codes(static_cast<size_t>(n_codes));
            std::vector<float>   next(static_cast<size_t>(hp.hidden));
            cp.predict(out.hidden.data(), argmax(out.logits), frame, frame_codes.data(), next.data());
            codes.insert(codes.end(), frame_codes.begin(), frame_codes.end());
            st.step(next.data(), out);
        }
        if (round == 0) {
            first_round = codes;
        } else {
            check(codes == first_round, "states made afresh on the device, round %d: the same %zu codes as round 0",
                  round, codes.size());
        }
    }
    return test::finish("the talker and the code predictor on the device agree with the CPU");
}

} // namespace

int main(int argc, char ** argv) {
    setvbuf(stdout, nullptr, _IONBF, 0);
    if (argc != 2) {
        fprintf(stderr, "usage: test-device MODEL.gguf\n");
        return 2;
    }
    return test::run_or_fail([&] { return run(argv[1]); });
}
