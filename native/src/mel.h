// Log-mel frontend of the speaker encoder: reflect-padded 1024-point STFT (periodic Hann,
// hop 256, center off), magnitude sqrt(re^2 + im^2 + 1e-9), Slaney mel filterbank (librosa's
// default, 128 bands, 0..12 kHz) and log(clamp(x, 1e-5)). Computed on the host: a real FFT
// is cheaper than a DFT matrix product and the filterbank is sparse.
#pragma once

#include "graph.h"

#include <cstdint>
#include <vector>

namespace qt {

class mel_frontend {
public:
    static constexpr int n_fft = 1024;
    static constexpr int hop = 256;
    static constexpr int n_mels = 128;
    static constexpr int n_bins = n_fft / 2 + 1;

    explicit mel_frontend(int sample_rate, float f_min = 0.0f, float f_max = 12000.0f);

    // Frames the clip yields: (n + 2 * pad - n_fft) / hop + 1, pad = (n_fft - hop) / 2.
    static int64_t n_frames(int64_t n_samples);
    // Shortest clip the reflect padding accepts.
    static int64_t min_samples() { return (n_fft - hop) / 2 + 1; }

    // Log-mel of `pcm`, ne = (n_mels, n_frames) (numpy [T, 128]). Dumps "mel_magnitude",
    // "mel_filtered" and "mel".
    std::vector<float> compute(const float * pcm, int64_t n_samples, const stage_dumper & dumper) const;

private:
    struct band {
        int                first_bin;
        std::vector<float> weights;
    };
    std::vector<band>  bands_;   // one per mel band, its nonzero filter weights only
    std::vector<float> window_;  // periodic Hann
};

} // namespace qt
