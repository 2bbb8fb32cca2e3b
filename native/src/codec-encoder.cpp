#include "codec-encoder.h"

#include "cpu-ops.h"
#include "gguf-names.h"
#include "log.h"

#include "ggml-alloc.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace qt {

namespace {

pad_mode parse_pad_mode(const std::string & path, const std::string & mode) {
    if (mode == "constant") {
        return pad_mode::zeros;
    }
    if (mode == "replicate") {
        return pad_mode::replicate;
    }
    if (mode == "reflect") {
        return pad_mode::reflect;
    }
    throw error(QT_STATUS_INVALID_PARAMS, format("%s: unsupported codec encoder pad mode '%s'", path.c_str(), mode.c_str()));
}

} // namespace

codec_encoder::conv codec_encoder::load_conv(model_loader & ml, const std::string & name, int64_t c_in, int64_t c_out,
                                             int kernel, int stride, int dilation, pad_mode pad, bool bias) {
    conv c;
    c.w = ml.require(name + ".weight", { c_in, kernel, c_out });
    c.b = bias ? ml.require(name + ".bias", { c_out }) : nullptr;
    c.kernel = kernel;
    c.stride = stride;
    c.dilation = dilation;
    c.pad = pad;
    return c;
}

void codec_encoder::load(model_loader & ml) {
    const std::string & path = ml.path();
    // the config's sliding_window is unused by transformers' encoder (full causal attention)
    static_cast<codec_hparams &>(hp_) = read_codec_hparams(ml, QT_CODEC_ENCODER, QT_KEY_CENC_NORM_EPS, "codec encoder");
    hp_.num_filters = ml.get_size(QT_KEY_CENC_NUM_FILTERS);
    hp_.residual_layers = ml.get_size(QT_KEY_CENC_RES_LAYERS);
    hp_.ratios = ml.get_i32_array(QT_KEY_CENC_RATIOS);
    hp_.kernel_size = ml.get_size(QT_KEY_CENC_KERNEL);
    hp_.last_kernel_size = ml.get_size(QT_KEY_CENC_LAST_KERNEL);
    hp_.residual_kernel_size = ml.get_size(QT_KEY_CENC_RES_KERNEL);
    hp_.dilation_growth = ml.get_size(QT_KEY_CENC_DILATION_GROWTH);
    hp_.compress = ml.get_size(QT_KEY_CENC_COMPRESS);
    hp_.semantic_quantizers = ml.get_size(QT_KEY_CENC_SEMANTIC_Q);
    hp_.valid_quantizers = ml.get_size(QT_KEY_CENC_VALID_Q);
    hp_.pad = parse_pad_mode(path, ml.get_str(QT_KEY_CENC_PAD_MODE));
    const float frame_rate = ml.get_f32(QT_KEY_CENC_FRAME_RATE);
    const float encoder_frame_rate = ml.get_f32(QT_KEY_CENC_ENCODER_FRAME_RATE);

    // MimiModel's downsample: kernel 2 * int(encodec_frame_rate / frame_rate), stride 2 (fixed)
    // (the rate ratio is bounded before it becomes an int: a float past INT_MAX has no int value)
    const double rate_ratio = frame_rate > 0.0f ? double(encoder_frame_rate) / frame_rate : 0.0;
    hp_.downsample_kernel = rate_ratio >= 1.0 && rate_ratio <= 1024.0 ? 2 * int(rate_ratio) : 0;
    hp_.downsample_stride = 2;

    // The product of the ratios stops growing past any real hop, so that it cannot overflow.
    int64_t hop = 1;
    bool    ratios_ok = !hp_.ratios.empty() && hp_.ratios.size() < 16;
    for (int32_t r : hp_.ratios) {
        ratios_ok = ratios_ok && r > 0;
        hop = std::min<int64_t>(hop * std::max(r, 1), int64_t(1) << 32);
    }
    // get_size() already refused zero sizes; what is left is how the sizes fit together.
    const bool geometry_ok =
        ratios_ok && hp_.valid_quantizers >= hp_.semantic_quantizers &&
        hp_.downsample_kernel >= hp_.downsample_stride && encoder_frame_rate != frame_rate &&
        hop * hp_.downsample_stride == hp_.frame_samples &&
        (int64_t(hp_.num_filters) << hp_.ratios.size()) % hp_.compress == 0;
    if (!geometry_ok) {
        throw error(QT_STATUS_INVALID_PARAMS,
                    format("%s: unsupported codec encoder geometry (%zu SEANet ratios with hop %lld, frame %d samples, "
                           "downsample kernel %d, %d/%d heads, %d/%d quantizers)",
                           path.c_str(), hp_.ratios.size(), (long long) hop, hp_.frame_samples, hp_.downsample_kernel,
                           hp_.heads, hp_.kv_heads, hp_.semantic_quantizers, hp_.valid_quantizers));
    }

    // SEANet (MimiEncoder): HF layer indices are kept in the tensor names. Layer 0 is the input
    // conv; each stage (ratios reversed) has `residual_layers` resnet blocks, an ELU and the
    // strided conv; then an ELU and the output conv.
    const std::string pre = "cenc.seanet.";
    first_ = load_conv(ml, pre + "0", 1, hp_.num_filters, hp_.kernel_size, 1, 1, hp_.pad, true);
    int     index = 1;
    int64_t dim = hp_.num_filters;
    stages_.clear();
    for (auto it = hp_.ratios.rbegin(); it != hp_.ratios.rend(); ++it) {
        const int    ratio = *it;
        seanet_stage st;
        int          dilation = 1;
        for (int j = 0; j < hp_.residual_layers; ++j) {
            const std::string p = pre + std::to_string(index++) + ".block";
            res_block rb;
            rb.c1 = load_conv(ml, p + "1", dim, dim / hp_.compress, hp_.residual_kernel_size, 1, dilation, hp_.pad, true);
            rb.c2 = load_conv(ml, p + "3", dim / hp_.compress, dim, 1, 1, 1, hp_.pad, true);
            st.res.push_back(rb);
            dilation *= hp_.dilation_growth;
        }
        ++index;  // ELU
        st.down = load_conv(ml, pre + std::to_string(index++), dim, 2 * dim, 2 * ratio, ratio, 1, hp_.pad, true);
        stages_.push_back(std::move(st));
        dim *= 2;
    }
    ++index;  // ELU
    last_ = load_conv(ml, pre + std::to_string(index), dim, hp_.hidden, hp_.last_kernel_size, 1, 1, hp_.pad, true);

    const int64_t H = hp_.hidden;
    const int64_t q_dim = int64_t(hp_.heads) * hp_.head_dim;
    const int64_t kv_dim = int64_t(hp_.kv_heads) * hp_.head_dim;
    layers_.clear();
    for (int i = 0; i < hp_.layers; ++i) {
        const std::string p = "cenc.blk." + std::to_string(i) + ".";
        layer l;
        l.attn_norm_w = ml.require(p + "attn_norm.weight", { H });
        l.attn_norm_b = ml.require(p + "attn_norm.bias", { H });
        l.q = ml.require(p + "attn_q.weight", { H, q_dim });
        l.k = ml.require(p + "attn_k.weight", { H, kv_dim });
        l.v = ml.require(p + "attn_v.weight", { H, kv_dim });
        l.o = ml.require(p + "attn_o.weight", { q_dim, H });
        l.attn_scale = ml.require(p + "attn_scale", { H });
        l.ffn_norm_w = ml.require(p + "ffn_norm.weight", { H });
        l.ffn_norm_b = ml.require(p + "ffn_norm.bias", { H });
        l.up = ml.require(p + "ffn_up.weight", { H, hp_.ffn });
        l.down = ml.require(p + "ffn_down.weight", { hp_.ffn, H });
        l.ffn_scale = ml.require(p + "ffn_scale", { H });
        layers_.push_back(l);
    }
    downsample_ = load_conv(ml, "cenc.downsample", H, H, hp_.downsample_kernel, hp_.downsample_stride, 1,
                            pad_mode::replicate, false);

    // Split RVQ: both groups quantize the latent (each through its own input projection); the
    // acoustic group does not see the semantic residual.
    auto load_rvq = [&](const std::string & p, int n_books) {
        rvq q;
        // MimiResidualVectorQuantizer has no input_proj when the dimensions agree
        if (ml.has_tensor(p + ".in_proj.weight") || H != hp_.codebook_dim) {
            q.in_proj = ml.require(p + ".in_proj.weight", { H, 1, hp_.codebook_dim });
        }
        for (int j = 0; j < n_books; ++j) {
            q.codebooks.push_back(ml.require(p + ".codebook." + std::to_string(j), { hp_.codebook_dim, hp_.codebook_size }));
        }
        return q;
    };
    semantic_ = load_rvq("cenc.rvq_sem", hp_.semantic_quantizers);
    acoustic_ = load_rvq("cenc.rvq_ac", hp_.valid_quantizers - hp_.semantic_quantizers);

    prepare_codebook_norms(ml);
}

