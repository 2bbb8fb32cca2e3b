// Op-level checks of the shared building blocks against naive reference loops.
#include "backend-loader.h"
#include "cpu-ops.h"
#include "graph.h"
#include "log.h"
#include "mat-vecs.h"
#include "interleaved-rows.h"
#include "table-rows.h"
#include "test-check.h"
#include "winograd.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <fstream>
#include <string>
#include <vector>

#if defined(__linux__)
#    include <fcntl.h>
#    include <sys/mman.h>
#    include <unistd.h>
#endif

namespace {

using test::check;

void expect_close(const char * what, const std::vector<float> & got, const std::vector<float> & want, float tol) {
    if (got.size() != want.size()) {
        check(false, "%s: size %zu != %zu", what, got.size(), want.size());
        return;
    }
    float worst = 0.0f;
    for (size_t i = 0; i < got.size(); ++i) {
        worst = std::max(worst, std::fabs(got[i] - want[i]));
    }
    check(worst <= tol, "%s: max abs error %.2g, tolerance %g", what, worst, tol);
}

std::vector<float> random_vector(size_t n, std::mt19937 & rng) {
    std::normal_distribution<float> dist;
    std::vector<float> v(n);
    for (auto & x : v) {
        x = dist(rng);
    }
    return v;
}

// x: [T][C] (channels innermost), w: [C_out][K][C_in]; returns [T_out][C_out]
std::vector<float> naive_conv(const std::vector<float> & x, int64_t T, int64_t c_in, const std::vector<float> & w,
                              int64_t c_out, int64_t K, int stride, int dilation, int64_t * t_out) {
    *t_out = (T - dilation * (K - 1) - 1) / stride + 1;
    std::vector<float> y(size_t(*t_out * c_out), 0.0f);
    for (int64_t t = 0; t < *t_out; ++t) {
        for (int64_t o = 0; o < c_out; ++o) {
            double acc = 0.0;
            for (int64_t k = 0; k < K; ++k) {
                for (int64_t i = 0; i < c_in; ++i) {
                    acc += double(w[size_t((o * K + k) * c_in + i)]) * x[size_t((t * stride + k * dilation) * c_in + i)];
                }
            }
            y[size_t(t * c_out + o)] = float(acc);
        }
    }
    return y;
}

// Every path of conv1d: one tap, sliding windows (dilation 1), per-tap sums (dilated), with and
// without bias and residual.
void test_conv(const qt::cpu_backend & backend, int64_t K, int stride, int dilation, bool bias_and_residual) {
    std::mt19937 rng(42 + K * 13 + stride * 7 + dilation);
    const int64_t T = 37, c_in = 6, c_out = 21;
    auto x = random_vector(size_t(T * c_in), rng);
    auto w = random_vector(size_t(K * c_out * c_in), rng);
    auto b = random_vector(size_t(c_out), rng);
    int64_t t_out = 0;
    auto want = naive_conv(x, T, c_in, w, c_out, K, stride, dilation, &t_out);
    auto r = random_vector(want.size(), rng);
    if (bias_and_residual) {
        for (size_t i = 0; i < want.size(); ++i) {
            want[i] += b[i % size_t(c_out)] + r[i];
        }
    }

    qt::stage_dumper no_dump;
    qt::graph_run run(backend, no_dump, 256);
    ggml_tensor * gx = run.input_f32("x", x.data(), { c_in, T });
    ggml_tensor * gw = run.input_f32("w", w.data(), { c_in, K, c_out });
    ggml_tensor * gb = bias_and_residual ? run.input_f32("b", b.data(), { c_out }) : nullptr;
    ggml_tensor * gr = bias_and_residual ? run.input_f32("r", r.data(), { c_out, t_out }) : nullptr;
    ggml_tensor * y = qt::conv1d(run.ctx(), gx, gw, gb, stride, dilation, gr);
    run.compute(y);
    char name[96];
    snprintf(name, sizeof(name), "conv1d K %lld stride %d dilation %d%s", (long long) K, stride, dilation,
             bias_and_residual ? " + bias + residual" : "");
    if (y->ne[0] != c_out || y->ne[1] != t_out) {
        check(false, "%s: output %lld x %lld, expected %lld x %lld", name, (long long) y->ne[0], (long long) y->ne[1],
              (long long) c_out, (long long) t_out);
        return;
    }
    expect_close(name, run.read_f32(y), want, 1e-4f);
}

// winograd_conv against the direct convolution in double: 7 taps at every dilation the decoder
// uses and 2 taps (the transposed convolutions' phases), outputs that fill the last tile partly
// (T_out 1, 5, 37), channel counts off the 16-lane blocks, input rows at a stride (a view of wider
// frames), taps stored as f32 and as f16 (the quantized models' decoder). Returns the outputs for
// the bit-for-bit comparison of the instruction sets.
std::vector<float> test_winograd(const qt::cpu_backend & backend, int64_t K, int dilation, int64_t t_out,
                                 int64_t c_in, int64_t c_out, bool bias, ggml_type taps_type,
                                 int64_t piece_bytes = qt::k_winograd_piece_bytes) {
    std::mt19937  rng(7 + dilation * 31 + t_out * 3 + c_in + K * 101);
    const int64_t T = t_out + dilation * (K - 1);
    const int64_t wide = c_in + 3;  // x's frames hold 3 more channels than the convolution reads
    auto xw = random_vector(size_t(T * wide), rng);
    std::vector<float> x(size_t(T * c_in));
    for (int64_t t = 0; t < T; ++t) {
        std::copy_n(xw.begin() + t * wide, c_in, x.begin() + t * c_in);
    }
    auto w = random_vector(size_t(K * c_out * c_in), rng);
    std::vector<ggml_fp16_t> w16(w.size());
    if (taps_type == GGML_TYPE_F16) {  // the reference convolves the taps as stored
        ggml_fp32_to_fp16_row(w.data(), w16.data(), int64_t(w.size()));
        ggml_fp16_to_fp32_row(w16.data(), w.data(), int64_t(w.size()));
    }
    auto b = random_vector(size_t(c_out), rng);
    int64_t n_out = 0;
    auto want = naive_conv(x, T, c_in, w, c_out, K, 1, dilation, &n_out);
    if (bias) {
        for (size_t i = 0; i < want.size(); ++i) {
            want[i] += b[i % size_t(c_out)];
        }
    }
    qt::stage_dumper no_dump;
    qt::graph_run run(backend, no_dump, 256);
    ggml_tensor * gxw = run.input_f32("x", xw.data(), { wide, T });
    ggml_tensor * gx = ggml_view_2d(run.ctx(), gxw, c_in, T, gxw->nb[1], 0);
    ggml_tensor * gw = taps_type == GGML_TYPE_F16 ? run.input("w", GGML_TYPE_F16, w16.data(), { c_in, K, c_out })
                                                  : run.input_f32("w", w.data(), { c_in, K, c_out });
    ggml_tensor * gb = bias ? run.input_f32("b", b.data(), { c_out }) : nullptr;
    ggml_tensor * y = qt::winograd_conv(run.ctx(), gx, gw, gb, dilation, piece_bytes);
    run.compute(y);
    char name[128];
    snprintf(name, sizeof(name), "winograd_conv %lld taps, dilation %d, %lld -> %lld x %lld frames%s, %s taps%s",
             (long long) K, dilation, (long long) c_in, (long long) c_out, (long long) t_out, bias ? " + bias" : "",
             ggml_type_name(taps_type), piece_bytes < qt::k_winograd_piece_bytes ? ", a piece per tile" : "");
    if (y->ne[0] != c_out || y->ne[1] != n_out || n_out != t_out) {
        check(false, "%s: output %lld x %lld", name, (long long) y->ne[0], (long long) y->ne[1]);
        return {};
    }
    const std::vector<float> got = run.read_f32(y);
    double err = 0.0, ref = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
        err += double(got[i] - want[i]) * (got[i] - want[i]);
        ref += double(want[i]) * want[i];
    }
    // F(4, 7) in f32 measures ~1.6e-6 relative RMS, F(4, 2) 0.9-8e-7; a wrong transform or tile
    // is off by far more
    check(std::sqrt(err / ref) < (K == 7 ? 1e-5 : 2e-6), "%s: relative RMS error %.2g", name, std::sqrt(err / ref));
    return got;
}

