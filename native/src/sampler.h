// Host-side sampling of the talker's code0, in the order of Hugging Face generate() with the
// model's generation_config.json: repetition penalty over the code0 ids generated so far, EOS
// masked until min_new_tokens, suppression of the control ids [suppress_begin, suppress_end)
// except EOS; then, when sampling, temperature, top-k and top-p, and a draw from a seeded
// counter-based RNG, so a seed reproduces a run whatever else ran in between. With temperature
// 0 the token is the argmax of the processed logits (what the reference calls greedy: the
// penalty, min_new_tokens and the suppression still apply).
#pragma once

#include <cstdint>
#include <vector>

namespace qt {

struct talker_sampling {
    float    temperature = 0.9f;         // <= 0: greedy
    int32_t  top_k = 50;                 // <= 0: off
    float    top_p = 1.0f;               // >= 1: off
    float    repetition_penalty = 1.05f; // 1: off
    int32_t  min_new_tokens = 2;         // EOS is masked while fewer tokens were generated
    int32_t  eos_id = 2150;
    int32_t  suppress_begin = 2048;      // vocab - 1024
    int32_t  suppress_end = 3072;        // vocab
    uint64_t seed = 0;
};

// Counter-based RNG: a SplitMix64 hash of (seed, stream, counter). The same triple always gives
// the same value; different counters give independent-looking values. Streams keep the talker
// (stream 0) and the code predictor's draws apart.
uint64_t rng_bits(uint64_t seed, uint64_t stream, uint64_t counter);
// Uniform in [0, 1) with 53 (double) / 24 (float) random bits.
double rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter);
float  rng_uniform_f32(uint64_t seed, uint64_t stream, uint64_t counter);

// ---- the processing steps, in order (exposed for the tests) ---------------------------------

// HF RepetitionPenaltyLogitsProcessor: each distinct previous id's logit is divided by the
// penalty when positive and multiplied by it otherwise.
void apply_repetition_penalty(float * logits, int32_t n_vocab, const std::vector<int32_t> & previous, float penalty);
// EOS to -inf while n_generated < min_new_tokens; ids [begin, end) except EOS to -inf.
void apply_min_new_tokens(float * logits, int32_t n_vocab, int32_t n_generated, int32_t min_new_tokens,
                          int32_t eos_id);
void apply_suppression(float * logits, int32_t n_vocab, int32_t begin, int32_t end, int32_t eos_id);
// First index of the largest value.
int32_t argmax(const float * logits, int32_t n_vocab);
// Temperature, top-k (ties with the k-th value kept, as HF), top-p (HF: drop the smallest
// tokens whose cumulative probability stays <= 1 - top_p, keep at least one), then the token
// whose cumulative probability first exceeds u (in [0, 1)), in id order. `logits` is modified.
int32_t sample_warped(float * logits, int32_t n_vocab, float temperature, int32_t top_k, float top_p, double u);

// The talker's sampler for one request.
class talker_sampler {
public:
    explicit talker_sampler(const talker_sampling & params) : params_(params) {}

    // Processes `logits` in place and returns the next code0, recording it for the penalty.
    int32_t sample(float * logits, int32_t n_vocab);
    const std::vector<int32_t> & generated() const { return generated_; }

private:
    talker_sampling      params_;
    std::vector<int32_t> generated_;
};

} // namespace qt
