// Op-level checks of the shared building blocks against naive reference loops.
#include "graph.h"
#include "log.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace {

int failures = 0;

void expect_close(const char * what, const std::vector<float> & got, const std::vector<float> & want, float tol) {
    if (got.size() != want.size()) {
        fprintf(stderr, "%s: size %zu != %zu\n", what, got.size(), want.size());
        ++failures;
        return;
    }
    float worst = 0.0f;
    for (size_t i = 0; i < got.size(); ++i) {
        worst = std::max(worst, std::fabs(got[i] - want[i]));
    }
    if (!(worst <= tol)) {
        fprintf(stderr, "%s: max abs error %g > %g\n", what, worst, tol);
        ++failures;
    } else {
        printf("%s: ok (max abs error %.2g)\n", what, worst);
    }
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
        fprintf(stderr, "%s: output %lld x %lld, expected %lld x %lld\n", name, (long long) y->ne[0],
                (long long) y->ne[1], (long long) c_out, (long long) t_out);
        ++failures;
        return;
    }
    expect_close(name, run.read_f32(y), want, 1e-4f);
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
        fprintf(stderr, "%s: view is %lld x %lld, expected %lld x %lld\n", name, (long long) windows->ne[0],
                (long long) windows->ne[1], (long long) (K * c_in), (long long) t_out);
        ++failures;
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

} // namespace

int main() {
    try {
        qt::cpu_backend backend(2);
        for (bool extras : { false, true }) {
            test_conv(backend, 1, 1, 1, extras);
            test_conv(backend, 1, 2, 1, extras);
            test_conv(backend, 4, 1, 1, extras);
            test_conv(backend, 4, 3, 1, extras);
            test_conv(backend, 3, 1, 3, extras);
            test_conv(backend, 4, 2, 2, extras);
        }
        test_sliding_windows(backend, 1);
        test_sliding_windows(backend, 3);
        test_pad(backend, qt::pad_mode::zeros, "pad zeros");
        test_pad(backend, qt::pad_mode::reflect, "pad reflect");
        test_pad(backend, qt::pad_mode::replicate, "pad replicate");
        test_layer_norm(backend);
    } catch (const std::exception & e) {
        fprintf(stderr, "test-ops: %s\n", e.what());
        return 1;
    }
    if (failures) {
        fprintf(stderr, "test-ops: %d failure(s)\n", failures);
        return 1;
    }
    printf("test-ops: all checks passed\n");
    return 0;
}