// The overlapping window view through ggml_mul_mat and through ggml_cont of the view: the
// weight [C_out][K][C_in] is the matrix (K * C_in, C_out) of a convolution over the windows.
void test_sliding_windows(const qt::cpu_backend & backend, int stride) {
    std::mt19937 rng(99 + stride);
    const int64_t T = 41, c_in = 3, c_out = 4, K = 5;
    auto x = random_vector(size_t(T * c_in), rng);
    auto w = random_vector(size_t(K * c_out * c_in), rng);
    int64_t t_out = 0;
    auto want = naive_conv(x, T, c_in, w, c_out, K, stride, 1, &t_out);
    qt::stage_dumper no_dump;
    qt::graph_run run(backend, no_dump, 64);
    ggml_tensor * gx = run.input_f32("x", x.data(), { c_in, T });
    ggml_tensor * gw = run.input_f32("w", w.data(), { K * c_in, c_out });
    ggml_tensor * windows = qt::sliding_windows(run.ctx(), gx, K, stride);
    ggml_tensor * y = ggml_mul_mat(run.ctx(), gw, windows);
    ggml_tensor * y2 = ggml_mul_mat(run.ctx(), gw, ggml_cont(run.ctx(), windows));
    ggml_tensor * both = ggml_concat(run.ctx(), y, y2, 1);
    run.compute(both);
    char name[64];
    snprintf(name, sizeof(name), "sliding_windows stride %d", stride);
    if (windows->ne[0] != K * c_in || windows->ne[1] != t_out) {
        check(false, "%s: view is %lld x %lld, expected %lld x %lld", name, (long long) windows->ne[0],
              (long long) windows->ne[1], (long long) (K * c_in), (long long) t_out);
        return;
    }
    std::vector<float> want2 = want;
    want2.insert(want2.end(), want.begin(), want.end());
    expect_close(name, run.read_f32(both), want2, 1e-4f);
}

void test_pad(const qt::cpu_backend & backend, qt::pad_mode mode, const char * name) {
    const int64_t T = 5, C = 2;
    std::vector<float> x(size_t(T * C));
    for (size_t i = 0; i < x.size(); ++i) {
        x[i] = float(i);
    }
    const int left = 3, right = 2;
    std::vector<float> want;
    for (int64_t t = -left; t < T + right; ++t) {
        int64_t src = t;
        if (mode == qt::pad_mode::reflect) {
            src = t < 0 ? -t : t >= T ? 2 * (T - 1) - t : t;
        } else if (mode == qt::pad_mode::replicate) {
            src = t < 0 ? 0 : t >= T ? T - 1 : t;
        }
        for (int64_t c = 0; c < C; ++c) {
            want.push_back(src < 0 || src >= T ? 0.0f : x[size_t(src * C + c)]);
        }
    }
    qt::stage_dumper no_dump;
    qt::graph_run run(backend, no_dump, 256);
    ggml_tensor * gx = run.input_f32("x", x.data(), { C, T });
    ggml_tensor * y = ggml_cont(run.ctx(), qt::pad_time(run.ctx(), gx, left, right, mode));
    run.compute(y);
    expect_close(name, run.read_f32(y), want, 0.0f);
}

void test_layer_norm(const qt::cpu_backend & backend) {
    std::mt19937 rng(7);
    const int64_t C = 16, T = 3;
    auto x = random_vector(size_t(C * T), rng);
    auto w = random_vector(size_t(C), rng);
    auto b = random_vector(size_t(C), rng);
    std::vector<float> want(x.size());
    for (int64_t t = 0; t < T; ++t) {
        double mean = 0, var = 0;
        for (int64_t c = 0; c < C; ++c) mean += x[size_t(t * C + c)];
        mean /= C;
        for (int64_t c = 0; c < C; ++c) var += std::pow(x[size_t(t * C + c)] - mean, 2);
        var /= C;
        for (int64_t c = 0; c < C; ++c) {
            want[size_t(t * C + c)] = float((x[size_t(t * C + c)] - mean) / std::sqrt(var + 1e-5) * w[size_t(c)] + b[size_t(c)]);
        }
    }
    qt::stage_dumper no_dump;
    qt::graph_run run(backend, no_dump, 64);
    ggml_tensor * y = qt::layer_norm(run.ctx(), run.input_f32("x", x.data(), { C, T }),
                                     run.input_f32("w", w.data(), { C }), run.input_f32("b", b.data(), { C }), 1e-5f);
    run.compute(y);
    expect_close("layer_norm", run.read_f32(y), want, 1e-4f);
}

// SnakeBeta inputs: x = (C, T) normal * 3 with ~2% of values up to +-1e3, alpha = exp(N(0, 0.5)),
// inv_beta = 1 / (exp(N(0, 0.5)) + 1e-9), as the codec stores log-scale parameters.
struct snake_inputs {
    std::vector<float> x, alpha, inv_beta;
};

snake_inputs snake_random(int64_t C, int64_t T, std::mt19937 & rng) {
    snake_inputs in;
    std::normal_distribution<float>       normal;
    std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
    in.x.resize(size_t(C * T));
    for (auto & v : in.x) {
        v = uniform(rng) < 0.02f ? (2.0f * uniform(rng) - 1.0f) * 1e3f : 3.0f * normal(rng);
    }
    for (int64_t c = 0; c < C; ++c) {
        in.alpha.push_back(std::exp(0.5f * normal(rng)));
        in.inv_beta.push_back(1.0f / (std::exp(0.5f * normal(rng)) + 1e-9f));
    }
    return in;
}

// y = x + inv_beta sin^2(alpha x) in double, the sine of the exact product.
std::vector<double> snake_reference(const snake_inputs & in, int64_t C) {
    std::vector<double> y(in.x.size());
    for (size_t i = 0; i < y.size(); ++i) {
        const size_t c = i % size_t(C);
        const double s = std::sin(double(in.x[i]) * double(in.alpha[c]));
        y[i] = double(in.x[i]) + double(in.inv_beta[c]) * s * s;
    }
    return y;
}

// The output is a float rounding of y, so its error is at most half an ulp of y (2^-24 |y|, up
// to 3e-5 for |y| ~ 1e3: no absolute bound for all of y can be tighter) plus inv_beta times the
// error of sin^2, which the kernel keeps within ~1.3e-7 (the 2.5e-7 here leaves room for it).
// Rows may be strided: with `gap`, x is a view of the first C channels of (C + gap, T).
void test_snake_beta(const qt::cpu_backend & backend, int64_t C, int64_t T, int64_t gap = 0) {
    std::mt19937 rng(uint32_t(1000 + C * 31 + T + gap));
    const snake_inputs in = snake_random(C, T, rng);
    const std::vector<double> want = snake_reference(in, C);
    std::vector<float> storage(size_t((C + gap) * T), -7.0f);
    for (int64_t t = 0; t < T; ++t) {
        std::copy_n(in.x.begin() + t * C, C, storage.begin() + t * (C + gap));
    }

    qt::stage_dumper no_dump;
    qt::graph_run run(backend, no_dump, 64);
    ggml_tensor * gx = run.input_f32("x", storage.data(), { C + gap, T });
    if (gap) {
        gx = ggml_view_2d(run.ctx(), gx, C, T, gx->nb[1], 0);
    }
    ggml_tensor * y = qt::snake_beta(run.ctx(), gx, run.input_f32("alpha", in.alpha.data(), { C }),
                                     run.input_f32("inv_beta", in.inv_beta.data(), { C }));
    run.compute(y);
    const std::vector<float> got = run.read_f32(y);

    char name[96];
    snprintf(name, sizeof(name), "snake_beta C %lld T %lld%s", (long long) C, (long long) T, gap ? " strided" : "");
    if (y->ne[0] != C || y->ne[1] != T || got.size() != want.size()) {
        check(false, "%s: output %lld x %lld", name, (long long) y->ne[0], (long long) y->ne[1]);
        return;
    }
    double worst = 0.0, worst_ratio = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double err = std::fabs(double(got[i]) - want[i]);
        const size_t c = i % size_t(C);
        double tol = std::ldexp(std::fabs(want[i]), -24) + in.inv_beta[c] * 2.5e-7;
        if (qt::cpu_kernels_active() == qt::cpu_kernels::generic) {
            // ggml's sine of the float product alpha * x, whose rounding (up to 2^-24 |alpha x|)
            // moves sin^2 by as much, then two more roundings (the product and the sum)
            tol += std::ldexp(std::fabs(want[i]), -24) +
                   in.inv_beta[c] * std::ldexp(std::fabs(double(in.x[i]) * in.alpha[c]), -23);
        }
        worst = std::max(worst, err);
        worst_ratio = std::max(worst_ratio, err / tol);
    }
    check(worst_ratio <= 1.0, "%s: max abs error %.2g, %.2f of the tolerance", name, worst, worst_ratio);
}

