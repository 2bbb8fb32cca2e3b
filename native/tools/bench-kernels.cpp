// Measures the processor's FMA peak per instruction set and the engine's GEMM (through
// conv1d, as the codec decoder runs it) on the real 0.6B decoder's shapes, for every kernel
// path this CPU runs, so the GEMM's share of the peak is one run's ratio.
//
//   qt-bench-kernels [--threads N] [--quick]
#include "cpu-ops.h"
#include "graph.h"
#include "log.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#if defined(__GNUC__) && defined(__x86_64__)
#    include <immintrin.h>
#    define QT_X86 1
#endif

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

#ifdef QT_X86
// Independent FMA chains, more than the FMA latency times the issue width, so the units never
// wait: 12 ymm or 24 zmm accumulators. Returns a sum so the work is not optimised away.
__attribute__((target("avx2,fma"))) float fma_loop_avx2(int64_t iterations) {
    __m256       acc[12];
    const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    for (auto & v : acc) {
        v = _mm256_set1_ps(1.0f);
    }
    for (int64_t i = 0; i < iterations; ++i) {
#    pragma GCC unroll 12
        for (auto & v : acc) {
            v = _mm256_fmadd_ps(v, a, b);
        }
    }
    float out[8];
    __m256 sum = acc[0];
    for (int i = 1; i < 12; ++i) {
        sum = _mm256_add_ps(sum, acc[i]);
    }
    _mm256_storeu_ps(out, sum);
    return out[0];
}

__attribute__((target("avx512f"))) float fma_loop_avx512(int64_t iterations) {
    __m512       acc[24];
    const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    for (auto & v : acc) {
        v = _mm512_set1_ps(1.0f);
    }
    for (int64_t i = 0; i < iterations; ++i) {
#    pragma GCC unroll 24
        for (auto & v : acc) {
            v = _mm512_fmadd_ps(v, a, b);
        }
    }
    __m512 sum = acc[0];
    for (int i = 1; i < 24; ++i) {
        sum = _mm512_add_ps(sum, acc[i]);
    }
    return _mm512_reduce_add_ps(sum);
}
#endif

// GFLOP/s of the FMA loop of `kernels` on `threads` threads at once (best of 3).
double fma_peak(qt::cpu_kernels kernels, int threads, bool quick) {
#ifdef QT_X86
    const bool    avx512 = kernels == qt::cpu_kernels::avx512;
    const int64_t iterations = quick ? 2000000 : 20000000;
    const double  flops_per_thread = double(iterations) * (avx512 ? 24 * 16 : 12 * 8) * 2.0;
    double        best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
        std::vector<std::thread> pool;
        std::vector<float>       sink(static_cast<size_t>(threads));
        const auto               start = std::chrono::steady_clock::now();
        for (int t = 0; t < threads; ++t) {
            pool.emplace_back([&, t] { sink[size_t(t)] = avx512 ? fma_loop_avx512(iterations) : fma_loop_avx2(iterations); });
        }
        for (auto & th : pool) {
            th.join();
        }
        best = std::min(best, seconds_since(start));
    }
    return flops_per_thread * threads / best / 1e9;
#else
    return 0.0;
#endif
}

struct conv_shape {
    const char * name;
    int64_t      c_in, c_out, frames;  // frames of one second of audio
};

// The decoder's 7-tap convolutions, one second of audio each (the input conv at 50 Hz, then
// the residual units after each upsampling stage); together most of its multiply-adds.
const conv_shape k_shapes[] = {
    { "input conv 1024->1536 @ 50 Hz", 1024, 1536, 50 },
    { "residual 768 @ 400 Hz", 768, 768, 400 },
    { "residual 384 @ 2 kHz", 384, 384, 2000 },
    { "residual 192 @ 8 kHz", 192, 192, 8000 },
    { "residual 96 @ 24 kHz", 96, 96, 24000 },
};

