#include "prompt.h"

#include "gguf-names.h"
#include "log.h"

#include <algorithm>

namespace qt {

namespace {

// Target text framing: 3 role ids, the text, then "<|im_end|>\n<|im_start|>assistant\n" (5).
constexpr int64_t k_role = 3, k_text_tail = 5, k_ref_tail = 2;

// dst[i] += src[i] over n vectors of width h.
void add_rows(float * dst, const float * src, int64_t n, int64_t h) {
    for (int64_t i = 0; i < n * h; ++i) {
        dst[i] += src[i];
    }
}

} // namespace

void prompt_builder::load(model_loader & ml, const talker & model) {
    talker_ = &model;
    const int64_t H = model.hparams().hidden;
    const int n_groups = ml.get_size(QT_KEY_TALKER_CODE_GROUPS);
    const int64_t cp_vocab = ml.get_size(QT_KEY_CP_VOCAB);
    if (n_groups < 2) {
        throw error(QT_STATUS_INVALID_PARAMS, format("%s: %d code groups; a 12 Hz model has 16", ml.path().c_str(), n_groups));
    }
    cp_codec_embd_.clear();
    for (int q = 0; q + 1 < n_groups; ++q) {
        cp_codec_embd_.push_back(ml.require_table("cp.codec_embd." + std::to_string(q) + ".weight", { H, cp_vocab }));
    }
    language_ids_ = ml.get_i32_array(QT_KEY_TALKER_LANG_IDS);
    codec_pad_ = int32_t(ml.get_u32(QT_KEY_CODEC_PAD_ID));
    codec_bos_ = int32_t(ml.get_u32(QT_KEY_CODEC_BOS_ID));
    think_ = int32_t(ml.get_u32(QT_KEY_CODEC_THINK_ID));
    nothink_ = int32_t(ml.get_u32(QT_KEY_CODEC_NOTHINK_ID));
    think_bos_ = int32_t(ml.get_u32(QT_KEY_CODEC_THINK_BOS_ID));
    think_eos_ = int32_t(ml.get_u32(QT_KEY_CODEC_THINK_EOS_ID));
    tts_pad_ = int32_t(ml.get_u32(QT_KEY_TEXT_TTS_PAD_ID));
    tts_bos_ = int32_t(ml.get_u32(QT_KEY_TEXT_TTS_BOS_ID));
    tts_eos_ = int32_t(ml.get_u32(QT_KEY_TEXT_TTS_EOS_ID));
    // the ids index embedding tables, so each must name a row of its table
    const auto check_id = [&](const char * what, int32_t id, int vocab) {
        if (id < 0 || id >= vocab) {
            throw error(QT_STATUS_INVALID_PARAMS, format("%s is corrupt: its %s %d is outside the vocabulary of %d",
                                                         ml.path().c_str(), what, id, vocab));
        }
    };
    const int codec_vocab = model.hparams().vocab, text_vocab = model.hparams().text_vocab;
    for (int32_t id : language_ids_) {
        check_id("language id", id, codec_vocab);
    }
    for (auto [what, id] : { std::pair{ "codec pad id", codec_pad_ }, { "codec bos id", codec_bos_ },
                             { "think id", think_ }, { "no-think id", nothink_ }, { "think bos id", think_bos_ },
                             { "think eos id", think_eos_ } }) {
        check_id(what, id, codec_vocab);
    }
    for (auto [what, id] : { std::pair{ "text pad id", tts_pad_ }, { "text bos id", tts_bos_ }, { "text eos id", tts_eos_ } }) {
        check_id(what, id, text_vocab);
    }
}

std::vector<float> prompt_builder::frame_embed(const cpu_backend & backend, const int32_t * codes,
                                               int64_t n_frames) const {
    const int n_books = n_codebooks();
    const int64_t cp_vocab = cp_codec_embd_[0].table()->ne[1];
    std::vector<std::vector<int32_t>> by_book(size_t(n_books), std::vector<int32_t>(static_cast<size_t>(n_frames)));
    for (int64_t f = 0; f < n_frames; ++f) {
        for (int q = 0; q < n_books; ++q) {
            const int32_t c = codes[f * n_books + q];
            // every codebook, the first too, has cp_vocab codes; the talker's larger vocabulary
            // adds control ids, which are no codes and which the codec decoder cannot look up
            if (c < 0 || c >= cp_vocab) {
                throw error(QT_STATUS_INVALID_PARAMS,
                            format("the voice's reference code %d of codebook %d (frame %lld) is out of range "
                                   "[0, %lld) (a damaged voice: embed the reference again)",
                                   c, q, (long long) f, (long long) cp_vocab));
            }
            by_book[size_t(q)][size_t(f)] = c;
        }
    }
    std::vector<float> sum = talker_->codec_embed(backend, by_book[0].data(), n_frames);
    stage_dumper no_dump;
    graph_run run(backend, no_dump, 8 * size_t(n_books));
    ggml_tensor * acc = nullptr;
    for (int q = 1; q < n_books; ++q) {
        ggml_tensor * ids = run.input_i32("codes", by_book[size_t(q)].data(), { n_frames });
        ggml_tensor * e = cp_codec_embd_[size_t(q - 1)].get(run.ctx(), ids);
        acc = acc ? ggml_add(run.ctx(), acc, e) : e;
    }
    run.compute(acc);
    const std::vector<float> rest = run.read_f32(acc);
    add_rows(sum.data(), rest.data(), n_frames, talker_->hparams().hidden);
    return sum;
}

prompt prompt_builder::build(const cpu_backend & backend, const stage_dumper & dumper, const prompt_request & req) const {
    const int64_t H = talker_->hparams().hidden;
    if (!req.text_ids || req.n_text_ids < k_role + 1 + k_text_tail) {
        throw error(QT_STATUS_INVALID_PARAMS, "the text is empty: no token between the prompt's role and its end");
    }
    if (!req.speaker) {
        throw error(QT_STATUS_INVALID_PARAMS, "no speaker embedding given");
    }
    if (req.language_id >= 0 &&
        std::find(language_ids_.begin(), language_ids_.end(), req.language_id) == language_ids_.end()) {
        throw error(QT_STATUS_INVALID_PARAMS, format("codec language id %d is not one of the model's languages",
                                                     req.language_id));
    }
    if (req.in_context && (!req.ref_ids || req.n_ref_ids < k_role + 1 + k_ref_tail || !req.ref_codes ||
                           req.n_ref_frames < 1)) {
        throw error(QT_STATUS_INVALID_MODE,
                    "in-context cloning needs the reference transcript and the reference codes");
    }

    auto T = [&](const int32_t * ids, int64_t n) { return talker_->text_embed(backend, ids, n); };
    const int32_t specials[3] = { tts_bos_, tts_eos_, tts_pad_ };
    const std::vector<float> tts = T(specials, 3);
    const float * tts_bos = tts.data();
    const float * tts_eos = tts.data() + H;
    const float * tts_pad = tts.data() + 2 * H;

    // codec side of the head: tags, speaker, pad, bos
    std::vector<int32_t> tags = req.language_id < 0 ? std::vector<int32_t>{ nothink_, think_bos_, think_eos_ }
                                                    : std::vector<int32_t>{ think_, think_bos_, req.language_id,
                                                                            think_eos_ };
    std::vector<float> codec = talker_->codec_embed(backend, tags.data(), int64_t(tags.size()));
    codec.insert(codec.end(), req.speaker, req.speaker + H);
    const int32_t pad_bos[2] = { codec_pad_, codec_bos_ };
    const std::vector<float> pb = talker_->codec_embed(backend, pad_bos, 2);
    codec.insert(codec.end(), pb.begin(), pb.end());
    const int64_t n_codec = int64_t(codec.size()) / H;

    prompt p;
    p.hidden = H;
    p.tts_pad.assign(tts_pad, tts_pad + H);
    p.prefill = T(req.text_ids, k_role);
    for (int64_t i = 0; i + 1 < n_codec; ++i) {  // text side: pad ... pad, bos over codec[:-1]
        const float * text_side = i + 2 < n_codec ? tts_pad : tts_bos;
        for (int64_t c = 0; c < H; ++c) {
            p.prefill.push_back(text_side[c] + codec[size_t(i * H + c)]);
        }
    }
    const float * codec_bos = codec.data() + (n_codec - 1) * H;

    const int32_t * text = req.text_ids + k_role;
    const int64_t   n_text = req.n_text_ids - k_role - k_text_tail;
    if (!req.in_context) {
        std::vector<float> first = T(text, 1);
        add_rows(first.data(), codec_bos, 1, H);
        p.prefill.insert(p.prefill.end(), first.begin(), first.end());
        p.trailing = T(text + 1, n_text - 1);
        p.trailing.insert(p.trailing.end(), tts_eos, tts_eos + H);
    } else {
        std::vector<int32_t> ids(req.ref_ids + k_role, req.ref_ids + req.n_ref_ids - k_ref_tail);
        ids.insert(ids.end(), text, text + n_text);
        std::vector<float> text_side = T(ids.data(), int64_t(ids.size()));
        text_side.insert(text_side.end(), tts_eos, tts_eos + H);
        std::vector<float> codec_side(codec_bos, codec_bos + H);
        const std::vector<float> frames = frame_embed(backend, req.ref_codes, req.n_ref_frames);
        codec_side.insert(codec_side.end(), frames.begin(), frames.end());
        const int64_t n_text_side = int64_t(text_side.size()) / H;
        const int64_t n_codec_side = int64_t(codec_side.size()) / H;
        for (int64_t i = n_text_side; i < n_codec_side; ++i) {  // a short text is padded
            text_side.insert(text_side.end(), tts_pad, tts_pad + H);
        }
        add_rows(codec_side.data(), text_side.data(), n_codec_side, H);
        p.prefill.insert(p.prefill.end(), codec_side.begin(), codec_side.end());
        p.trailing.assign(text_side.begin() + n_codec_side * H, text_side.begin() + std::max(n_text_side, n_codec_side) * H);
    }
    p.n_prefill = int64_t(p.prefill.size()) / H;
    p.n_trailing = int64_t(p.trailing.size()) / H;
    if (dumper.enabled()) {
        dumper.write("prefill_embeds", p.prefill.data(), { p.n_prefill, H });
        dumper.write("trailing_text", p.trailing.data(), { p.n_trailing, H });
        dumper.write("tts_pad_embed", p.tts_pad.data(), { H });
    }
    return p;
}

} // namespace qt
