#include "mel.h"

#include "log.h"

#include <algorithm>
#include <cmath>

namespace qt {

namespace {

constexpr double k_pi = 3.14159265358979323846;

// Slaney's mel scale (librosa htk=False): linear below 1 kHz, logarithmic above.
double hz_to_mel(double hz) {
    const double f_sp = 200.0 / 3.0;
    const double min_log_hz = 1000.0;
    const double min_log_mel = min_log_hz / f_sp;
    const double logstep = std::log(6.4) / 27.0;
    return hz >= min_log_hz ? min_log_mel + std::log(hz / min_log_hz) / logstep : hz / f_sp;
}

double mel_to_hz(double mel) {
    const double f_sp = 200.0 / 3.0;
    const double min_log_hz = 1000.0;
    const double min_log_mel = min_log_hz / f_sp;
    const double logstep = std::log(6.4) / 27.0;
    return mel >= min_log_mel ? min_log_hz * std::exp(logstep * (mel - min_log_mel)) : f_sp * mel;
}

// In-place iterative radix-2 complex FFT of n = re.size() points (double precision, plain
// arithmetic: std::complex's operator* goes through a NaN-checking library call).
class complex_fft {
public:
    explicit complex_fft(size_t n) : n_(n), bitrev_(n), cos_(n / 2), sin_(n / 2) {
        for (size_t i = 0, j = 0; i < n; ++i) {
            bitrev_[i] = j;
            size_t bit = n >> 1;
            for (; j & bit; bit >>= 1) {
                j ^= bit;
            }
            j ^= bit;
        }
        for (size_t k = 0; k < n / 2; ++k) {
            cos_[k] = std::cos(2.0 * k_pi * double(k) / double(n));
            sin_[k] = -std::sin(2.0 * k_pi * double(k) / double(n));
        }
    }

