// Helpers shared by the tests of the model's decoders (test-talker, test-code-predictor):
// loading a model file, the types of a decoder's matrices and the report of the further
// conversions (f16, q8_0, q4_k) against the reference.
#pragma once

#include "model-loader.h"
#include "talker.h"
#include "test-check.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

namespace test {

struct loaded_model {
    std::unique_ptr<qt::model_loader> loader;
    qt::talker                        talker;
};

// A model file with its talker loaded; the caller loads further parts from m->loader.
template <class Model = loaded_model>
std::unique_ptr<Model> load_talker(const std::string & path, const qt::compute_backend & backend) {
    auto m = std::make_unique<Model>();
    m->loader = std::make_unique<qt::model_loader>(path, backend.get());
    m->talker.load(*m->loader);
    return m;
}

// The distinct types of a decoder's matrices, e.g. "f16+q8_0" (tiny rows fall back to f16
// where they are not a whole number of quantization blocks): those of its `layers` blocks
// ("<prefix>.blk.N.attn_q.weight", ...) and the `heads`.
inline std::string matrix_types(qt::model_loader & loader, const std::string & prefix, int layers,
                                const std::vector<std::string> & heads) {
    std::vector<std::string> names;
    auto note = [&](const std::string & tensor) {
        const std::string t = ggml_type_name(loader.require(tensor)->type);
        if (std::find(names.begin(), names.end(), t) == names.end()) {
            names.push_back(t);
        }
    };
    for (int i = 0; i < layers; ++i) {
        for (const char * w : { "attn_q", "attn_k", "attn_v", "attn_o", "ffn_gate", "ffn_up", "ffn_down" }) {
            note(prefix + ".blk." + std::to_string(i) + "." + w + ".weight");
        }
    }
    for (const std::string & head : heads) {
        note(head);
    }
    std::sort(names.begin(), names.end());
    std::string out;
    for (const auto & n : names) {
        out += (out.empty() ? "" : "+") + n;
    }
    return out;
}

// How close a further conversion comes to the reference in one clone mode: a logits cosine
// and the picks identical to the reference's.
struct agreement {
    double cosine = 0;
    int    same = 0;
    int    n = 0;
};

// A further conversion is measured, not held to the f32 parity: only f16 and q8_0 must keep
// the cosine >= 0.99. `cosine_what` and `picks_what` name the figures in the line.
inline void check_conversion(const std::string & path, const std::string & types, const char * mode,
                             const agreement & a, const char * cosine_what, const char * picks_what) {
    const bool must = path.find("f16") != std::string::npos || path.find("q8_0") != std::string::npos;
    check(!must || a.cosine >= 0.99, "%s (matrices %s) %s: %s %.6f, teacher-forced %s %d/%d identical",
          path.substr(path.find_last_of('/') + 1).c_str(), types.c_str(), mode, cosine_what, a.cosine, picks_what,
          a.same, a.n);
}

} // namespace test