// snake_beta with a history (C, P) before it: those frames, then the same bits as snake_beta of
// x alone (x strided, as a decoder's activations after a view).
void test_snake_beta_after_history(const qt::cpu_backend & backend, int64_t C, int64_t P, int64_t T) {
    std::mt19937 rng(uint32_t(77 + C + P));
    const snake_inputs in = snake_random(C, T, rng);
    const auto history = random_vector(size_t(C * P), rng);
    std::vector<float> wide(size_t((C + 2) * T), -7.0f);
    for (int64_t t = 0; t < T; ++t) {
        std::copy_n(in.x.begin() + t * C, C, wide.begin() + t * (C + 2));
    }
    qt::stage_dumper no_dump;
    qt::graph_run run(backend, no_dump, 64);
    ggml_tensor * gw = run.input_f32("x", wide.data(), { C + 2, T });
    ggml_tensor * gx = ggml_view_2d(run.ctx(), gw, C, T, gw->nb[1], 0);
    ggml_tensor * alpha = run.input_f32("alpha", in.alpha.data(), { C });
    ggml_tensor * inv_beta = run.input_f32("inv_beta", in.inv_beta.data(), { C });
    ggml_tensor * past = run.input_f32("history", history.data(), { C, P });
    ggml_tensor * both = qt::snake_beta(run.ctx(), gx, alpha, inv_beta, past);
    ggml_tensor * alone = qt::snake_beta(run.ctx(), gx, alpha, inv_beta);
    ggml_tensor * out = ggml_concat(run.ctx(), both, alone, 1);
    run.compute(out);
    char name[96];
    snprintf(name, sizeof(name), "snake_beta after %lld frames of history, C %lld T %lld", (long long) P, (long long) C,
             (long long) T);
    if (both->ne[0] != C || both->ne[1] != P + T) {
        check(false, "%s: output %lld x %lld", name, (long long) both->ne[0], (long long) both->ne[1]);
        return;
    }
    const std::vector<float> all = run.read_f32(out);  // both, then alone
    const auto               split = all.begin() + (P + T) * C;
    std::vector<float>       want = history;
    want.insert(want.end(), split, all.end());
    check(std::vector<float>(all.begin(), split) == want, "%s: the history, then the bits of snake_beta alone", name);
}

// The error of sin^2 alone: with inv_beta = 2^16 the output's rounding is 2^-24 sin^2 per
// inv_beta (<= 6e-8), and x / inv_beta (< 0.02) adds less than 1e-9; |alpha x| up to 1e4.
void test_snake_beta_sine(const qt::cpu_backend & backend) {
    const int64_t C = 64, T = 4096;
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    snake_inputs in = snake_random(C, T, rng);
    for (size_t i = 0; i < in.x.size(); ++i) {
        const float scale = i % 3 == 0 ? 1.0f : i % 3 == 1 ? 100.0f : 1e4f;
        in.x[i] = uniform(rng) * scale / in.alpha[i % size_t(C)];
    }
    std::fill(in.inv_beta.begin(), in.inv_beta.end(), 65536.0f);
    const std::vector<double> want = snake_reference(in, C);
    qt::stage_dumper no_dump;
    qt::graph_run run(backend, no_dump, 64);
    ggml_tensor * y = qt::snake_beta(run.ctx(), run.input_f32("x", in.x.data(), { C, T }),
                                     run.input_f32("alpha", in.alpha.data(), { C }),
                                     run.input_f32("inv_beta", in.inv_beta.data(), { C }));
    run.compute(y);
    const std::vector<float> got = run.read_f32(y);
    double worst = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
        worst = std::max(worst, std::fabs(double(got[i]) - want[i]) / 65536.0);
    }
    check(worst <= 2e-7, "snake_beta sin^2 for |alpha x| <= 1e4: max abs error %.2g, tolerance 2e-7", worst);
}

// One dense() product (K, T) x (K, N) with bias and residual, in place or not, with weights of
// `type` (f32, f16, q8_0: converted from `w`), built with the kernels active now.
std::vector<float> dense_product(const qt::cpu_backend & backend, ggml_type type, const std::vector<float> & x,
                                 const std::vector<float> & w, const std::vector<float> & b,
                                 const std::vector<float> & r, int64_t K, int64_t T, int64_t N, bool in_place) {
    std::vector<uint8_t> wq(ggml_row_size(type, K) * size_t(N));
    if (type == GGML_TYPE_F32) {
        memcpy(wq.data(), w.data(), wq.size());
    } else {
        ggml_quantize_chunk(type, w.data(), wq.data(), 0, N, K, nullptr);
    }
    qt::stage_dumper no_dump;
    qt::graph_run run(backend, no_dump, 64);
    ggml_tensor * y = qt::dense(run.ctx(), run.input("w", type, wq.data(), { K, N }),
                                run.input_f32("x", x.data(), { K, T }), run.input_f32("b", b.data(), { N }),
                                run.input_f32("r", r.data(), { N, T }), in_place);
    run.compute(y);
    return run.read_f32(y);
}