// Squared codebook norms for the nearest-neighbour search, computed once on the host into a
// buffer of our own. The codebooks' mapped pages are given back afterwards: only embedding a
// voice reads them again, and a synthesis never does.
void codec_encoder::prepare_codebook_norms(model_loader & ml) {
    const size_t n_books = semantic_.codebooks.size() + acoustic_.codebooks.size();
    derived_ctx_ = new_metadata_context(n_books + 1, false, "codec encoder's weight context");
    ggml_context * ctx = derived_ctx_.get();
    for (rvq * q : { &semantic_, &acoustic_ }) {
        q->norms.clear();
        for (size_t j = 0; j < q->codebooks.size(); ++j) {
            q->norms.push_back(ggml_new_tensor_1d(ctx, GGML_TYPE_F32, hp_.codebook_size));
        }
    }
    derived_buf_.reset(ggml_backend_alloc_ctx_tensors_from_buft(ctx, ggml_backend_cpu_buffer_type()));
    if (!derived_buf_) {
        throw error(QT_STATUS_OUT_OF_MEMORY, format("not enough memory for the codec encoder of %s", ml.path().c_str()));
    }
    ggml_backend_buffer_set_usage(derived_buf_.get(), GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    for (rvq * q : { &semantic_, &acoustic_ }) {
        for (size_t j = 0; j < q->codebooks.size(); ++j) {
            const std::vector<float> cb = tensor_f32(q->codebooks[j]);
            std::vector<float>       norms(size_t(hp_.codebook_size));
            for (int64_t e = 0; e < hp_.codebook_size; ++e) {
                double acc = 0.0;
                for (int64_t d = 0; d < hp_.codebook_dim; ++d) {
                    const double v = cb[size_t(e * hp_.codebook_dim + d)];
                    acc += v * v;
                }
                norms[size_t(e)] = float(acc);
            }
            ggml_backend_tensor_set(q->norms[j], norms.data(), 0, norms.size() * sizeof(float));
            ml.release(q->codebooks[j]);
        }
    }
}

// MimiConv1d in causal mode: left padding (K - 1) * dilation + 1 - stride, and right padding
// so that the last window is complete, both in the conv's pad mode. The output has
// ceil(T / stride) frames. With `elu`, the conv reads ELU(x) (fused with the zero padding);
// `residual` (C_out, T_out) is added to the output, which may take over its memory.
ggml_tensor * codec_encoder::conv_forward(ggml_context * ctx, ggml_tensor * x, const conv & c, bool elu,
                                          ggml_tensor * residual) const {
    const int64_t T = x->ne[1];
    const int64_t s = c.stride;
    const int64_t k_eff = int64_t(c.kernel - 1) * c.dilation + 1;
    const int64_t left = k_eff - s;
    const int64_t n_out = (T + s - 1) / s;
    const int64_t right = n_out * s - T;
    if (elu && c.pad == pad_mode::zeros) {
        x = elu_pad(ctx, x, left, right);
    } else {
        if (elu) {
            x = ggml_elu(ctx, x);
        }
        if (c.pad == pad_mode::reflect && T <= std::max(left, right)) {
            // MimiConv1d._pad1d zero-extends such short inputs first; never the case at >= 1 s
            throw error(QT_STATUS_INVALID_PARAMS, "codec encoder: input too short for reflect padding");
        }
        x = pad_time(ctx, x, int(left), int(right), c.pad);
    }
    if (!ggml_is_contiguous(x)) {
        x = ggml_cont(ctx, x);
    }
    ggml_tensor * y = conv1d(ctx, x, c.w, c.b, int(s), c.dilation, residual);
    GGML_ASSERT(y->ne[1] == n_out);
    return y;
}

ggml_tensor * codec_encoder::transformer_layer(ggml_context * ctx, ggml_tensor * x, ggml_tensor * pos,
                                               const layer & l) const {
    const int64_t T = x->ne[1];
    const int     hd = hp_.head_dim;
    ggml_tensor * h = layer_norm(ctx, x, l.attn_norm_w, l.attn_norm_b, hp_.norm_eps);

    // RoPE with rotate_half (NEOX layout), theta rope_theta, positions 0..T-1
    auto rope = [&](ggml_tensor * t) {
        return ggml_rope_ext(ctx, t, pos, nullptr, hd, GGML_ROPE_TYPE_NEOX, 0, hp_.rope_theta, 1.0f, 0.0f, 1.0f,
                             0.0f, 0.0f);
    };
    ggml_tensor * q = rope(ggml_reshape_3d(ctx, dense(ctx, l.q, h), hd, hp_.heads, T));
    ggml_tensor * k = rope(ggml_reshape_3d(ctx, dense(ctx, l.k, h), hd, hp_.kv_heads, T));
    ggml_tensor * v = ggml_reshape_3d(ctx, dense(ctx, l.v, h), hd, hp_.kv_heads, T);

    q = ggml_permute(ctx, q, 0, 2, 1, 3);                                 // (hd, T, heads)
    k = ggml_permute(ctx, k, 0, 2, 1, 3);                                 // (hd, T, kv_heads)
    ggml_tensor * vt = ggml_cont(ctx, ggml_permute(ctx, v, 1, 2, 0, 3));  // (T, hd, kv_heads)

    // Full causal attention: transformers' MimiTransformerModel builds its mask with
    // create_causal_mask, which ignores config.sliding_window (250 frames = 10 s), so clips
    // longer than that attend to their whole past in the reference too.
    ggml_tensor * kq = dense(ctx, k, q);  // (T_k, T_q, heads)
    kq = ggml_diag_mask_inf(ctx, kq, 0);
    kq = ggml_soft_max_ext(ctx, kq, nullptr, 1.0f / std::sqrt(float(hd)), 0.0f);
    ggml_tensor * a = dense(ctx, vt, kq);  // (hd, T, heads)
    a = ggml_cont(ctx, ggml_permute(ctx, a, 0, 2, 1, 3));
    a = dense(ctx, l.o, ggml_reshape_2d(ctx, a, int64_t(hd) * hp_.heads, T));
    x = ggml_add(ctx, x, ggml_mul(ctx, a, l.attn_scale));

    h = layer_norm(ctx, x, l.ffn_norm_w, l.ffn_norm_b, hp_.norm_eps);
    h = dense(ctx, l.down, ggml_gelu_erf(ctx, dense(ctx, l.up, h)));  // exact (erf) GELU
    return ggml_add(ctx, x, ggml_mul(ctx, h, l.ffn_scale));
}

// Residual vector quantization of latent = (hidden, T) with the first n_books codebooks:
// nearest entry by euclidean distance, i.e. argmax over entries of 2 r.c - |c|^2.
std::vector<ggml_tensor *> codec_encoder::quantize(ggml_context * ctx, ggml_tensor * latent, const rvq & q,
                                                   int n_books) const {
    ggml_tensor * r = latent;
    if (q.in_proj) {
        r = dense(ctx, ggml_reshape_2d(ctx, q.in_proj, q.in_proj->ne[0], q.in_proj->ne[2]), latent);
    }
    std::vector<ggml_tensor *> codes;
    for (int j = 0; j < n_books; ++j) {
        ggml_tensor * cb = q.codebooks[size_t(j)];
        ggml_tensor * score = ggml_sub(ctx, ggml_scale(ctx, dense(ctx, cb, r), 2.0f), q.norms[size_t(j)]);
        ggml_tensor * idx = ggml_argmax(ctx, score);  // (T) i32
        codes.push_back(idx);
        if (j + 1 < n_books) {
            r = ggml_sub(ctx, r, ggml_get_rows(ctx, cb, idx));
        }
    }
    return codes;
}

std::vector<int32_t> codec_encoder::encode(const cpu_backend & backend, const stage_dumper & dumper, const float * pcm,
                                           int64_t n_samples, int64_t * n_frames) const {
    if (n_samples <= 0) {
        throw error(QT_STATUS_INVALID_PARAMS, "codec encoder: empty clip");
    }
    graph_run     run(backend, dumper, 8192);
    ggml_context * ctx = run.ctx();

    // SEANet: (1, N) at 24 kHz -> (hidden, T25)
    ggml_tensor * x = run.input_f32("pcm", pcm, { 1, n_samples });
    x = conv_forward(ctx, x, first_);
    for (const seanet_stage & st : stages_) {
        for (const res_block & rb : st.res) {
            ggml_tensor * h = conv_forward(ctx, x, rb.c1, true);
            x = conv_forward(ctx, h, rb.c2, true, x);  // x + conv(ELU(h)), into x's memory
        }
        x = conv_forward(ctx, x, st.down, true);
    }
    x = conv_forward(ctx, x, last_, true);
    x = run.stage(x, "enc_seanet");

    const int64_t T25 = x->ne[1];
    std::vector<int32_t> positions(static_cast<size_t>(T25));
    for (int64_t t = 0; t < T25; ++t) {
        positions[size_t(t)] = int32_t(t);
    }
    ggml_tensor * pos = run.input_i32("positions", positions.data(), { T25 });
    for (const layer & l : layers_) {
        x = transformer_layer(ctx, x, pos, l);
    }
    x = run.stage(x, "enc_transformer");

    x = run.stage(conv_forward(ctx, x, downsample_), "enc_latent");
    const int64_t T12 = x->ne[1];

    std::vector<ggml_tensor *> books = quantize(ctx, x, semantic_, hp_.semantic_quantizers);
    std::vector<ggml_tensor *> acoustic = quantize(ctx, x, acoustic_, hp_.valid_quantizers - hp_.semantic_quantizers);
    books.insert(books.end(), acoustic.begin(), acoustic.end());

    ggml_tensor * all = ggml_reshape_2d(ctx, books[0], T12, 1);
    for (size_t q = 1; q < books.size(); ++q) {
        all = ggml_concat(ctx, all, ggml_reshape_2d(ctx, books[q], T12, 1), 1);
    }
    run.compute(all);  // (T12, Q): codebook-major

    // Qwen3TTSTokenizerV2Model.encode keeps ceil(n_samples / frame_samples) frames
    const int64_t keep = (n_samples + hp_.frame_samples - 1) / hp_.frame_samples;
    if (keep > T12) {
        throw error(QT_STATUS_FAILED, format("codec encoder produced %lld frames, %lld expected", (long long) T12,
                                             (long long) keep));
    }
    const int64_t              Q = int64_t(books.size());
    const std::vector<int32_t> by_book = run.read_i32(all);
    std::vector<int32_t>       codes(size_t(keep * Q));
    for (int64_t q = 0; q < Q; ++q) {
        for (int64_t t = 0; t < keep; ++t) {
            codes[size_t(t * Q + q)] = by_book[size_t(q * T12 + t)];
        }
    }
    if (dumper.enabled()) {
        dumper.write("ref_codes", codes.data(), { keep, Q });
    }
    *n_frames = keep;
    return codes;
}

} // namespace qt