// Seconds of one conv1d (best of `reps`), graph built with the kernels active now.
double time_conv(const qt::cpu_backend & backend, const conv_shape & s, int64_t frames, int reps) {
    constexpr int64_t taps = 7;
    std::mt19937 rng(7);
    std::normal_distribution<float> dist;
    std::vector<float> x(size_t(s.c_in * (frames + taps - 1))), w(size_t(s.c_in * taps * s.c_out)), b(size_t(s.c_out));
    for (auto * v : { &x, &w, &b }) {
        for (float & e : *v) {
            e = dist(rng);
        }
    }
    double best = 1e30;
    for (int rep = 0; rep < reps; ++rep) {
        qt::stage_dumper no_dump;
        qt::graph_run run(backend, no_dump, 64);
        ggml_tensor * y = qt::conv1d(run.ctx(), run.input_f32("x", x.data(), { s.c_in, frames + taps - 1 }),
                                     run.input_f32("w", w.data(), { s.c_in, taps, s.c_out }),
                                     run.input_f32("b", b.data(), { s.c_out }), 1, 1);
        const auto start = std::chrono::steady_clock::now();
        run.compute(y);
        best = std::min(best, seconds_since(start));
    }
    return best;
}

} // namespace

int main(int argc, char ** argv) {
    int  threads = 2;
    bool quick = false;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            threads = std::max(1, atoi(argv[++i]));
        } else if (!strcmp(argv[i], "--quick")) {
            quick = true;
        } else {
            fprintf(stderr, "usage: %s [--threads N] [--quick]\n", argv[0]);
            return 2;
        }
    }
    try {
        qt::cpu_backend backend(threads, false);
        const qt::cpu_kernels best = qt::cpu_kernels_best();
        printf("kernels: %s at best; %d thread(s)%s\n", qt::cpu_kernels_name(best), threads, quick ? "; quick" : "");
        double peak = 0.0;
        std::vector<double> peaks(size_t(best) + 1, 0.0);
        for (int level = 1; level <= int(best); ++level) {
            peaks[size_t(level)] = fma_peak(qt::cpu_kernels(level), threads, quick);
            peak = std::max(peak, peaks[size_t(level)]);
            printf("FMA peak, %s: %.1f GFLOP/s on %d thread(s)\n", qt::cpu_kernels_name(qt::cpu_kernels(level)),
                   peaks[size_t(level)], threads);
        }
        printf("%-32s %9s", "conv1d, k 7 (1 s of audio)", "GFLOP");
        for (int level = 0; level <= int(best); ++level) {
            printf(" | %-8s ms  GFLOP/s  peak", qt::cpu_kernels_name(qt::cpu_kernels(level)));
        }
        printf("\n");
        std::vector<double> total_seconds(size_t(best) + 1, 0.0);
        double total_flops = 0.0;
        for (const conv_shape & s : k_shapes) {
            const int64_t frames = quick ? std::max<int64_t>(12, s.frames / 20) : s.frames;
            const double  flops = 2.0 * double(s.c_in * 7 * s.c_out) * double(frames);
            total_flops += flops;
            printf("%-32s %9.2f", s.name, flops / 1e9);
            for (int level = 0; level <= int(best); ++level) {
                qt::cpu_kernels_force(qt::cpu_kernels(level));
                const double sec = time_conv(backend, s, frames, quick ? 1 : 5);
                total_seconds[size_t(level)] += sec;
                printf(" | %11.2f %8.1f %4.0f%%", sec * 1e3, flops / sec / 1e9, peak > 0 ? 100.0 * flops / sec / 1e9 / peak : 0.0);
            }
            printf("\n");
        }
        qt::cpu_kernels_unforce();
        printf("%-32s %9.2f", "all", total_flops / 1e9);
        for (int level = 0; level <= int(best); ++level) {
            const double rate = total_flops / total_seconds[size_t(level)] / 1e9;
            printf(" | %11.2f %8.1f %4.0f%%", total_seconds[size_t(level)] * 1e3, rate, peak > 0 ? 100.0 * rate / peak : 0.0);
        }
        printf("\n");
    } catch (const std::exception & e) {
        fprintf(stderr, "qt-bench-kernels: %s\n", e.what());
        return 1;
    }
    return 0;
}