// dense() with a packed_weight: on every path within f32 rounding of the exact product of the
// f16 weights, and with the same bits as the f16 weights as stored wherever those take the
// packed GEMM too (from 8 frames on the vector paths). Depths over one 256-deep block, outputs
// off the 32-wide panels, one frame, residual in place; 100 frames, whose first block of 96 reads
// a widened copy of each panel and whose last 4 the panel itself.
void test_packed_dense(const qt::cpu_backend & backend) {
    struct shape {
        int64_t K, T, N;
    };
    for (shape sh : { shape{ 300, 37, 21 }, shape{ 600, 1, 70 }, shape{ 96, 9, 96 }, shape{ 1027, 13, 33 },
                      shape{ 300, 100, 40 } }) {
        std::mt19937 rng(uint32_t(sh.K * 5 + sh.T * 11 + sh.N));
        const auto x = random_vector(size_t(sh.K * sh.T), rng);
        const auto w = random_vector(size_t(sh.K * sh.N), rng);
        const auto b = random_vector(size_t(sh.N), rng);
        const auto r = random_vector(size_t(sh.N * sh.T), rng);
        std::vector<uint16_t> half(w.size());
        std::vector<float>    w_used(w.size());
        for (size_t i = 0; i < w.size(); ++i) {
            half[i] = ggml_fp32_to_fp16(w[i]);
            w_used[i] = ggml_fp16_to_fp32(half[i]);
        }
        const std::vector<uint16_t> panels = qt::pack_weight_panels(half.data(), sh.K, sh.N);
        for (bool in_place : { false, true }) {
            for (int level = 0; level <= int(qt::cpu_kernels_best()); ++level) {
                const auto kernels = qt::cpu_kernels(level);
                qt::cpu_kernels_force(kernels);
                qt::stage_dumper no_dump;
                qt::graph_run run(backend, no_dump, 64);
                qt::packed_weight pw;
                pw.panels = run.input("panels", GGML_TYPE_F16, panels.data(), { int64_t(panels.size()) });
                pw.k = sh.K;
                pw.n = sh.N;
                ggml_tensor * y = qt::dense(run.ctx(), pw, run.input_f32("x", x.data(), { sh.K, sh.T }),
                                            run.input_f32("b", b.data(), { sh.N }),
                                            run.input_f32("r", r.data(), { sh.N, sh.T }), in_place);
                run.compute(y);
                const std::vector<float> got = run.read_f32(y);
                char name[128];
                snprintf(name, sizeof(name), "dense %s, packed f16 weights, K %lld T %lld N %lld%s",
                         qt::cpu_kernels_name(kernels), (long long) sh.K, (long long) sh.T, (long long) sh.N,
                         in_place ? " in place" : "");
                double worst = 0.0;
                for (int64_t t = 0; t < sh.T; ++t) {
                    for (int64_t n = 0; n < sh.N; ++n) {
                        double exact = double(b[size_t(n)]) + r[size_t(t * sh.N + n)], magnitude = 0.0;
                        for (int64_t k = 0; k < sh.K; ++k) {
                            exact += double(w_used[size_t(n * sh.K + k)]) * x[size_t(t * sh.K + k)];
                            magnitude += std::fabs(double(w_used[size_t(n * sh.K + k)]) * x[size_t(t * sh.K + k)]);
                        }
                        const double tolerance = std::ldexp(magnitude + 10.0, -23) * double(sh.K);
                        worst = std::max(worst, std::fabs(got[size_t(t * sh.N + n)] - exact) / tolerance);
                    }
                }
                check(worst <= 1.0, "%s: %.2f of the tolerance", name, worst);
                if (level != int(qt::cpu_kernels::generic) && sh.T >= 8) {
                    const std::vector<float> stored =
                        dense_product(backend, GGML_TYPE_F16, x, w, b, r, sh.K, sh.T, sh.N, in_place);
                    check(stored == got, "%s: the same bits as the f16 rows as stored", name);
                }
            }
        }
    }
    qt::cpu_kernels_unforce();
}

// mat_vecs(W, x) beside ggml_mul_mat(W, column c of x) for each column alone: (N, B) then (N, B)
// again. x holds B columns of K floats, `stride` floats apart.
std::vector<float> mat_vecs_and_alone(const qt::cpu_backend & backend, ggml_type type, const std::vector<uint8_t> & wq,
                                      const std::vector<float> & x, int64_t K, int64_t N, int64_t B, int64_t stride) {
    qt::stage_dumper no_dump;
    qt::graph_run    run(backend, no_dump, 64 + 4 * size_t(B));
    ggml_context *   ctx = run.ctx();
    ggml_tensor *    wt = run.input("w", type, wq.data(), { K, N });
    ggml_tensor *    xt = run.input_f32("x", x.data(), { stride, B });
    ggml_tensor *    y = qt::mat_vecs(ctx, wt, ggml_view_2d(ctx, xt, K, B, xt->nb[1], 0));
    ggml_tensor *    alone = nullptr;
    for (int64_t c = 0; c < B; ++c) {
        ggml_tensor * yc = ggml_mul_mat(ctx, wt, ggml_view_2d(ctx, xt, K, 1, xt->nb[1], size_t(c) * xt->nb[1]));
        alone = alone ? ggml_concat(ctx, alone, yc, 1) : yc;
    }
    ggml_tensor * both = ggml_concat(ctx, y, alone, 1);
    run.compute(both);
    return run.read_f32(both);
}

std::vector<uint8_t> quantized(ggml_type type, const std::vector<float> & w, int64_t K, int64_t N) {
    std::vector<uint8_t> wq(ggml_row_size(type, K) * size_t(N));
    if (type == GGML_TYPE_F32) {
        memcpy(wq.data(), w.data(), wq.size());
    } else {
        ggml_quantize_chunk(type, w.data(), wq.data(), 0, N, K, nullptr);
    }
    return wq;
}

// mat_vecs(): each column bit for bit ggml_mul_mat of that column alone, for every weight type
// the engine stores and on every kernel path (depths that are and are not whole 256-blocks, odd
// row counts split between the threads, one column and the counts with kernels of their own and
// beyond, in groups of columns, more than a step's columns (a prefill), strided columns), and close
// to the exact product.
void test_mat_vecs(const qt::cpu_backend & backend) {
    struct shape {
        int64_t K, N, B;
        bool    largest = false;  // the kernels' 16-bit pair sums at their largest
    };
    for (int level = 0; level <= int(qt::cpu_kernels_best()); ++level) {
        qt::cpu_kernels_force(qt::cpu_kernels(level));
        for (ggml_type type : { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K }) {
            for (shape sh : { shape{ 256, 37, 5 }, shape{ 1024, 70, 8 }, shape{ 512, 16, 2 }, shape{ 96, 33, 3 },
                              shape{ 768, 41, 1 }, shape{ 256, 19, 4 }, shape{ 512, 3, 1 },
                              shape{ 512, 23, 11 }, shape{ 256, 9, 19 }, shape{ 512, 21, 45 } }) {
                if (sh.K % ggml_blck_size(type) != 0) {
                    continue;
                }
                std::mt19937 rng(uint32_t(sh.K + sh.N * 7 + sh.B * 13 + int(type)));
                const auto w = random_vector(size_t(sh.K * sh.N), rng);
                const auto x = random_vector(size_t((sh.K + 8) * sh.B), rng);  // columns 8 floats apart
                const std::vector<float> got =
                    mat_vecs_and_alone(backend, type, quantized(type, w, sh.K, sh.N), x, sh.K, sh.N, sh.B, sh.K + 8);
                const size_t half = got.size() / 2;
                char name[96];
                snprintf(name, sizeof(name), "mat_vecs %s K %lld N %lld B %lld (%s kernels)", ggml_type_name(type),
                         (long long) sh.K, (long long) sh.N, (long long) sh.B,
                         qt::cpu_kernels_name(qt::cpu_kernels(level)));
                check(std::equal(got.begin(), got.begin() + half, got.begin() + half),
                      "%s: the same bits as each column alone", name);
                double worst = 0.0;
                for (int64_t c = 0; c < sh.B; ++c) {
                    for (int64_t n = 0; n < sh.N; ++n) {
                        double exact = 0.0, magnitude = 0.0;
                        for (int64_t k = 0; k < sh.K; ++k) {
                            const double p = double(w[size_t(n * sh.K + k)]) * x[size_t(c * (sh.K + 8) + k)];
                            exact += p;
                            magnitude += std::fabs(p);
                        }
                        worst = std::max(worst, std::fabs(got[size_t(c * sh.N + n)] - exact) / (magnitude + 1e-9));
                    }
                }
                // relative to the sum of magnitudes: rounding of the weights (4-bit: a few percent)
                const double bound = type == GGML_TYPE_Q4_K ? 0.05 : type == GGML_TYPE_Q6_K ? 0.02 : 0.01;
                check(worst <= bound, "%s: error %.3g of the magnitude (bound %g)", name, worst, bound);
            }
        }
    }
    qt::cpu_kernels_unforce();
}

