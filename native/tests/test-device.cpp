// The talker on a device of a ggml device backend (Vulkan; in CI Mesa's software driver,
// lavapipe) against the same model on the CPU: weights and KV cache in the device's memory,
// graphs of ggml's standard ops. Text and codec embeddings, a prefill, teacher-forced steps of
// one sequence and of two side by side (the step's mask of each sequence's cache rows), each at
// cosine >= 0.999 with the same greedy code0.
//
//     test-device MODEL.gguf     exit 77 (skipped), with the reason, where no device is found
#include "backend-loader.h"
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
    qt::device_backend dev(device->device);
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
    return test::finish("the talker on the device agrees with the CPU");
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
