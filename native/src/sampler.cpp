#include "sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace qt {

namespace {

uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

constexpr float k_neg_inf = -std::numeric_limits<float>::infinity();

} // namespace

uint64_t rng_bits(uint64_t seed, uint64_t stream, uint64_t counter) {
    return splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ counter);
}

double rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter) {
    return double(rng_bits(seed, stream, counter) >> 11) * 0x1.0p-53;
}

float rng_uniform_f32(uint64_t seed, uint64_t stream, uint64_t counter) {
    return float(rng_bits(seed, stream, counter) >> 40) * 0x1.0p-24f;
}

void apply_repetition_penalty(float * logits, int32_t n_vocab, const std::vector<int32_t> & previous, float penalty) {
    if (penalty == 1.0f || previous.empty()) {
        return;
    }
    std::vector<bool> seen(size_t(n_vocab), false);
    for (int32_t id : previous) {
        if (id < 0 || id >= n_vocab || seen[size_t(id)]) {
            continue;
        }
        seen[size_t(id)] = true;
        float & l = logits[id];
        l = l < 0.0f ? l * penalty : l / penalty;
    }
}

void apply_min_new_tokens(float * logits, int32_t n_vocab, int32_t n_generated, int32_t min_new_tokens,
                          int32_t eos_id) {
    if (n_generated < min_new_tokens && eos_id >= 0 && eos_id < n_vocab) {
        logits[eos_id] = k_neg_inf;
    }
}

void apply_suppression(float * logits, int32_t n_vocab, int32_t begin, int32_t end, int32_t eos_id) {
    for (int32_t i = std::max(begin, 0); i < std::min(end, n_vocab); ++i) {
        if (i != eos_id) {
            logits[i] = k_neg_inf;
        }
    }
}

int32_t argmax(const float * logits, int32_t n_vocab) {
    int32_t best = 0;
    for (int32_t i = 1; i < n_vocab; ++i) {
        if (logits[i] > logits[best]) {
            best = i;
        }
    }
    return best;
}

int32_t sample_warped(float * logits, int32_t n_vocab, float temperature, int32_t top_k, float top_p, double u) {
    if (temperature != 1.0f) {
        const int32_t best = argmax(logits, n_vocab);
        if (std::isinf(logits[best] / temperature)) {
            return best;  // so cold that the logits overflow a float: the limit, greedy
        }
        for (int32_t i = 0; i < n_vocab; ++i) {
            logits[i] /= temperature;
        }
    }
    if (top_k > 0 && top_k < n_vocab) {
        std::vector<float> sorted(logits, logits + n_vocab);
        std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<float>());
        const float kth = sorted[size_t(top_k - 1)];
        for (int32_t i = 0; i < n_vocab; ++i) {
            if (logits[i] < kth) {
                logits[i] = k_neg_inf;
            }
        }
    }
    const float max_logit = logits[argmax(logits, n_vocab)];
    if (max_logit == k_neg_inf) {
        return argmax(logits, n_vocab);  // nothing left to sample; cannot happen with EOS unmasked
    }
    std::vector<double> p(static_cast<size_t>(n_vocab));
    double total = 0.0;
    for (int32_t i = 0; i < n_vocab; ++i) {
        p[size_t(i)] = logits[i] == k_neg_inf ? 0.0 : std::exp(double(logits[i]) - double(max_logit));
        total += p[size_t(i)];
    }
    if (top_p < 1.0f) {
        // ascending by probability; ids break ties so the result does not depend on the sort
        std::vector<int32_t> order(static_cast<size_t>(n_vocab));
        for (int32_t i = 0; i < n_vocab; ++i) {
            order[size_t(i)] = i;
        }
        std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
            return p[size_t(a)] != p[size_t(b)] ? p[size_t(a)] < p[size_t(b)] : a < b;
        });
        double cum = 0.0;
        const double drop_below = 1.0 - double(top_p);
        for (int32_t r = 0; r + 1 < n_vocab; ++r) {  // the most probable token always stays
            const int32_t i = order[size_t(r)];
            cum += p[size_t(i)] / total;
            if (cum <= drop_below) {
                p[size_t(i)] = 0.0;
                logits[i] = k_neg_inf;
            } else {
                break;
            }
        }
        total = 0.0;
        for (double v : p) {
            total += v;
        }
    }
    const double target = u * total;
    double cum = 0.0;
    int32_t last = -1;
    for (int32_t i = 0; i < n_vocab; ++i) {
        if (p[size_t(i)] <= 0.0) {
            continue;
        }
        cum += p[size_t(i)];
        last = i;
        if (cum > target) {
            return i;
        }
    }
    return last;  // rounding left u * total just above the sum
}

int32_t talker_sampler::sample(float * logits, int32_t n_vocab) {
    const int32_t n_generated = int32_t(generated_.size());
    apply_repetition_penalty(logits, n_vocab, generated_, params_.repetition_penalty);
    apply_min_new_tokens(logits, n_vocab, n_generated, params_.min_new_tokens, params_.eos_id);
    apply_suppression(logits, n_vocab, params_.suppress_begin, params_.suppress_end, params_.eos_id);
    int32_t token;
    if (params_.temperature <= 0.0f) {
        token = argmax(logits, n_vocab);
    } else {
        const double u = rng_uniform(params_.seed, 0, uint64_t(n_generated));
        token = sample_warped(logits, n_vocab, params_.temperature, params_.top_k, params_.top_p, u);
    }
    generated_.push_back(token);
    return token;
}

} // namespace qt