// Edge-case columns for the q8_K conversion: exact ties (x.5 after scaling, rounded to even), the
// largest magnitude twice with both signs, a block of zeros, tiny values beside a large one.
std::vector<float> q8k_edge_columns(int64_t K) {
    std::vector<float> x(size_t(K * 4));
    for (int64_t k = 0; k < K; ++k) {
        float * col = x.data();
        col[k] = k % 256 == 3 ? -127.0f : float(k % 255) - 127.0f + 0.5f;  // scale -127 / -127 = 1: ties
        col = x.data() + K;
        col[k] = k % 256 == 9 ? 3.0f : k % 256 == 4 ? -3.0f : 0.01f * float(k % 17);  // -3 comes first
        col = x.data() + 2 * K;
        col[k] = k < 256 ? 0.0f : std::sin(float(k));
        col = x.data() + 3 * K;
        col[k] = k % 128 == 0 ? 1e4f : 1e-30f * float(k % 5);
    }
    return x;
}

// The interleaved kernels' own q8_K conversion: the same bits as ggml's (zeroed sums for a block
// of zeros, which the reference leaves as they were).
void test_q8k_conversion() {
    if (!qt::interleave_supported(GGML_TYPE_Q4_K)) {
        return;
    }
    constexpr int64_t K = 512;
    std::mt19937      rng(7);
    std::vector<float> x = q8k_edge_columns(K);
    const auto         random = random_vector(size_t(K), rng);
    x.insert(x.end(), random.begin(), random.end());
    const ggml_type_traits_cpu * q8k = qt::cpu_backend_loaded().type_traits(GGML_TYPE_Q8_K);
    const size_t                 bytes = ggml_row_size(GGML_TYPE_Q8_K, K);
    for (size_t c = 0; c < x.size() / size_t(K); ++c) {
        std::vector<uint8_t> got(bytes, 0), want(bytes, 0);
        qt::quantize_q8_k(x.data() + c * size_t(K), got.data(), K);
        q8k->from_float(x.data() + c * size_t(K), want.data(), K);
        check(got == want, "q8_K conversion, column %zu: the same bits as ggml's", c);
    }
}

// A row of stored q4_K blocks dotted with a q8_K column in the interleaved kernels' order: per
// block the exact integer sums, then one fused multiply-add each (interleaved-rows.h).
float q4k_dot_in_kernel_order(const uint8_t * row, const uint8_t * column, int64_t nb) {
    float acc = 0.0f, acc_mins = 0.0f;
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t * b = row + i * 144;  // d, dmin (f16), 12 bytes of scales, 128 of nibbles
        const uint8_t * y = column + i * 292;  // d (f32), 256 values, 16 sums of 16
        uint32_t        utmp[4];
        memcpy(utmp, b + 4, 12);
        utmp[3] = ((utmp[2] >> 4) & 0x0f0f0f0f) | (((utmp[1] >> 6) & 0x03030303) << 4);
        const uint32_t uaux = utmp[1] & 0x3f3f3f3f;
        utmp[1] = (utmp[2] & 0x0f0f0f0f) | (((utmp[0] >> 6) & 0x03030303) << 4);
        utmp[2] = uaux;
        utmp[0] &= 0x3f3f3f3f;
        const auto * scales = reinterpret_cast<const uint8_t *>(utmp);  // 8 scales, then 8 mins
        const auto * q8 = reinterpret_cast<const int8_t *>(y + 4);
        int16_t       sums16[16];
        memcpy(sums16, y + 4 + 256, sizeof(sums16));
        int32_t isum = 0, msum = 0;
        for (int s = 0; s < 8; ++s) {
            int32_t dot = 0;
            for (int l = 0; l < 32; ++l) {
                const uint8_t packed = b[16 + 32 * (s / 2) + l];
                dot += int32_t(s % 2 ? packed >> 4 : packed & 0xF) * q8[32 * s + l];
            }
            isum += scales[s] * dot;
            msum += scales[8 + s] * (sums16[2 * s] + sums16[2 * s + 1]);
        }
        uint16_t d16, dmin16;
        float    yd;
        memcpy(&d16, b, 2);
        memcpy(&dmin16, b + 2, 2);
        memcpy(&yd, y, 4);
        acc = std::fma(ggml_fp16_to_fp32(d16) * yd, float(isum), acc);
        acc_mins = std::fma(ggml_fp16_to_fp32(dmin16) * yd, float(msum), acc_mins);
    }
    return acc - acc_mins;
}

// A row of stored q8_0 blocks dotted with a q8_0 column in the interleaved kernels' order: per
// block the exact integer sum, then one fused multiply-add.
float q8_0_dot_in_kernel_order(const uint8_t * row, const uint8_t * column, int64_t nb) {
    float acc = 0.0f;
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t * b = row + i * 34;  // d (f16), 32 values
        const uint8_t * y = column + i * 34;
        int32_t         isum = 0;
        for (int l = 0; l < 32; ++l) {
            isum += int32_t(int8_t(b[2 + l])) * int32_t(int8_t(y[2 + l]));
        }
        uint16_t d16, yd16;
        memcpy(&d16, b, 2);
        memcpy(&yd16, y, 2);
        acc = std::fma(ggml_fp16_to_fp32(d16) * ggml_fp16_to_fp32(yd16), float(isum), acc);
    }
    return acc;
}

