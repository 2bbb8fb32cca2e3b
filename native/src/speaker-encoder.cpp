#include "speaker-encoder.h"

#include "cpu-ops.h"
#include "gguf-names.h"
#include "log.h"

#include <cmath>

namespace qt {

namespace {

// Mean over time of x = (C, T) -> (C, 1).
ggml_tensor * time_mean(ggml_context * ctx, ggml_tensor * x) {
    ggml_tensor * xt = ggml_cont(ctx, ggml_transpose(ctx, x));  // (T, C)
    return ggml_reshape_2d(ctx, ggml_mean(ctx, xt), x->ne[0], 1);
}

// Weighted mean and std over time: xt, w = (T, C), weights summing to 1 over T.
// Returns (mean, std), each (1, C); std = sqrt(max(var, eps)).
std::pair<ggml_tensor *, ggml_tensor *> weighted_stats(ggml_context * ctx, ggml_tensor * xt, ggml_tensor * w,
                                                       float eps) {
    ggml_tensor * mean = ggml_sum_rows(ctx, ggml_mul(ctx, xt, w));
    ggml_tensor * dev = ggml_sub(ctx, xt, mean);
    ggml_tensor * var = ggml_sum_rows(ctx, ggml_mul(ctx, w, ggml_sqr(ctx, dev)));
    return { mean, ggml_sqrt(ctx, ggml_clamp(ctx, var, eps, INFINITY)) };
}

} // namespace

void speaker_encoder::load(model_loader & ml) {
    hp_.mel_dim = ml.get_size(QT_KEY_SPK_MEL_DIM);
    hp_.enc_dim = ml.get_size(QT_KEY_SPK_ENC_DIM);
    hp_.channels = ml.get_i32_array(QT_KEY_SPK_CHANNELS);
    hp_.kernel_sizes = ml.get_i32_array(QT_KEY_SPK_KERNEL_SIZES);
    hp_.dilations = ml.get_i32_array(QT_KEY_SPK_DILATIONS);
    hp_.attention_channels = ml.get_size(QT_KEY_SPK_ATTN_CHANNELS);
    hp_.res2net_scale = ml.get_size(QT_KEY_SPK_RES2NET_SCALE);
    hp_.se_channels = ml.get_size(QT_KEY_SPK_SE_CHANNELS);
    hp_.sample_rate = ml.get_size(QT_KEY_SPK_SAMPLE_RATE);

    const size_t n_layers = hp_.channels.size();
    if (n_layers != 5 || hp_.kernel_sizes.size() != n_layers || hp_.dilations.size() != n_layers ||
        hp_.mel_dim != 128 || hp_.res2net_scale < 2) {
        throw error(QT_STATUS_INVALID_PARAMS,
                    format("%s: unsupported speaker encoder geometry (%zu layers, mel_dim %d, scale %d)",
                           ml.path().c_str(), n_layers, hp_.mel_dim, hp_.res2net_scale));
    }
    const auto & ch = hp_.channels;
    auto load_conv = [&](const std::string & name, int64_t c_in, int64_t c_out, int64_t k, int dilation) {
        conv c;
        c.w = ml.require(name + ".weight", { c_in, k, c_out });
        c.b = ml.require(name + ".bias", { c_out });
        c.dilation = dilation;
        return c;
    };
    frontend_ = load_conv("spk.blk.0.conv", hp_.mel_dim, ch[0], hp_.kernel_sizes[0], hp_.dilations[0]);
    for (size_t i = 1; i + 1 < n_layers; ++i) {
        const std::string p = "spk.blk." + std::to_string(i);
        const int64_t c = ch[i];
        if (c % hp_.res2net_scale != 0) {
            throw error(QT_STATUS_INVALID_PARAMS, format("%s: speaker encoder width %lld is not a multiple of %d",
                                                         ml.path().c_str(), (long long) c, hp_.res2net_scale));
        }
        se_res2net_block blk;
        blk.tdnn1 = load_conv(p + ".tdnn1", ch[i - 1], c, 1, 1);
        for (int j = 0; j + 1 < hp_.res2net_scale; ++j) {
            const int64_t cs = c / hp_.res2net_scale;
            blk.res2net.push_back(load_conv(p + ".res2net." + std::to_string(j), cs, cs, hp_.kernel_sizes[i],
                                            hp_.dilations[i]));
        }
        blk.tdnn2 = load_conv(p + ".tdnn2", c, c, 1, 1);
        blk.se1 = load_conv(p + ".se1", c, hp_.se_channels, 1, 1);
        blk.se2 = load_conv(p + ".se2", hp_.se_channels, c, 1, 1);
        blocks_.push_back(std::move(blk));
    }
    const int64_t c_last = ch[n_layers - 1];
    int64_t mfa_in = 0;
    for (size_t i = 1; i + 1 < n_layers; ++i) {
        mfa_in += ch[i];
    }
    mfa_ = load_conv("spk.mfa", mfa_in, c_last, hp_.kernel_sizes[n_layers - 1], hp_.dilations[n_layers - 1]);
    asp_tdnn_ = load_conv("spk.asp.tdnn", 3 * c_last, hp_.attention_channels, 1, 1);
    asp_conv_ = load_conv("spk.asp.conv", hp_.attention_channels, c_last, 1, 1);
    fc_ = load_conv("spk.fc", 2 * c_last, hp_.enc_dim, 1, 1);
}

// Conv1d with "same" reflect padding, then ReLU.
ggml_tensor * speaker_encoder::tdnn(ggml_context * ctx, ggml_tensor * x, const conv & c) const {
    const int total = c.dilation * int(c.w->ne[1] - 1);
    x = pad_time(ctx, x, total / 2, total - total / 2, pad_mode::reflect);
    return ggml_relu(ctx, conv1d(ctx, x, c.w, c.b, 1, c.dilation));
}

std::vector<float> speaker_encoder::embed(const compute_backend & backend, const stage_dumper & dumper,
                                          const std::vector<float> & mel, int64_t n_frames) const {
    graph_run run(backend, dumper, 8192);
    ggml_context * ctx = run.ctx();
    ggml_tensor * x = run.input_f32("mel", mel.data(), { hp_.mel_dim, n_frames });

    x = run.stage(tdnn(ctx, x, frontend_), "spk_block0");
    std::vector<ggml_tensor *> block_outputs;
    for (size_t i = 0; i < blocks_.size(); ++i) {
        const se_res2net_block & blk = blocks_[i];
        ggml_tensor * h = tdnn(ctx, x, blk.tdnn1);
        // Res2Net: part 0 passes through, part j convolves slice j (plus part j - 1 from j = 2).
        // tdnn2 is a 1x1 conv over the parts side by side, i.e. a sum over parts of the matching
        // column block of its weight times the part, so the parts are never concatenated.
        const int64_t C = h->ne[0];
        const int64_t T = h->ne[1];
        const int64_t cs = C / hp_.res2net_scale;
        ggml_tensor * w2 = ggml_reshape_2d(ctx, blk.tdnn2.w, C, C);
        auto slice = [&](ggml_tensor * t, int64_t j) {
            return ggml_view_2d(ctx, t, cs, t->ne[1], t->nb[1], size_t(j * cs) * ggml_element_size(t));
        };
        ggml_tensor * mixed = dense(ctx, slice(w2, 0), slice(h, 0), blk.tdnn2.b);
        ggml_tensor * part = nullptr;
        for (int j = 1; j < hp_.res2net_scale; ++j) {
            ggml_tensor * in = j == 1 ? slice(h, j) : ggml_add(ctx, slice(h, j), part);
            part = tdnn(ctx, in, blk.res2net[size_t(j - 1)]);
            mixed = dense(ctx, slice(w2, j), part, nullptr, mixed, true);
        }
        GGML_ASSERT(mixed->ne[1] == T);
        h = ggml_relu(ctx, mixed);
        ggml_tensor * s = time_mean(ctx, h);
        s = ggml_relu(ctx, conv1d(ctx, s, blk.se1.w, blk.se1.b, 1, 1));
        s = ggml_sigmoid(ctx, conv1d(ctx, s, blk.se2.w, blk.se2.b, 1, 1));
        x = ggml_add(ctx, ggml_mul(ctx, h, s), x);
        x = run.stage(x, "spk_block" + std::to_string(i + 1));
        block_outputs.push_back(x);
    }

    ggml_tensor * cat = block_outputs[0];
    for (size_t i = 1; i < block_outputs.size(); ++i) {
        cat = ggml_concat(ctx, cat, block_outputs[i], 0);
    }
    x = run.stage(tdnn(ctx, cat, mfa_), "spk_mfa");

    // attentive statistics pooling; every frame is valid, so the global statistics are plain
    // mean and (biased) std over time
    const float eps = 1e-12f;
    const int64_t C = x->ne[0];
    ggml_tensor * xt = ggml_cont(ctx, ggml_transpose(ctx, x));  // (T, C)
    ggml_tensor * mean0 = ggml_mean(ctx, xt);  // (1, C)
    ggml_tensor * var0 = ggml_mean(ctx, ggml_sqr(ctx, ggml_sub(ctx, xt, mean0)));
    ggml_tensor * std0 = ggml_sqrt(ctx, ggml_clamp(ctx, var0, eps, INFINITY));
    // The attention TDNN sees [x; mean; std] with mean and std repeated over time: its 1x1 conv
    // splits into W_x x plus a per-channel constant W_m mean + W_s std, folded into the bias
    // instead of materialising the (3C, T) input.
    ggml_tensor * w_att = ggml_reshape_2d(ctx, asp_tdnn_.w, 3 * C, asp_tdnn_.w->ne[2]);
    auto block = [&](int64_t j) { return ggml_view_2d(ctx, w_att, C, w_att->ne[1], w_att->nb[1], size_t(j * C) * sizeof(float)); };
    ggml_tensor * bias = dense(ctx, block(1), ggml_reshape_2d(ctx, mean0, C, 1), asp_tdnn_.b);
    bias = dense(ctx, block(2), ggml_reshape_2d(ctx, std0, C, 1), nullptr, bias, true);  // (att, 1)
    ggml_tensor * att = ggml_tanh(ctx, ggml_relu(ctx, ggml_add(ctx, dense(ctx, block(0), x), bias)));
    att = conv1d(ctx, att, asp_conv_.w, asp_conv_.b, 1, 1);                                           // (C, T)
    ggml_tensor * weights = ggml_soft_max(ctx, ggml_cont(ctx, ggml_transpose(ctx, att)));             // (T, C)
    auto [mean, std] = weighted_stats(ctx, xt, weights, eps);
    ggml_tensor * pooled = ggml_reshape_2d(ctx, ggml_concat(ctx, mean, std, 1), 2 * C, 1);
    pooled = run.stage(pooled, "spk_asp");

    ggml_tensor * emb = conv1d(ctx, pooled, fc_.w, fc_.b, 1, 1);
    emb = run.stage(ggml_reshape_1d(ctx, emb, hp_.enc_dim), "speaker_embedding");
    run.compute(emb);
    return run.read_f32(emb);
}

} // namespace qt
