#include "codec-decoder.h"

#include "cpu-ops.h"
#include "gguf-names.h"
#include "log.h"
#include "winograd.h"

#include <algorithm>
#include <initializer_list>
#include <cmath>
#include <cstring>
#include <limits>

namespace qt {

namespace {

// Taps of every residual unit's dilated convolution (fixed by the architecture).
constexpr int k_res_kernel = 7;
constexpr int k_res_dilations[] = { 1, 3, 9 };
constexpr int k_dw_kernel = 7;       // ConvNeXt depthwise conv
constexpr int k_conv_kernel = 7;     // decoder input and output convs
constexpr int k_pre_conv_kernel = 3;
constexpr float k_convnext_eps = 1e-6f;
// Frames per graph of the convolutions (codec_stream::run).
constexpr int64_t k_conv_slice_frames = 8;
// Tiles of a transposed convolution's input in one graph from which F(4, 2) computes its phases.
constexpr int64_t k_min_winograd_tiles = 32;
// Frames per graph of the transformer while priming: a minute of reference in one graph would
// hold its attention scores for every pair of frames (36 MB a layer at 750 frames, 16 heads).
constexpr int64_t k_prime_slice_frames = 16;
// The largest transformer window a model may declare, in frames (the real checkpoints: 72).
constexpr int32_t k_max_sliding_window = 4096;

size_t row_bytes(const ggml_tensor * t) { return ggml_row_size(t->type, t->ne[0]); }

const stage_dumper & no_dumps() {
    static const stage_dumper none;
    return none;
}

} // namespace

// ---- loading ---------------------------------------------------------------------------------

codec_decoder::conv codec_decoder::load_conv(model_loader & ml, const std::string & name, int64_t c_in,
                                             int64_t c_out, int kernel, int dilation, bool bias) {
    conv c;
    c.w = ml.require(name + ".weight", { c_in, kernel, c_out });
    c.b = bias ? ml.require(name + ".bias", { c_out }) : nullptr;
    c.kernel = kernel;
    c.dilation = dilation;
    c.c_in = c_in;
    c.history = int64_t(dilation) * (kernel - 1);
    if (c.history > 0) {
        c.slot = n_slots_++;
        slot_channels_.push_back(c_in);
        slot_frames_.push_back(c.history);
    }
    return c;
}

ggml_tensor * codec_decoder::derived_tensor(ggml_type type, std::initializer_list<int64_t> ne, const void * data) {
    ggml_tensor * t = ggml_new_tensor(derived_ctx_.get(), type, int(ne.size()), ne.begin());
    const auto *  bytes = static_cast<const uint8_t *>(data);
    pending_.push_back({ t, std::vector<uint8_t>(bytes, bytes + ggml_nbytes(t)) });
    return t;
}

packed_weight codec_decoder::packed_rows(const uint16_t * rows, int64_t k, int64_t n) {
    const std::vector<uint16_t> panels = pack_weight_panels(rows, k, n);
    packed_weight               p;
    p.panels = derived_tensor(GGML_TYPE_F16, { int64_t(panels.size()) }, panels.data());
    p.k = k;
    p.n = n;
    return p;
}

packed_weight codec_decoder::pack_matrix(model_loader & ml, ggml_tensor * w, int64_t k, int64_t n) {
    if (w->type != GGML_TYPE_F16 || !ggml_is_contiguous(w) || ggml_nelements(w) != k * n || !cpu_kernels_ ||
        !packed_weights_supported()) {
        packed_weight p;
        p.plain = w;
        p.k = k;
        p.n = n;
        return p;
    }
    std::vector<uint16_t> rows(static_cast<size_t>(k * n));
    ggml_backend_tensor_get(w, rows.data(), 0, rows.size() * sizeof(uint16_t));
    ml.release(w);
    return packed_rows(rows.data(), k, n);
}

void codec_decoder::pack_conv(model_loader & ml, conv & c) {
    c.packed = pack_matrix(ml, c.w, c.c_in * c.kernel, c.w->ne[2]);
    if (c.packed.panels) {
        c.w = nullptr;
    }
}

bool codec_decoder::winograd_takes(ggml_type type, int taps) const {
    // a device convolves the taps with ggml's products
    return cpu_kernels_ && dense_taps_supported(type) && winograd_taps_supported(taps);
}

void codec_decoder::to_winograd(conv & c, int64_t frame_samples) {
    c.winograd = winograd_takes(c.w->type, c.kernel);
    if (c.winograd) {
        c.frame_samples = frame_samples;
        const int64_t span = int64_t(k_winograd_outputs) * c.dilation;
        // where every frame holds whole tiles, the stream's chunks start at a tile
        c.tile_history = frame_samples % span == 0 ? 0 : span - 1;
        slot_frames_[size_t(c.slot)] += c.tile_history;
    }
}

// Output sample n of a transposed conv with kernel m * s and stride s, its right overhang
// dropped, is sum over j < m of x[n / s - j] . W[:, :, n % s + j s]: a convolution over m
// input frames whose s * C_out outputs per frame are the s output frames (phase-major). Rows
// of the stored weight (C_in, K, C_out) are moved, not converted, so any weight type works.
codec_decoder::tconv codec_decoder::load_tconv(model_loader & ml, const std::string & name, int64_t c_in,
                                               int64_t c_out, int kernel, int stride, int64_t frame_samples) {
    ggml_tensor * w = ml.require(name + ".weight", { c_in, kernel, c_out });
    ggml_tensor * b = ml.require(name + ".bias", { c_out });
    if (kernel % stride != 0) {
        throw error(QT_STATUS_INVALID_PARAMS, format("%s: transposed conv kernel %d is not a multiple of its stride %d",
                                                     name.c_str(), kernel, stride));
    }
    const int m = kernel / stride;
    tconv t;
    t.c_out = c_out;
    t.stride = stride;
    t.phases.c_in = c_in;
    t.phases.history = m - 1;
    if (m > 1) {
        t.phases.slot = n_slots_++;
        slot_channels_.push_back(c_in);
        slot_frames_.push_back(m - 1);
    }
    t.phases.kernel = m;

    const size_t         rb = row_bytes(w);
    std::vector<uint8_t> src(ggml_nbytes(w));
    ggml_backend_tensor_get(w, src.data(), 0, src.size());
    ml.release(w);  // only its rearranged copy below is read
    std::vector<uint8_t> dst(src.size());
    for (int p = 0; p < stride; ++p) {
        for (int64_t co = 0; co < c_out; ++co) {
            for (int j = 0; j < m; ++j) {
                // window position j' = m - 1 - j holds frame t - j
                const int64_t k = p + int64_t(j) * stride;
                const int64_t out_row = (int64_t(p) * c_out + co) * m + (m - 1 - j);
                std::memcpy(dst.data() + size_t(out_row) * rb, src.data() + size_t(co * kernel + k) * rb, rb);
            }
        }
    }
    // F(4, 2) on the CPU where a graph holds tiles enough to repay forming its weights: at 8 tiles
    // a graph (the first block's input, 4 frames per frame of the stream) it decoded no faster than
    // the packed product over both taps
    const int64_t tiles = frame_samples * k_conv_slice_frames / k_winograd_outputs;
    if (m > 1 && tiles >= k_min_winograd_tiles && winograd_takes(w->type, m)) {
        t.phases.w = derived_tensor(w->type, { c_in, m, int64_t(stride) * c_out }, dst.data());
        to_winograd(t.phases, frame_samples);
    } else if (w->type == GGML_TYPE_F16 && cpu_kernels_ && packed_weights_supported()) {
        // the phases' rows, (C_in * m) values for each of the stride * C_out outputs
        t.phases.packed = packed_rows(reinterpret_cast<const uint16_t *>(dst.data()), c_in * m, int64_t(stride) * c_out);
    } else {
        t.phases.w = derived_tensor(w->type, { c_in, m, int64_t(stride) * c_out }, dst.data());
    }

    const std::vector<float> bias = tensor_f32(b);
    std::vector<float>       phased;
    for (int p = 0; p < stride; ++p) {
        phased.insert(phased.end(), bias.begin(), bias.end());
    }
    t.phases.b = derived_tensor(GGML_TYPE_F32, { int64_t(stride) * c_out }, phased.data());
    return t;
}

codec_decoder::snake codec_decoder::load_snake(model_loader & ml, const std::string & name, int64_t channels) {
    const std::vector<float> alpha = tensor_f32(ml.require(name + ".alpha", { channels }));
    const std::vector<float> beta = tensor_f32(ml.require(name + ".beta", { channels }));
    std::vector<float>       a(static_cast<size_t>(channels)), inv_b(static_cast<size_t>(channels));
    for (size_t c = 0; c < a.size(); ++c) {
        a[c] = std::exp(alpha[c]);
        inv_b[c] = float(1.0 / (std::exp(double(beta[c])) + 1e-9));
    }
    snake s;
    s.alpha = derived_tensor(GGML_TYPE_F32, { channels }, a.data());
    s.inv_beta = derived_tensor(GGML_TYPE_F32, { channels }, inv_b.data());
    return s;
}

void codec_decoder::load(model_loader & ml, const compute_backend * device) {
    const std::string & path = ml.path();
    cpu_kernels_ = device == nullptr;
    derived_type_ = device ? ggml_backend_get_default_buffer_type(device->get()) : ggml_backend_cpu_buffer_type();
    static_cast<codec_hparams &>(hp_) = read_codec_hparams(ml, QT_CODEC_DECODER, QT_KEY_CDEC_NORM_EPS, "codec decoder");
    hp_.latent_dim = ml.get_size(QT_KEY_CDEC_LATENT_DIM);
    hp_.decoder_dim = ml.get_size(QT_KEY_CDEC_DECODER_DIM);
    hp_.n_quantizers = ml.get_size(QT_KEY_CDEC_QUANTIZERS);
    hp_.n_semantic = ml.get_size(QT_KEY_CDEC_SEMANTIC_Q);
    hp_.upsampling_ratios = ml.get_i32_array(QT_KEY_CDEC_UPSAMPLING_RATIOS);
    hp_.upsample_rates = ml.get_i32_array(QT_KEY_CDEC_UPSAMPLE_RATES);

    // The product of the rates stops growing past any real hop, so that it cannot overflow.
    int64_t hop = 1;
    bool    rates_ok = !hp_.upsample_rates.empty();
    for (const auto * rates : { &hp_.upsampling_ratios, &hp_.upsample_rates }) {
        for (int32_t r : *rates) {
            rates_ok = rates_ok && r > 0;
            hop = std::min<int64_t>(hop * std::max(r, 1), int64_t(1) << 32);
        }
    }
    const size_t n_blocks = hp_.upsample_rates.size();
    // get_size() already refused zero sizes; what is left is how the sizes fit together.
    // The attention window bounds the streams' caches and the chunks reserve() runs (72 frames in
    // the real checkpoints; millions would keep a device's reserve busy for minutes).
    const bool   geometry_ok = rates_ok && hop == hp_.frame_samples && hp_.codebook_dim % 2 == 0 &&
                             hp_.n_quantizers > hp_.n_semantic && n_blocks < 16 &&
                             hp_.decoder_dim % (1 << n_blocks) == 0 && hp_.sliding_window <= k_max_sliding_window;
    if (!geometry_ok) {
        throw error(QT_STATUS_INVALID_PARAMS,
                    format("%s: unsupported codec decoder geometry (hop %lld for %d samples per frame, codebook dim "
                           "%d, %d/%d heads, %d/%d quantizers, decoder dim %d over %zu blocks, a window of %d frames "
                           "(at most %d))",
                           path.c_str(), (long long) hop, hp_.frame_samples, hp_.codebook_dim, hp_.heads,
                           hp_.kv_heads, hp_.n_semantic, hp_.n_quantizers, hp_.decoder_dim, n_blocks,
                           hp_.sliding_window, k_max_sliding_window));
    }

    derived_ctx_ = new_metadata_context(512, false, "codec decoder's weight context");
    n_slots_ = 0;
    slot_channels_.clear();
    slot_frames_.clear();
    pending_.clear();

    const int64_t half = hp_.codebook_dim / 2;
    codebooks_.clear();
    for (int q = 0; q < hp_.n_quantizers; ++q) {
        const bool semantic = q < hp_.n_semantic;
        const std::string name = std::string(semantic ? "cdec.rvq_first" : "cdec.rvq_rest") + ".codebook." +
                                 std::to_string(semantic ? q : q - hp_.n_semantic);
        codebooks_.push_back(ml.require_table(name, { half, hp_.codebook_size }));
    }
    out_proj_first_ = ml.require("cdec.rvq_first.out_proj.weight", { half, 1, hp_.codebook_dim });
    out_proj_rest_ = ml.require("cdec.rvq_rest.out_proj.weight", { half, 1, hp_.codebook_dim });
    pre_conv_ = load_conv(ml, "cdec.pre_conv", hp_.codebook_dim, hp_.latent_dim, k_pre_conv_kernel, 1, true);
    pack_conv(ml, pre_conv_);

    const int64_t H = hp_.hidden;
    const int64_t q_dim = int64_t(hp_.heads) * hp_.head_dim;
    const int64_t kv_dim = int64_t(hp_.kv_heads) * hp_.head_dim;
    tf_in_w_ = pack_matrix(ml, ml.require("cdec.tf_in.weight", { hp_.latent_dim, H }), hp_.latent_dim, H);
    tf_in_b_ = ml.has_tensor("cdec.tf_in.bias") ? ml.require("cdec.tf_in.bias", { H }) : nullptr;
    layers_.clear();
    for (int i = 0; i < hp_.layers; ++i) {
        const std::string p = "cdec.blk." + std::to_string(i) + ".";
        layer l;
        l.attn_norm = ml.require(p + "attn_norm.weight", { H });
        l.q = pack_matrix(ml, ml.require(p + "attn_q.weight", { H, q_dim }), H, q_dim);
        l.k = pack_matrix(ml, ml.require(p + "attn_k.weight", { H, kv_dim }), H, kv_dim);
        l.v = pack_matrix(ml, ml.require(p + "attn_v.weight", { H, kv_dim }), H, kv_dim);
        l.o = pack_matrix(ml, ml.require(p + "attn_o.weight", { q_dim, H }), q_dim, H);
        l.attn_scale = ml.require(p + "attn_scale", { H });
        l.ffn_norm = ml.require(p + "ffn_norm.weight", { H });
        l.gate = pack_matrix(ml, ml.require(p + "ffn_gate.weight", { H, hp_.ffn }), H, hp_.ffn);
        l.up = pack_matrix(ml, ml.require(p + "ffn_up.weight", { H, hp_.ffn }), H, hp_.ffn);
        l.down = pack_matrix(ml, ml.require(p + "ffn_down.weight", { hp_.ffn, H }), hp_.ffn, H);
        l.ffn_scale = ml.require(p + "ffn_scale", { H });
        layers_.push_back(l);
    }
    tf_norm_ = ml.require("cdec.tf_norm.weight", { H });
    tf_out_w_ = pack_matrix(ml, ml.require("cdec.tf_out.weight", { H, hp_.latent_dim }), H, hp_.latent_dim);
    tf_out_b_ = ml.has_tensor("cdec.tf_out.bias") ? ml.require("cdec.tf_out.bias", { hp_.latent_dim }) : nullptr;

    const int64_t L = hp_.latent_dim;
    upsample_.clear();
    for (size_t i = 0; i < hp_.upsampling_ratios.size(); ++i) {
        const std::string p = "cdec.up." + std::to_string(i) + ".";
        const int         r = hp_.upsampling_ratios[i];
        convnext          u;
        u.up = load_tconv(ml, p + "tconv", L, L, r, r, 0);
        // depthwise weight (1, 7, C) -> taps (C, 7): tap k of every channel is one row
        const std::vector<float> dw = tensor_f32(ml.require(p + "dwconv.weight", { 1, k_dw_kernel, L }));
        std::vector<float>       taps(dw.size());
        for (int64_t c = 0; c < L; ++c) {
            for (int k = 0; k < k_dw_kernel; ++k) {
                taps[size_t(k * L + c)] = dw[size_t(c * k_dw_kernel + k)];
            }
        }
        u.dw_w = derived_tensor(GGML_TYPE_F32, { L, k_dw_kernel }, taps.data());
        u.dw_b = ml.require(p + "dwconv.bias", { L });
        u.dw_slot = n_slots_++;
        slot_channels_.push_back(L);
        slot_frames_.push_back(k_dw_kernel - 1);
        u.norm_w = ml.require(p + "norm.weight", { L });
        u.norm_b = ml.require(p + "norm.bias", { L });
        u.pw1_w = pack_matrix(ml, ml.require(p + "pw1.weight", { L, 4 * L }), L, 4 * L);
        u.pw1_b = ml.require(p + "pw1.bias", { 4 * L });
        u.pw2_w = pack_matrix(ml, ml.require(p + "pw2.weight", { 4 * L, L }), 4 * L, L);
        u.pw2_b = ml.require(p + "pw2.bias", { L });
        u.gamma = ml.require(p + "gamma", { L });
        upsample_.push_back(u);
    }

    // HF decoder.decoder: [0] conv, [1..n] blocks, [n+1] SnakeBeta, [n+2] conv
    conv_in_ = load_conv(ml, "cdec.dec.0.conv", L, hp_.decoder_dim, k_conv_kernel, 1, true);
    pack_conv(ml, conv_in_);
    blocks_.clear();
    int64_t block_samples = 1;  // a block's samples per frame of the stream
    for (int32_t r : hp_.upsampling_ratios) {
        block_samples *= r;
    }
    for (size_t i = 0; i < n_blocks; ++i) {
        const std::string p = "cdec.dec." + std::to_string(i + 1) + ".";
        const int64_t     c_in = hp_.decoder_dim >> i;
        const int64_t     c_out = hp_.decoder_dim >> (i + 1);
        const int         r = hp_.upsample_rates[i];
        block             b;
        b.act = load_snake(ml, p + "snake", c_in);
        b.up = load_tconv(ml, p + "tconv", c_in, c_out, 2 * r, r, block_samples);
        block_samples *= r;
        for (size_t j = 0; j < std::size(k_res_dilations); ++j) {
            const std::string q = p + "res" + std::to_string(j + 2) + ".";
            residual_unit     u;
            u.act1 = load_snake(ml, q + "snake1", c_out);
            u.conv1 = load_conv(ml, q + "conv1", c_out, c_out, k_res_kernel, k_res_dilations[j], true);
            to_winograd(u.conv1, block_samples);
            u.act2 = load_snake(ml, q + "snake2", c_out);
            u.conv2 = load_conv(ml, q + "conv2", c_out, c_out, 1, 1, true);
            b.res.push_back(u);
        }
        blocks_.push_back(std::move(b));
    }
    const int64_t c_last = hp_.decoder_dim >> n_blocks;
    act_out_ = load_snake(ml, "cdec.dec." + std::to_string(n_blocks + 1) + ".snake", c_last);
    conv_out_ = load_conv(ml, "cdec.dec." + std::to_string(n_blocks + 2) + ".conv", c_last, 1, k_conv_kernel, 1, true);

    // Receptive field of the convolutions after the transformer, in frames: each causal conv
    // looks back its history at its own rate (samples per frame).
    double rf = 0.0;
    double rate = 1.0;
    for (int32_t r : hp_.upsampling_ratios) {
        rate *= r;
        rf += (k_dw_kernel - 1) / rate;
    }
    rf += (k_conv_kernel - 1) / rate;
    for (int32_t r : hp_.upsample_rates) {
        rf += 1.0 / rate;  // the transposed conv's previous input frame
        rate *= r;
        for (int d : k_res_dilations) {
            rf += double(d) * (k_res_kernel - 1) / rate;
        }
    }
    rf += (k_conv_kernel - 1) / rate;
    receptive_frames_ = int64_t(std::ceil(rf));

    derive_weights(ml);
}

void codec_decoder::derive_weights(model_loader & ml) {
    derived_buf_.reset(ggml_backend_alloc_ctx_tensors_from_buft(derived_ctx_.get(), derived_type_));
    if (!derived_buf_) {
        throw error(QT_STATUS_OUT_OF_MEMORY, format("not enough memory for the codec decoder of %s", ml.path().c_str()));
    }
    ggml_backend_buffer_set_usage(derived_buf_.get(), GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    for (const pending_derived & p : pending_) {
        ggml_backend_tensor_set(p.tensor, p.bytes.data(), 0, p.bytes.size());
    }
    pending_.clear();
    pending_.shrink_to_fit();
}

// ---- streaming -------------------------------------------------------------------------------

codec_stream::codec_stream(const codec_decoder & decoder) : dec_(decoder) {
    const size_t n_layers = decoder.layers_.size();
    k_cache_.resize(n_layers);
    v_cache_.resize(n_layers);
    history_.resize(size_t(decoder.n_slots_));
    for (int s = 0; s < decoder.n_slots_; ++s) {
        history_[size_t(s)].assign(size_t(decoder.slot_channels_[size_t(s)] * decoder.slot_frames_[size_t(s)]), 0.0f);
    }
}

size_t codec_stream::bytes() const {
    size_t floats = 0;
    for (const auto * state : { &k_cache_, &v_cache_, &history_ }) {
        for (const std::vector<float> & v : *state) {
            floats += v.size();
        }
    }
    return floats * sizeof(float);
}

void codec_decoder::reserve(const compute_backend & backend, int64_t max_chunk) const {
    codec_stream               stream(*this);
    const std::vector<int32_t> codes(size_t(max_chunk * hp_.n_quantizers), 0);
    do {
        stream.decode(backend, no_dumps(), codes.data(), max_chunk);
    } while (stream.n_cached_ < hp_.sliding_window - 1);
    stream.decode(backend, no_dumps(), codes.data(), max_chunk);  // with the cache full
    // priming's slices, with the cache full too
    codec_stream               primed(*this);
    const int64_t              n_prime = 2 * std::max<int64_t>(k_prime_slice_frames, hp_.sliding_window);
    const std::vector<int32_t> reference(size_t(n_prime * hp_.n_quantizers), 0);
    primed.prime(backend, reference.data(), n_prime);
}

std::vector<float> codec_stream::decode(const compute_backend & backend, const stage_dumper & dumper,
                                        const int32_t * codes, int64_t n_frames) {
    const bool first = !decoded_audio_;
    decoded_audio_ = true;
    return run(backend, first ? dumper : no_dumps(), codes, n_frames, true);
}

void codec_stream::prime(const compute_backend & backend, const int32_t * codes, int64_t n_frames) {
    if (frames_ != 0) {
        throw error(QT_STATUS_FAILED, "codec decoder: only a fresh stream can be primed");
    }
    run(backend, no_dumps(), codes, n_frames, false);
}

std::vector<float> codec_stream::run(const compute_backend & backend, const stage_dumper & dumper, const int32_t * codes,
                                     int64_t T, bool audio) {
    // causal, so slices give the one graph's latent frames
    const int64_t      Q = dec_.hp_.n_quantizers;
    const int64_t      t_slice = audio || dumper.enabled() ? T : k_prime_slice_frames;
    std::vector<float> latent;
    for (int64_t f = 0; f < T; f += t_slice) {
        const int64_t            n = std::min(t_slice, T - f);
        const std::vector<float> part = transform(backend, dumper, codes + f * Q, n);
        latent.insert(latent.end(), part.begin(), part.end());
        frames_ += n;
    }
    const int64_t L = dec_.hp_.latent_dim;
    int64_t       n_conv = T;
    if (!audio) {
        // Priming: the convolutions' state depends on their receptive field only.
        n_conv = std::min(T, dec_.receptive_frames_);
    }
    const float * first = latent.data() + (T - n_conv) * L;
    // The convolutions run at up to 24 kHz, where their activations take ~6 MiB per frame: in
    // slices of a few frames, the compute buffer stays small whatever the chunk (a dump keeps the
    // whole chunk in one graph, so that each stage's file holds all of it).
    const int64_t      slice = dumper.enabled() ? n_conv : k_conv_slice_frames;
    std::vector<float> pcm;
    for (int64_t f = 0; f < n_conv; f += slice) {
        const std::vector<float> part = convolve(backend, dumper, first + f * L, std::min(slice, n_conv - f));
        convolved_ += std::min(slice, n_conv - f);
        if (audio) {
            pcm.insert(pcm.end(), part.begin(), part.end());
        }
    }
    return pcm;
}

// A graph's inputs for the causal convolutions' histories, and the outputs that become the next.
struct codec_stream::history_io {
    struct state_out {
        std::vector<float> * dst;
        ggml_tensor *        t;
    };
    graph_run &            run;
    std::vector<state_out> outs;

    // x = (C, T') preceded by the slot's history; the new history is the last frames of that.
    // With alpha and inv_beta, x's SnakeBeta instead of x, written after the history directly.
    ggml_tensor * with_history(std::vector<std::vector<float>> & history, ggml_tensor * x, int slot,
                               ggml_tensor * alpha = nullptr, ggml_tensor * inv_beta = nullptr) {
        ggml_context * ctx = run.ctx();
        if (slot < 0) {
            return alpha ? snake_beta(ctx, x, alpha, inv_beta) : x;
        }
        std::vector<float> & h = history[size_t(slot)];
        const int64_t        C = x->ne[0];
        const int64_t        P = int64_t(h.size()) / C;
        ggml_tensor *        past = run.input_f32("history", h.data(), { C, P });
        ggml_tensor *        all = alpha ? snake_beta(ctx, x, alpha, inv_beta, past) : ggml_concat(ctx, past, x, 1);
        ggml_tensor *        tail = ggml_view_2d(ctx, all, C, P, all->nb[1], size_t(all->ne[1] - P) * all->nb[1]);
        outs.push_back({ &h, run.output(ggml_cont(ctx, tail)) });
        return all;
    }
    void store() {
        for (const state_out & s : outs) {
            *s.dst = run.read_f32(s.t);
        }
    }
};

template <class Conv>
ggml_tensor * codec_stream::causal(history_io & io, const Conv & c, ggml_tensor * x, ggml_tensor * residual,
                                   const snake_params * act) {
    ggml_tensor * all = io.with_history(history_, x, c.slot, act ? act->alpha : nullptr, act ? act->inv_beta : nullptr);
    if (c.winograd) {
        // Tiles start at multiples of their span from the stream's start, wherever its chunks
        // begin: a tile's rounding depends on all of its inputs, so two decodes of the same
        // frames in other chunks used to differ by the transform's rounding at every tile, and
        // now only at the tiles that a chunk's end cuts (they see zeros past it). The history
        // holds tile_history frames more than the taps need (span - 1, or none where every frame
        // of the stream holds whole tiles); the outputs that they add before the chunk (its
        // offset into a tile) are dropped.
        GGML_ASSERT(!residual);
        ggml_context * ctx = io.run.ctx();
        const int64_t  span = int64_t(k_winograd_outputs) * c.dilation;
        const int64_t  into_tile = convolved_ * c.frame_samples % span;
        const int64_t  unused = c.tile_history - into_tile;
        ggml_tensor *  from_tile = ggml_view_2d(ctx, all, all->ne[0], all->ne[1] - unused, all->nb[1], size_t(unused) * all->nb[1]);
        ggml_tensor *  y = winograd_conv(ctx, from_tile, c.w, c.b, c.dilation);
        return ggml_view_2d(ctx, y, y->ne[0], y->ne[1] - into_tile, y->nb[1], size_t(into_tile) * y->nb[1]);
    }
    if (c.packed.panels) {
        GGML_ASSERT(c.dilation == 1);
        ggml_tensor * windows = c.kernel == 1 ? all : sliding_windows(io.run.ctx(), all, c.kernel, 1);
        return dense(io.run.ctx(), c.packed, windows, c.b, residual, true);
    }
    return conv1d(io.run.ctx(), all, c.w, c.b, 1, c.dilation, residual);
}

std::vector<float> codec_stream::transform(const compute_backend & backend, const stage_dumper & dumper,
                                           const int32_t * codes, int64_t T) {
    const codec_decoder &         d = dec_;
    const codec_decoder_hparams & hp = d.hp_;
    const int                     Q = hp.n_quantizers;
    graph_run                     run(backend, dumper, 16384);
    ggml_context *                ctx = run.ctx();
    history_io                    io{ run, {} };

    // Split RVQ: each group's codebook vectors summed, through its 1x1 output projection.
    std::vector<int32_t> by_book(size_t(Q * T));
    for (int64_t t = 0; t < T; ++t) {
        for (int q = 0; q < Q; ++q) {
            const int32_t code = codes[t * Q + q];
            if (code >= hp.codebook_size) {  // a damaged model's generation: an error, not ggml's abort
                throw error(QT_STATUS_FAILED, format("codec decoder: code %d of codebook %d is outside it (size %d)",
                                                     code, q, hp.codebook_size));
            }
            by_book[size_t(q * T + t)] = std::max(code, 0);  // upstream maps padding (-1) to 0
        }
    }
    auto group = [&](int q0, int q1, ggml_tensor * proj) {
        ggml_tensor * sum = nullptr;
        for (int q = q0; q < q1; ++q) {
            // an input per codebook: ggml-vulkan's get_rows takes no offset into its indices
            ggml_tensor * ids = run.input_i32("codes", by_book.data() + size_t(q) * size_t(T), { T });
            ggml_tensor * e = d.codebooks_[size_t(q)].get(ctx, ids);
            sum = sum ? ggml_add(ctx, sum, e) : e;
        }
        return dense(ctx, ggml_reshape_2d(ctx, proj, proj->ne[0], proj->ne[2]), sum);
    };
    ggml_tensor * x = ggml_add(ctx, group(0, hp.n_semantic, d.out_proj_first_), group(hp.n_semantic, Q, d.out_proj_rest_));
    x = run.stage(x, "dec_quantized");
    x = run.stage(causal(io, d.pre_conv_, x), "dec_pre_conv");

    // Transformer over the chunk, attending to the cached keys and values of the frames before.
    const int64_t hd = hp.head_dim;
    const int64_t n_past = n_cached_;
    const int64_t n_all = n_past + T;
    const int64_t n_keep = std::min<int64_t>(hp.sliding_window - 1, n_all);
    std::vector<int32_t> positions(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
        positions[size_t(t)] = int32_t(frames_ + t);
    }
    ggml_tensor *      pos = run.input_i32("positions", positions.data(), { T });
    std::vector<float> mask(size_t(n_all * T), -std::numeric_limits<float>::infinity());
    for (int64_t i = 0; i < T; ++i) {
        for (int64_t j = 0; j < n_all; ++j) {
            const int64_t behind = (n_past + i) - j;  // how many frames key j lies before query i
            if (behind >= 0 && behind < hp.sliding_window) {
                mask[size_t(i * n_all + j)] = 0.0f;
            }
        }
    }
    ggml_tensor * kq_mask = run.input_f32("kq_mask", mask.data(), { n_all, T });
    std::vector<ggml_tensor *> k_news(d.layers_.size()), v_news(d.layers_.size());

    ggml_tensor * h = dense(ctx, d.tf_in_w_, x, d.tf_in_b_);
    for (size_t li = 0; li < d.layers_.size(); ++li) {
        const codec_decoder::layer & l = d.layers_[li];
        ggml_tensor * n = ggml_mul(ctx, ggml_rms_norm(ctx, h, hp.norm_eps), l.attn_norm);
        auto rope = [&](ggml_tensor * t) {
            return ggml_rope_ext(ctx, t, pos, nullptr, int(hd), GGML_ROPE_TYPE_NEOX, 0, hp.rope_theta, 1.0f, 0.0f,
                                 1.0f, 0.0f, 0.0f);
        };
        ggml_tensor * q = rope(ggml_reshape_3d(ctx, dense(ctx, l.q, n), hd, hp.heads, T));
        ggml_tensor * k = rope(ggml_reshape_3d(ctx, dense(ctx, l.k, n), hd, hp.kv_heads, T));
        ggml_tensor * v = ggml_reshape_3d(ctx, dense(ctx, l.v, n), hd, hp.kv_heads, T);
        if (n_past > 0) {
            k = ggml_concat(ctx, run.input_f32("k_cache", k_cache_[li].data(), { hd, hp.kv_heads, n_past }), k, 2);
            v = ggml_concat(ctx, run.input_f32("v_cache", v_cache_[li].data(), { hd, hp.kv_heads, n_past }), v, 2);
        }
        const size_t keep_offset = size_t(n_all - n_keep) * k->nb[2];
        k_news[li] = run.output(ggml_cont(ctx, ggml_view_3d(ctx, k, hd, hp.kv_heads, n_keep, k->nb[1], k->nb[2], keep_offset)));
        v_news[li] = run.output(ggml_cont(ctx, ggml_view_3d(ctx, v, hd, hp.kv_heads, n_keep, v->nb[1], v->nb[2], keep_offset)));

        ggml_tensor * qp = ggml_permute(ctx, q, 0, 2, 1, 3);                       // (hd, T, heads)
        ggml_tensor * kp = ggml_permute(ctx, k, 0, 2, 1, 3);                       // (hd, n_all, kv_heads)
        ggml_tensor * vt = ggml_cont(ctx, ggml_permute(ctx, v, 1, 2, 0, 3));       // (n_all, hd, kv_heads)
        ggml_tensor * kq = dense(ctx, kp, qp);                                     // (n_all, T, heads)
        kq = ggml_soft_max_ext(ctx, kq, kq_mask, 1.0f / std::sqrt(float(hd)), 0.0f);
        ggml_tensor * a = dense(ctx, vt, kq);                                      // (hd, T, heads)
        a = ggml_cont(ctx, ggml_permute(ctx, a, 0, 2, 1, 3));
        a = dense(ctx, l.o, ggml_reshape_2d(ctx, a, hd * hp.heads, T));
        h = ggml_add(ctx, h, ggml_mul(ctx, a, l.attn_scale));

        n = ggml_mul(ctx, ggml_rms_norm(ctx, h, hp.norm_eps), l.ffn_norm);
        ggml_tensor * f = ggml_mul(ctx, ggml_silu(ctx, dense(ctx, l.gate, n)), dense(ctx, l.up, n));
        h = ggml_add(ctx, h, ggml_mul(ctx, dense(ctx, l.down, f), l.ffn_scale));
    }
    h = ggml_mul(ctx, ggml_rms_norm(ctx, h, hp.norm_eps), d.tf_norm_);
    h = run.stage(dense(ctx, d.tf_out_w_, h, d.tf_out_b_), "dec_pre_transformer");

    run.compute(h);
    io.store();
    for (size_t li = 0; li < d.layers_.size(); ++li) {
        k_cache_[li] = run.read_f32(k_news[li]);
        v_cache_[li] = run.read_f32(v_news[li]);
    }
    n_cached_ = n_keep;
    return run.read_f32(h);
}

std::vector<float> codec_stream::convolve(const compute_backend & backend, const stage_dumper & dumper,
                                          const float * latent, int64_t T) {
    const codec_decoder & d = dec_;
    graph_run             run(backend, dumper, 16384);
    ggml_context *        ctx = run.ctx();
    history_io            io{ run, {} };
    // a causal convolution's SnakeBeta is computed into its input after the history
    auto transposed = [&](const codec_decoder::tconv & t, ggml_tensor * x, const codec_decoder::snake * act = nullptr) {
        ggml_tensor * y = causal(io, t.phases, x, nullptr, act);  // (stride * C_out, T')
        return ggml_reshape_2d(ctx, y, t.c_out, y->ne[1] * t.stride);
    };

    ggml_tensor * h = run.input_f32("latent", latent, { d.hp_.latent_dim, T });
    for (size_t i = 0; i < d.upsample_.size(); ++i) {
        const codec_decoder::convnext & u = d.upsample_[i];
        h = transposed(u.up, h);
        // ConvNeXt: depthwise causal conv as per-tap products, LayerNorm, GELU MLP, gamma, residual
        ggml_tensor * past = io.with_history(history_, h, u.dw_slot);
        const int64_t C = h->ne[0];
        const int64_t n_t = h->ne[1];
        ggml_tensor * y = nullptr;
        for (int k = 0; k < k_dw_kernel; ++k) {
            ggml_tensor * xk = ggml_view_2d(ctx, past, C, n_t, past->nb[1], size_t(k) * past->nb[1]);
            ggml_tensor * wk = ggml_view_1d(ctx, u.dw_w, C, size_t(k) * u.dw_w->nb[1]);
            ggml_tensor * p = ggml_mul(ctx, xk, wk);
            y = y ? ggml_add(ctx, y, p) : ggml_add(ctx, p, u.dw_b);
        }
        y = layer_norm(ctx, y, u.norm_w, u.norm_b, k_convnext_eps);
        y = dense(ctx, u.pw2_w, ggml_gelu_erf(ctx, dense(ctx, u.pw1_w, y, u.pw1_b)), u.pw2_b);
        h = ggml_add(ctx, h, ggml_mul(ctx, y, u.gamma));
        if (i == 0) {
            h = run.stage(h, "dec_upsample0");
        }
    }
    h = run.stage(h, "dec_upsample");
    h = run.stage(causal(io, d.conv_in_, h), "dec_conv_in");
    for (size_t i = 0; i < d.blocks_.size(); ++i) {
        const codec_decoder::block & b = d.blocks_[i];
        h = transposed(b.up, h, &b.act);
        for (const codec_decoder::residual_unit & u : b.res) {
            ggml_tensor * y = causal(io, u.conv1, h, nullptr, &u.act1);
            h = causal(io, u.conv2, y, h, &u.act2);
        }
        h = run.stage(h, "dec_block" + std::to_string(i));
    }
    h = causal(io, d.conv_out_, h, nullptr, &d.act_out_);
    h = run.stage(ggml_clamp(ctx, h, -1.0f, 1.0f), "dec_wav");

    run.compute(h);
    io.store();
    return run.read_f32(h);
}

} // namespace qt