// mat_vecs() on interleaved q4_K or q8_0 weights, on every kernel path (AVX2 below a forced generic
// level: interleaved rows have no other): bit for bit the kernel order above, every column the same
// bits as that column alone, the same bits on AVX2 and AVX512, and within rounding of
// ggml_mul_mat on the rows as stored. Shapes: one and several 16-row groups split between the
// threads, every group width of columns and more, a prefill's many columns, edge-case columns.
void test_interleaved(const qt::cpu_backend & backend, ggml_type type) {
    if (!qt::interleave_supported(type)) {
        printf("interleaved %s: not on this CPU\n", ggml_type_name(type));
        return;
    }
    const ggml_type dot_type = type == GGML_TYPE_Q4_K ? GGML_TYPE_Q8_K : GGML_TYPE_Q8_0;
    struct shape {
        int64_t K, N, B;
        bool    largest = false;  // the kernels' 16-bit pair sums at their largest
    };
    std::vector<std::vector<float>> first_level;
    // Each kernel level with the dots the variant gives it, then forms the variant may not run on
    // this processor: AVX2 with AVX-VNNI, AVX512 without VNNI (each the same kernels as a level's
    // where the processor lacks the instructions).
    struct form {
        qt::cpu_kernels      kernels;
        qt::interleaved_dots dots;
        const char *         note;
    };
    std::vector<form> forms;
    const int         best = int(qt::cpu_kernels_best());
    for (int level = 0; level <= best; ++level) {
        forms.push_back({ qt::cpu_kernels(level), qt::interleaved_dots::variant, "" });
    }
    forms.push_back({ qt::cpu_kernels::avx2, qt::interleaved_dots::no_vnni, ", no VNNI" });
    forms.push_back({ qt::cpu_kernels::avx2, qt::interleaved_dots::avx_vnni, ", AVX-VNNI where the CPU has it" });
    if (best == int(qt::cpu_kernels::avx512)) {
        forms.push_back({ qt::cpu_kernels::avx512, qt::interleaved_dots::no_vnni, ", no VNNI" });
    }
    for (size_t level = 0; level < forms.size(); ++level) {
        const form & f = forms[level];
        qt::cpu_kernels_force(f.kernels);
        qt::interleaved_force_dots(f.dots);
        size_t n_case = 0;
        for (shape sh : { shape{ 256, 16, 1 }, shape{ 512, 48, 3 }, shape{ 1024, 80, 8 }, shape{ 768, 32, 9 },
                          shape{ 256, 64, 16 }, shape{ 512, 16, 4 }, shape{ 256, 32, 45 }, shape{ 64, 32, 2 },
                          shape{ 192, 16, 5 }, shape{ 512, 16, 10 }, shape{ 512, 32, 3, true } }) {
            if (sh.K % (type == GGML_TYPE_Q4_K ? 256 : 64) != 0) {
                continue;
            }
            std::mt19937 rng(uint32_t(sh.K + sh.N * 7 + sh.B * 13));
            auto         w = random_vector(size_t(sh.K * sh.N), rng);
            std::vector<float> x = random_vector(size_t((sh.K + 8) * sh.B), rng);  // columns 8 floats apart
            if (sh.largest) {
                // One value in 32 at -1 and the rest at +1 quantize to 4-bit weights 0 and 15 (q4_K)
                // or to +-127 (q8_0); columns all +1 or all -1, to +-127: every byte-pair sum of a
                // sub-block at its bound (the kernels' 16-bit sums must not overflow).
                for (size_t i = 0; i < w.size(); ++i) {
                    w[i] = i % 32 == 0 ? -1.0f : 1.0f;
                }
                for (int64_t c = 0; c < 2; ++c) {
                    std::fill_n(x.data() + c * (sh.K + 8), sh.K, c == 0 ? 1.0f : -1.0f);
                }
            }
            if (sh.B == 4) {
                const std::vector<float> edges = q8k_edge_columns(sh.K);
                for (int64_t c = 0; c < 4; ++c) {
                    std::copy_n(edges.data() + c * sh.K, sh.K, x.data() + c * (sh.K + 8));
                }
            }
            const std::vector<uint8_t> stored = quantized(type, w, sh.K, sh.N);
            std::vector<uint8_t>       interleaved(stored.size());
            qt::interleave_rows(type, stored.data(), interleaved.data(), sh.N, sh.K);

            qt::stage_dumper no_dump;
            qt::graph_run    run(backend, no_dump, 64 + 4 * size_t(sh.B));
            ggml_context *   ctx = run.ctx();
            const std::string name = std::string("w") + qt::k_interleaved_suffix;
            ggml_tensor *    wi = run.input(name.c_str(), type, interleaved.data(), { sh.K, sh.N });
            ggml_tensor *    ws = run.input("w_stored", type, stored.data(), { sh.K, sh.N });
            ggml_tensor *    xt = run.input_f32("x", x.data(), { sh.K + 8, sh.B });
            ggml_tensor *    all = qt::mat_vecs(ctx, wi, ggml_view_2d(ctx, xt, sh.K, sh.B, xt->nb[1], 0));
            ggml_tensor *    alone = nullptr;
            ggml_tensor *    by_ggml = nullptr;
            for (int64_t c = 0; c < sh.B; ++c) {
                ggml_tensor * col = ggml_view_2d(ctx, xt, sh.K, 1, xt->nb[1], size_t(c) * xt->nb[1]);
                ggml_tensor * yc = qt::mat_vecs(ctx, wi, col);
                ggml_tensor * gc = ggml_mul_mat(ctx, ws, col);
                alone = alone ? ggml_concat(ctx, alone, yc, 1) : yc;
                by_ggml = by_ggml ? ggml_concat(ctx, by_ggml, gc, 1) : gc;
            }
            ggml_tensor * out = ggml_concat(ctx, ggml_concat(ctx, all, alone, 1), by_ggml, 1);
            run.compute(out);
            const std::vector<float> got = run.read_f32(out);
            const size_t             n = size_t(sh.N * sh.B);

            char what[128];
            snprintf(what, sizeof(what), "interleaved %s K %lld N %lld B %lld (%s kernels%s)", ggml_type_name(type),
                     (long long) sh.K, (long long) sh.N, (long long) sh.B, qt::cpu_kernels_name(f.kernels), f.note);
            check(std::equal(got.begin(), got.begin() + n, got.begin() + n), "%s: the same bits as each column alone",
                  what);
            std::vector<uint8_t> column(ggml_row_size(dot_type, sh.K));
            const ggml_type_traits_cpu * to_dot = qt::cpu_backend_loaded().type_traits(dot_type);
            bool                 in_order = true;
            double               worst = 0.0;
            for (int64_t c = 0; c < sh.B; ++c) {
                if (type == GGML_TYPE_Q4_K) {
                    qt::quantize_q8_k(x.data() + c * (sh.K + 8), column.data(), sh.K);
                } else {
                    to_dot->from_float(x.data() + c * (sh.K + 8), column.data(), sh.K);
                }
                double scale = 1e-30;  // the column's largest output: sums in another order differ by its rounding
                for (int64_t r = 0; r < sh.N; ++r) {
                    scale = std::max(scale, std::fabs(double(got[2 * n + size_t(c * sh.N + r)])));
                }
                for (int64_t r = 0; r < sh.N; ++r) {
                    const uint8_t * row = stored.data() + size_t(r) * ggml_row_size(type, sh.K);
                    const float     want = type == GGML_TYPE_Q4_K ? q4k_dot_in_kernel_order(row, column.data(), sh.K / 256)
                                                                  : q8_0_dot_in_kernel_order(row, column.data(), sh.K / 32);
                    const float mine = got[size_t(c * sh.N + r)];
                    in_order = in_order && mine == want;
                    const float ggml = got[2 * n + size_t(c * sh.N + r)];
                    worst = std::max(worst, double(std::fabs(mine - ggml)) / scale);
                }
            }
            check(in_order, "%s: bit for bit the kernels' order of sums", what);
            check(worst <= 1e-5, "%s: within %.2g of ggml_mul_mat on the rows as stored (of the largest output)", what,
                  worst);
            const std::vector<float> mine(got.begin(), got.begin() + n);
            if (level == 0) {
                first_level.push_back(mine);
            } else {
                check(mine == first_level[n_case], "%s: the same bits as the AVX2 kernels", what);
            }
            ++n_case;
        }
    }
    qt::interleaved_force_dots(qt::interleaved_dots::variant);
    qt::cpu_kernels_unforce();
}

void test_dense_standard(const qt::cpu_backend & backend) {
    const qt::standard_ops_scope standard(true);
    const int64_t K = 40, N = 24;
    for (int64_t B : { 1, 2 }) {
        for (int64_t T : { 1, 3, 8, 9 }) {
            std::mt19937 rng(uint32_t(100 * B + T));
            const auto x = random_vector(size_t(K * T * B), rng);
            const auto w = random_vector(size_t(K * N), rng);
            const auto b = random_vector(size_t(N), rng);
            const auto r = random_vector(size_t(N * T * B), rng);
            std::vector<float> want(size_t(N * T * B));
            for (int64_t i = 0; i < T * B; ++i) {
                for (int64_t n = 0; n < N; ++n) {
                    double acc = double(b[size_t(n)]) + double(r[size_t(i * N + n)]);
                    for (int64_t k = 0; k < K; ++k) {
                        acc += double(w[size_t(n * K + k)]) * double(x[size_t(i * K + k)]);
                    }
                    want[size_t(i * N + n)] = float(acc);
                }
            }
            qt::stage_dumper no_dump;
            qt::graph_run    run(backend, no_dump, 64);
            ggml_tensor *    y = qt::dense(run.ctx(), run.input_f32("w", w.data(), { K, N }),
                                           run.input_f32("x", x.data(), { K, T, B }), run.input_f32("b", b.data(), { N }),
                                           run.input_f32("r", r.data(), { N, T, B }));
            run.compute(y);
            char name[80];
            snprintf(name, sizeof(name), "dense, standard ops, %lld frames x %lld", (long long) T, (long long) B);
            check(y->ne[0] == N && y->ne[1] == T && y->ne[2] == B, "%s: shape (%lld, %lld, %lld)", name,
                  (long long) y->ne[0], (long long) y->ne[1], (long long) y->ne[2]);
            expect_close(name, run.read_f32(y), want, 2e-5f);
        }
    }
}

