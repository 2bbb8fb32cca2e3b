// The talker and the code predictor on a device of a ggml device backend (Vulkan; in CI Mesa's
// software driver, lavapipe) against the same model on the CPU: weights and KV caches in the
// device's memory, graphs of ggml's standard ops (the code predictor's sampler runs on the CPU
// between its passes). Text and codec embeddings, a prefill, teacher-forced steps of one
// sequence and of two side by side (the step's mask of each sequence's cache rows), each at
// cosine >= 0.999 with the same greedy code0; code-predictor frames: greedy with the same codes,
// sampled (fed the CPU's draws) at cosine >= 0.999 in every pass; states made and freed on the
// device request after request. The codec decoder on the device against the CPU's (packed and
// Winograd kernels there): every dumped stage at cosine >= 0.999, a primed stream too, and its
// chunks joined against one pass within the CPU's 80 dB. The speaker encoder on the device
// against the CPU's, on the fixture's reference clip: every dumped stage and the embedding at
// cosine >= 0.999.
//
//     test-device MODEL.gguf REF_DIR     exit 77 (skipped), with the reason, where no device is found
#include "backend-loader.h"
#include "code-predictor.h"
#include "codec-decoder.h"
#include "graph.h"
#include "mel.h"
#include "speaker-encoder.h"
#include "talker.h"
#include "test-model.h"
#include "test-util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