    void run(std::vector<double> & re, std::vector<double> & im) const {
        for (size_t i = 0; i < n_; ++i) {
            const size_t j = bitrev_[i];
            if (i < j) {
                std::swap(re[i], re[j]);
                std::swap(im[i], im[j]);
            }
        }
        for (size_t len = 2; len <= n_; len <<= 1) {
            const size_t half = len / 2;
            const size_t step = n_ / len;
            for (size_t i = 0; i < n_; i += len) {
                for (size_t k = 0; k < half; ++k) {
                    const double wr = cos_[k * step], wi = sin_[k * step];
                    const size_t a = i + k, b = a + half;
                    const double vr = re[b] * wr - im[b] * wi;
                    const double vi = re[b] * wi + im[b] * wr;
                    re[b] = re[a] - vr;
                    im[b] = im[a] - vi;
                    re[a] += vr;
                    im[a] += vi;
                }
            }
        }
    }

private:
    size_t              n_;
    std::vector<size_t> bitrev_;
    std::vector<double> cos_, sin_;
};

} // namespace

mel_frontend::mel_frontend(int sample_rate, float f_min, float f_max) {
    window_.resize(n_fft);
    for (int i = 0; i < n_fft; ++i) {
        window_[i] = float(0.5 - 0.5 * std::cos(2.0 * k_pi * i / n_fft));  // periodic
    }
    // librosa.filters.mel(norm="slaney"): triangles between consecutive mel points,
    // normalised to unit area (2 / bandwidth in Hz). Computed in double, stored as float.
    std::vector<double> mel_points(n_mels + 2);
    const double mel_lo = hz_to_mel(f_min);
    const double mel_hi = hz_to_mel(f_max);
    for (int i = 0; i < n_mels + 2; ++i) {
        mel_points[i] = mel_to_hz(mel_lo + (mel_hi - mel_lo) * i / (n_mels + 1));
    }
    bands_.resize(n_mels);
    for (int m = 0; m < n_mels; ++m) {
        const double lo = mel_points[m];
        const double mid = mel_points[m + 1];
        const double hi = mel_points[m + 2];
        const double enorm = 2.0 / (hi - lo);
        band & b = bands_[m];
        b.first_bin = -1;
        for (int k = 0; k < n_bins; ++k) {
            const double f = double(sample_rate) / 2.0 * k / (n_bins - 1);
            const double lower = (f - lo) / (mid - lo);
            const double upper = (hi - f) / (hi - mid);
            const double w = std::max(0.0, std::min(lower, upper)) * enorm;
            if (w > 0.0) {
                if (b.first_bin < 0) {
                    b.first_bin = k;
                }
                b.weights.resize(size_t(k - b.first_bin + 1), 0.0f);
                b.weights.back() = float(w);
            }
        }
        if (b.first_bin < 0) {
            b.first_bin = 0;  // an empty band (librosa warns); it stays all zero
        }
    }
}

int64_t mel_frontend::n_frames(int64_t n_samples) {
    const int64_t pad = (n_fft - hop) / 2;
    return (n_samples + 2 * pad - n_fft) / hop + 1;
}

std::vector<float> mel_frontend::compute(const float * pcm, int64_t n_samples, const stage_dumper & dumper) const {
    const int64_t pad = (n_fft - hop) / 2;
    if (n_samples < min_samples()) {
        throw error(QT_STATUS_INVALID_PARAMS, format("clip of %lld samples is too short for the mel frontend",
                                                     (long long) n_samples));
    }
    // reflect padding (edge sample not repeated), as torch.nn.functional.pad(mode="reflect")
    std::vector<float> padded(size_t(n_samples + 2 * pad));
    for (int64_t i = 0; i < n_samples + 2 * pad; ++i) {
        int64_t j = i - pad;
        if (j < 0) {
            j = -j;
        } else if (j >= n_samples) {
            j = 2 * (n_samples - 1) - j;
        }
        padded[size_t(i)] = pcm[j];
    }

    const int64_t T = n_frames(n_samples);
    std::vector<float> magnitude(size_t(T) * n_bins);
    // A real FFT of n_fft points as a complex FFT of n_fft / 2: z[m] = x[2m] + i x[2m + 1], then
    // X[k] = (Z[k] + conj Z[h - k]) / 2 - i e^{-2 pi i k / n} (Z[k] - conj Z[h - k]) / 2.
    constexpr int half = n_fft / 2;
    static const complex_fft fft(half);
    std::vector<double> zr(half), zi(half), tw_r(half + 1), tw_i(half + 1);
    for (int k = 0; k <= half; ++k) {
        tw_r[k] = std::cos(2.0 * k_pi * k / n_fft);
        tw_i[k] = -std::sin(2.0 * k_pi * k / n_fft);
    }
    for (int64_t t = 0; t < T; ++t) {
        const float * x = padded.data() + t * hop;
        for (int m = 0; m < half; ++m) {
            zr[m] = double(x[2 * m]) * window_[2 * m];
            zi[m] = double(x[2 * m + 1]) * window_[2 * m + 1];
        }
        fft.run(zr, zi);
        float * row = magnitude.data() + t * n_bins;
        for (int k = 0; k <= half; ++k) {
            const int    a = k % half, b = (half - k) % half;
            const double er = 0.5 * (zr[a] + zr[b]), ei = 0.5 * (zi[a] - zi[b]);  // even part
            const double orr = 0.5 * (zi[a] + zi[b]), oi = -0.5 * (zr[a] - zr[b]);  // odd part
            const double re = er + tw_r[k] * orr - tw_i[k] * oi;
            const double im = ei + tw_r[k] * oi + tw_i[k] * orr;
            row[k] = float(std::sqrt(re * re + im * im + 1e-9));
        }
    }

    std::vector<float> filtered(size_t(T) * n_mels);
    for (int64_t t = 0; t < T; ++t) {
        const float * row = magnitude.data() + t * n_bins;
        for (int m = 0; m < n_mels; ++m) {
            const band & b = bands_[m];
            float acc = 0.0f;
            for (size_t k = 0; k < b.weights.size(); ++k) {
                acc += b.weights[k] * row[b.first_bin + k];
            }
            filtered[size_t(t) * n_mels + m] = acc;
        }
    }
    std::vector<float> log_mel(filtered.size());
    for (size_t i = 0; i < filtered.size(); ++i) {
        log_mel[i] = std::log(std::max(filtered[i], 1e-5f));
    }

    if (dumper.enabled()) {
        dumper.write("mel_magnitude", magnitude.data(), { T, n_bins });
        dumper.write("mel_filtered", filtered.data(), { T, n_mels });
        dumper.write("mel", log_mel.data(), { T, n_mels });
    }
    return log_mel;
}

} // namespace qt