void test_dense_paths(const qt::cpu_backend & backend) {
    struct shape {
        int64_t K, T, N;
    };
    for (ggml_type type : { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q8_0 }) {
        for (shape sh : { shape{ 300, 37, 21 }, shape{ 64, 150, 70 }, shape{ 544, 13, 33 }, shape{ 96, 300, 96 } }) {
            if (type == GGML_TYPE_Q8_0) {
                sh.K = (sh.K + 31) / 32 * 32;  // whole q8_0 blocks
            } else if (sh.K % 8 == 0) {
                sh.K += 3;  // a depth that ends in a partial vector
            }
            std::mt19937 rng(uint32_t(sh.K * 7 + sh.T * 3 + sh.N + type));
            const auto x = random_vector(size_t(sh.K * sh.T), rng);
            const auto w = random_vector(size_t(sh.K * sh.N), rng);
            const auto b = random_vector(size_t(sh.N), rng);
            const auto r = random_vector(size_t(sh.N * sh.T), rng);
            // ggml's f16 and q8_0 products round x to the weights' type first (the GEMM keeps
            // x in f32), which moves output (t, n) by at most sum_k |w[n][k]| times x's rounding
            // error; both sum in f32 besides
            std::vector<float> w_used(w.size());
            std::vector<uint8_t> wq(ggml_row_size(type, sh.K) * size_t(sh.N));
            ggml_quantize_chunk(type, w.data(), wq.data(), 0, sh.N, sh.K, nullptr);
            if (type == GGML_TYPE_F32) {
                w_used = w;
            } else {
                ggml_get_type_traits(type)->to_float(wq.data(), w_used.data(), sh.K * sh.N);
            }
            std::vector<double> tolerance(size_t(sh.N * sh.T));
            for (int64_t t = 0; t < sh.T; ++t) {
                for (int64_t n = 0; n < sh.N; ++n) {
                    double bound = 0.0, magnitude = 0.0;
                    for (int64_t k = 0; k < sh.K; ++k) {
                        const float xv = x[size_t(t * sh.K + k)];
                        double x_error = 0.0;
                        if (type == GGML_TYPE_F16) {
                            x_error = std::ldexp(std::fabs(xv), -11);
                        } else if (type == GGML_TYPE_Q8_0) {
                            float amax = 0.0f;
                            for (int64_t j = k / 32 * 32; j < k / 32 * 32 + 32; ++j) {
                                amax = std::max(amax, std::fabs(x[size_t(t * sh.K + j)]));
                            }
                            x_error = amax / 254.0 * 1.01;
                        }
                        const double wv = std::fabs(w_used[size_t(n * sh.K + k)]);
                        bound += wv * x_error;
                        magnitude += wv * std::fabs(xv);
                    }
                    tolerance[size_t(t * sh.N + n)] = bound + std::ldexp(magnitude + 10.0, -23) * double(sh.K);
                }
            }
            for (bool in_place : { false, true }) {
                qt::cpu_kernels_force(qt::cpu_kernels::generic);
                const std::vector<float> want = dense_product(backend, type, x, w, b, r, sh.K, sh.T, sh.N, in_place);
                std::vector<float> first_vector_path;
                for (int level = 1; level <= int(qt::cpu_kernels_best()); ++level) {
                    const auto kernels = qt::cpu_kernels(level);
                    qt::cpu_kernels_force(kernels);
                    const std::vector<float> got = dense_product(backend, type, x, w, b, r, sh.K, sh.T, sh.N, in_place);
                    char name[128];
                    snprintf(name, sizeof(name), "dense %s, %s weights, K %lld T %lld N %lld%s vs ggml",
                             qt::cpu_kernels_name(kernels), ggml_type_name(type), (long long) sh.K, (long long) sh.T,
                             (long long) sh.N, in_place ? " in place" : "");
                    double worst = 0.0;
                    for (size_t i = 0; i < got.size(); ++i) {
                        worst = std::max(worst, std::fabs(double(got[i]) - want[i]) / tolerance[i]);
                    }
                    check(worst <= 1.0, "%s: %.2f of the tolerance", name, worst);
                    if (first_vector_path.empty()) {
                        first_vector_path = got;
                    } else {
                        check(memcmp(got.data(), first_vector_path.data(), got.size() * sizeof(float)) == 0,
                              "%s: the same bits as the avx2 path", name);
                    }
                }
            }
        }
    }
    qt::cpu_kernels_unforce();
}

// ELU fused with zero padding, per kernel path, against std::expm1 (the vector expm1 is
// within a few ulp), including lengths that leave partial vectors.
void test_elu_pad(const qt::cpu_backend & backend) {
    for (int64_t C : { 1, 7, 8, 17, 96 }) {
        std::mt19937 rng(uint32_t(300 + C));
        const int64_t T = 9, left = 2, right = 1;
        auto x = random_vector(size_t(C * T), rng);
        for (size_t i = 0; i < x.size(); i += 5) {
            x[i] *= 40.0f;  // far into the saturated range too
        }
        std::vector<float> want(size_t(C * (left + T + right)), 0.0f);
        for (int64_t t = 0; t < T; ++t) {
            for (int64_t c = 0; c < C; ++c) {
                const float v = x[size_t(t * C + c)];
                want[size_t((t + left) * C + c)] = v > 0.0f ? v : std::expm1(v);
            }
        }
        // every kernel path, then the standard ops a device's graph is built from (here on the CPU)
        for (int level = 0; level <= int(qt::cpu_kernels_best()) + 1; ++level) {
            const bool standard = level > int(qt::cpu_kernels_best());
            qt::cpu_kernels_force(standard ? qt::cpu_kernels::generic : qt::cpu_kernels(level));
            const qt::standard_ops_scope scope(standard);
            qt::stage_dumper no_dump;
            qt::graph_run run(backend, no_dump, 16);
            ggml_tensor * y = qt::elu_pad(run.ctx(), run.input_f32("x", x.data(), { C, T }), left, right);
            run.compute(y);
            char name[96];
            snprintf(name, sizeof(name), "elu_pad %s C %lld",
                     standard ? "standard ops" : qt::cpu_kernels_name(qt::cpu_kernels(level)), (long long) C);
            expect_close(name, run.read_f32(y), want, 1e-6f);
        }
    }
    qt::cpu_kernels_unforce();
}

// Informational: ns per element of snake_beta on (96, 24000) (one second of codec audio at its
// widest rate), from the difference of graphs with 1 and 11 chained ops (so that the input
// upload is not counted), against a scalar sinf loop on one thread.
void time_snake_beta(int n_threads) {
    const int64_t C = 96, T = 24000;
    std::mt19937 rng(11);
    const snake_inputs in = snake_random(C, T, rng);
    qt::cpu_backend backend(n_threads);
    auto run_chain = [&](int n_ops) {
        double best = 1e30;
        for (int rep = 0; rep < 5; ++rep) {
            qt::stage_dumper no_dump;
            qt::graph_run run(backend, no_dump, 64);
            ggml_tensor * y = run.input_f32("x", in.x.data(), { C, T });
            ggml_tensor * a = run.input_f32("alpha", in.alpha.data(), { C });
            ggml_tensor * b = run.input_f32("inv_beta", in.inv_beta.data(), { C });
            for (int i = 0; i < n_ops; ++i) {
                y = qt::snake_beta(run.ctx(), y, a, b);
            }
            const auto start = std::chrono::steady_clock::now();
            run.compute(y);
            best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        }
        return best;
    };
    const double per_op = (run_chain(11) - run_chain(1)) / 10.0;
    printf("snake_beta (96, 24000), %d thread(s): %.3f ns/element\n", n_threads, per_op * 1e9 / double(C * T));
}

void time_snake_scalar() {
    const int64_t C = 96, T = 24000;
    std::mt19937 rng(11);
    const snake_inputs in = snake_random(C, T, rng);
    std::vector<float> y(in.x.size());
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
        const auto start = std::chrono::steady_clock::now();
        for (int64_t t = 0; t < T; ++t) {
            for (int64_t c = 0; c < C; ++c) {
                const float s = std::sin(in.x[size_t(t * C + c)] * in.alpha[size_t(c)]);
                y[size_t(t * C + c)] = in.x[size_t(t * C + c)] + in.inv_beta[size_t(c)] * s * s;
            }
        }
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    float sum = 0.0f;
    for (float v : y) {
        sum += v;
    }
    printf("scalar sinf loop (96, 24000), 1 thread: %.3f ns/element (checksum %g)\n", best * 1e9 / double(C * T), sum);
}

} // namespace