namespace {

using test::check;
using test::cosine;

constexpr int    k_skipped = 77;  // ctest's SKIP_RETURN_CODE
constexpr double k_min_cosine = 0.999;
// Streamed chunks against one pass: the CPU's bar (test-codec-decoder).
constexpr double k_min_stream_db = 80.0;

int argmax(const std::vector<float> & v) { return int(std::max_element(v.begin(), v.end()) - v.begin()); }

// The same output from both sides: logits and hidden state close, the same greedy code0.
void compare(const char * what, const qt::talker_output & cpu, const qt::talker_output & dev) {
    const double cl = cosine(cpu.logits, dev.logits), ch = cosine(cpu.hidden, dev.hidden);
    check(cl >= k_min_cosine && ch >= k_min_cosine && argmax(cpu.logits) == argmax(dev.logits),
          "%s: logits cosine %.6f, hidden cosine %.6f, code0 %d (cpu) vs %d (device)", what, cl, ch, argmax(cpu.logits),
          argmax(dev.logits));
}

// Residual of `got` against `want`, in dB below want's energy (inf when identical).
double residual_db(const std::vector<float> & got, const std::vector<float> & want) {
    double signal = 0.0, noise = 0.0;
    for (size_t i = 0; i < want.size(); ++i) {
        signal += double(want[i]) * want[i];
        noise += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    }
    return got.size() != want.size() ? -INFINITY : noise == 0.0 ? INFINITY : 10.0 * std::log10(signal / noise);
}

// The codec decoder loaded from each side's loader: stages, priming and streaming.
// The stages the CPU and the device dumped into their folders, each at cosine >= k_min_cosine;
// the folders are removed afterwards.
void compare_stages(const std::string & cpu_dir, const std::string & dev_dir, const char * component,
                    std::initializer_list<const char *> stages) {
    for (const char * stage : stages) {
        const test::npy_array a = test::npy_read(cpu_dir + "/" + stage + ".npy");
        const test::npy_array b = test::npy_read(dev_dir + "/" + stage + ".npy");
        const double          c = a.shape == b.shape ? cosine(a.f32, b.f32) : 0.0;
        check(c >= k_min_cosine, "%s stage %s on the device: cosine %.6f", component, stage, c);
    }
    test::remove_dir(cpu_dir);
    test::remove_dir(dev_dir);
}

void compare_decoders(qt::model_loader & cpu_loader, qt::model_loader & dev_loader, const qt::cpu_backend & cpu,
                      const qt::device_backend & dev) {
    qt::codec_decoder dc, dd;
    dc.load(cpu_loader);
    dd.load(dev_loader, &dev);
    const qt::codec_decoder_hparams & hp = dc.hparams();
    const int64_t        frames = 19, Q = hp.n_quantizers;
    std::vector<int32_t> codes(size_t(frames * Q));
    for (size_t i = 0; i < codes.size(); ++i) {
        codes[i] = int32_t((i * 2654435761u + 17) % uint64_t(hp.codebook_size));
    }

    const std::string cpu_dir = test::make_temp_dir(), dev_dir = test::make_temp_dir();
    qt::codec_stream  sc(dc), sd(dd);
    sc.decode(cpu, qt::stage_dumper(cpu_dir), codes.data(), frames);  // for the stage dumps
    sd.decode(dev, qt::stage_dumper(dev_dir), codes.data(), frames);
    compare_stages(cpu_dir, dev_dir, "decoder",
                   { "dec_quantized", "dec_pre_conv", "dec_pre_transformer", "dec_upsample0", "dec_upsample",
                     "dec_conv_in", "dec_block0", "dec_block1", "dec_block2", "dec_block3", "dec_wav" });

    // the engine's chunks, joined, against one pass (both in the 8-frame slices of the convolutions)
    qt::codec_stream         whole(dd), chunked(dd);
    const std::vector<float> one_pass = whole.decode(dev, qt::stage_dumper(), codes.data(), frames);
    std::vector<float>       joined;
    for (int64_t f = 0, width = 1; f < frames; f += width, width = std::min<int64_t>(2 * width, 8)) {
        const int64_t            n = std::min(width, frames - f);
        const std::vector<float> part = chunked.decode(dev, qt::stage_dumper(), codes.data() + f * Q, n);
        joined.insert(joined.end(), part.begin(), part.end());
    }
    check(joined.size() == one_pass.size() && residual_db(joined, one_pass) >= k_min_stream_db,
          "decoder chunks 1, 2, 4, 8, 4 on the device joined, against one pass: %.1f dB of residual (the CPU's "
          "bar: %.0f)", residual_db(joined, one_pass), k_min_stream_db);

    // primed with the first 11 frames (in-context mode's reference), then the rest
    qt::codec_stream pc(dc), pd(dd);
    pc.prime(cpu, codes.data(), 11);
    pd.prime(dev, codes.data(), 11);
    const std::vector<float> rc = pc.decode(cpu, qt::stage_dumper(), codes.data() + 11 * Q, frames - 11);
    const std::vector<float> rd = pd.decode(dev, qt::stage_dumper(), codes.data() + 11 * Q, frames - 11);
    check(cosine(rc, rd) >= k_min_cosine, "decoder primed with 11 frames on the device: cosine %.6f", cosine(rc, rd));

    dd.reserve(dev, 8);  // sizes the compute buffer for chunks of up to 8 frames, as the engine does at load
    qt::codec_stream         after(dd);
    const std::vector<float> again = after.decode(dev, qt::stage_dumper(), codes.data(), frames);
    check(again == one_pass, "the device decodes the same %zu samples again after reserve()", again.size());
}

// The speaker encoder on both, on the reference clip of REF_DIR (ref_wav_24k.npy).
void compare_speaker_encoders(qt::model_loader & cpu_loader, qt::model_loader & dev_loader,
                              const qt::cpu_backend & cpu, const qt::device_backend & dev, const std::string & ref_dir) {
    qt::speaker_encoder sc, sd;
    sc.load(cpu_loader);
    sd.load(dev_loader);
    const std::vector<float> pcm = test::npy_read(ref_dir + "/ref_wav_24k.npy").f32;
    const qt::mel_frontend   mel(24000);
    const std::vector<float> m = mel.compute(pcm.data(), int64_t(pcm.size()), qt::stage_dumper());
    const int64_t            n_mel = qt::mel_frontend::n_frames(int64_t(pcm.size()));

    const std::string        cpu_dir = test::make_temp_dir(), dev_dir = test::make_temp_dir();
    const std::vector<float> emb_c = sc.embed(cpu, qt::stage_dumper(cpu_dir), m, n_mel);
    const std::vector<float> emb_d = sd.embed(dev, qt::stage_dumper(dev_dir), m, n_mel);
    compare_stages(cpu_dir, dev_dir, "speaker encoder",
                   { "spk_block0", "spk_block1", "spk_block2", "spk_block3", "spk_mfa", "spk_asp" });
    check(emb_c.size() == emb_d.size() && cosine(emb_c, emb_d) >= k_min_cosine,
          "speaker embedding on the device: cosine %.6f", cosine(emb_c, emb_d));
}

int run(const std::string & path, const std::string & ref_dir) {
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
    compare_decoders(*on_cpu->loader, *on_dev->loader, cpu, dev);
    compare_speaker_encoders(*on_cpu->loader, *on_dev->loader, cpu, dev, ref_dir);
    return test::finish("the talker, the code predictor, the codec decoder and the speaker encoder on the device "
                        "agree with the CPU");
}

} // namespace

int main(int argc, char ** argv) {
    setvbuf(stdout, nullptr, _IONBF, 0);
    if (argc != 3) {
        fprintf(stderr, "usage: test-device MODEL.gguf REF_DIR\n");
        return 2;
    }
    return test::run_or_fail([&] { return run(argv[1], argv[2]); });
}