#if defined(__linux__)
// Resident kilobytes of the mapping that starts at `base` (its Rss line in /proc/self/smaps).
long resident_kib(const void * base) {
    std::ifstream smaps("/proc/self/smaps");
    char          start[32];
    snprintf(start, sizeof(start), "%lx-", static_cast<unsigned long>(reinterpret_cast<uintptr_t>(base)));
    bool        in_mapping = false;
    std::string line;
    while (std::getline(smaps, line)) {
        if (line.rfind(start, 0) == 0) {
            in_mapping = true;
        } else if (in_mapping && line.rfind("Rss:", 0) == 0) {
            return std::stol(line.substr(4));
        }
    }
    return -1;
}

// table_rows on a table in a mapped file, as the model loader maps the weights: the same bits as
// ggml_get_rows for every type a table has, with none of the file's pages mapped into the
// process, where ggml_get_rows maps pages (and their neighbours) for each row it reads.
void test_table_rows(const qt::cpu_backend & backend) {
    const int64_t row = 256, n_rows = 4096;  // 1-4 MiB, hundreds of pages, as an embedding
    for (ggml_type type : { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K }) {
        std::mt19937 rng(uint32_t(type) + 5);
        const auto   values = random_vector(size_t(row * n_rows), rng);
        std::vector<uint8_t> bytes(ggml_row_size(type, row) * size_t(n_rows));
        if (type == GGML_TYPE_F32) {
            memcpy(bytes.data(), values.data(), bytes.size());
        } else {
            ggml_quantize_chunk(type, values.data(), bytes.data(), 0, n_rows, row, nullptr);
        }
        char      path[] = "/tmp/vocable-test-table-XXXXXX";
        const int fd = mkstemp(path);
        const bool written = fd >= 0 && write(fd, bytes.data(), bytes.size()) == ssize_t(bytes.size());
        unlink(path);
        void * base = written ? mmap(nullptr, bytes.size(), PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
        if (base == MAP_FAILED) {
            check(false, "table rows %s: a mapped temporary file", ggml_type_name(type));
            return;
        }
        const auto file = std::make_shared<qt::mapped_model_file>(base, bytes.size(), fd);
        const ggml_context_ptr meta = qt::new_metadata_context(1, false, "table");
        ggml_tensor * table = ggml_new_tensor_2d(meta.get(), type, row, n_rows);
        table->data = base;
        const qt::table_rows rows(table, file);

        std::vector<int32_t> ids;
        for (int i = 0; i < 300; ++i) {  // scattered, repeats included
            ids.push_back(int32_t(rng() % uint32_t(n_rows)));
        }
        std::vector<float> through[2];
        long               resident[2] = {};
        for (int from_file : { 1, 0 }) {
            qt::stage_dumper no_dump;
            qt::graph_run run(backend, no_dump, 16);
            ggml_tensor * id = run.input_i32("ids", ids.data(), { int64_t(ids.size()) });
            ggml_tensor * y = from_file ? rows.get(run.ctx(), id) : ggml_get_rows(run.ctx(), table, id);
            run.compute(y);
            through[from_file] = run.read_f32(y);
            resident[from_file] = resident_kib(base);
        }
        const char * name = ggml_type_name(type);
        check(through[1] == through[0], "table rows %s: the same bits as ggml_get_rows", name);
        check(resident[1] == 0, "table rows %s: read from the file, nothing of it mapped in (%ld KiB)", name,
              resident[1]);
        check(resident[0] > 0, "table rows %s: ggml_get_rows through the mapping maps pages in (%ld KiB)", name,
              resident[0]);
    }
}
#endif

int main() {
    return test::run_or_fail([] {
        qt::cpu_backend backend(2);
        printf("kernels: %s (best on this CPU and ggml variant)\n", qt::cpu_kernels_name(qt::cpu_kernels_best()));
        std::vector<std::vector<float>> winograd_avx2;  // the AVX2 path's outputs, to compare with AVX512
        test_dense_paths(backend);
        test_dense_standard(backend);
        test_packed_dense(backend);
        test_mat_vecs(backend);
        test_q8k_conversion();
        test_interleaved(backend, GGML_TYPE_Q4_K);
        test_interleaved(backend, GGML_TYPE_Q8_0);
#if defined(__linux__)
        test_table_rows(backend);
#endif
        test_elu_pad(backend);
        // the building blocks on every path
        for (int level = 0; level <= int(qt::cpu_kernels_best()); ++level) {
            qt::cpu_kernels_force(qt::cpu_kernels(level));
            printf("-- %s kernels\n", qt::cpu_kernels_name(qt::cpu_kernels(level)));
            for (bool extras : { false, true }) {
                test_conv(backend, 1, 1, 1, extras);
                test_conv(backend, 1, 2, 1, extras);
                test_conv(backend, 4, 1, 1, extras);
                test_conv(backend, 4, 3, 1, extras);
                test_conv(backend, 3, 1, 3, extras);
                test_conv(backend, 4, 2, 2, extras);
            }
            size_t winograd_case = 0;
            for (auto [K, dilation] : { std::pair{ 7, 1 }, std::pair{ 7, 3 }, std::pair{ 7, 9 }, std::pair{ 2, 1 } }) {
                for (int64_t t_out : { 1, 5, 37 }) {
                    for (int64_t channels : { 21, 40, 300 }) {
                        const bool      bias = t_out != 5;
                        const ggml_type taps = channels == 40 ? GGML_TYPE_F16 : GGML_TYPE_F32;
                        const std::vector<float> y =
                            test_winograd(backend, K, dilation, t_out, channels, channels + 3, bias, taps);
                        // one tile per piece: each piece's first tile, and the pieces after the
                        // first writing into the outputs in place, give the same bits
                        if (t_out == 37 && (dilation > 1 || K == 2)) {
                            const std::vector<float> one_per_piece =
                                test_winograd(backend, K, dilation, t_out, channels, channels + 3, bias, taps, 1);
                            check(y == one_per_piece, "winograd_conv: a piece per tile differs (case %zu)",
                                  winograd_case);
                        }
                        if (level == int(qt::cpu_kernels::avx2)) {
                            winograd_avx2.push_back(y);
                        } else if (level == int(qt::cpu_kernels::avx512)) {
                            check(y == winograd_avx2[winograd_case], "winograd_conv: AVX512 and AVX2 differ (case %zu)",
                                  winograd_case);
                        }
                        ++winograd_case;
                    }
                }
            }
            test_sliding_windows(backend, 1);
            test_sliding_windows(backend, 3);
            test_pad(backend, qt::pad_mode::zeros, "pad zeros");
            test_pad(backend, qt::pad_mode::reflect, "pad reflect");
            test_pad(backend, qt::pad_mode::replicate, "pad replicate");
            if (level == int(qt::cpu_kernels::generic)) {  // the forms a device's graphs use
                const qt::standard_ops_scope standard(true);
                test_pad(backend, qt::pad_mode::zeros, "pad zeros, standard ops");
                test_pad(backend, qt::pad_mode::reflect, "pad reflect, standard ops");
                test_pad(backend, qt::pad_mode::replicate, "pad replicate, standard ops");
            }
            test_layer_norm(backend);
            for (int64_t C : { 1, 7, 8, 33, 96, 1536 }) {
                for (int64_t T : { 1, 5, 300 }) {
                    test_snake_beta(backend, C, T);
                }
            }
            test_snake_beta(backend, 33, 5, 3);
            test_snake_beta_after_history(backend, 96, 35, 300);
            test_snake_beta_after_history(backend, 7, 6, 1);
            if (level != int(qt::cpu_kernels::generic)) {
                test_snake_beta_sine(backend);  // the vector paths' own sine
            }
        }
        qt::cpu_kernels_unforce();
        time_snake_beta(1);
        time_snake_beta(2);
        time_snake_scalar();
        return test::finish("test-ops: all checks passed");
    });
}
