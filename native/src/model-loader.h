// Loads the engine's GGUF model: validates the file, reads every tensor into one CPU backend
// buffer and hands out tensors by name with shape checks. Components read their own
// hyperparameters and tensors from it (see gguf-names.h).
#pragma once

#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "gguf.h"

#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

namespace qt {

class model_loader {
public:
    // Parses and validates the file and loads all tensor data. Throws qt::error with a message
    // that names the file and what is wrong with it.
    model_loader(const std::string & path, ggml_backend_t backend);

    const std::string & path() const { return path_; }

    uint32_t    get_u32(const char * key) const;
    float       get_f32(const char * key) const;
    std::string get_str(const char * key) const;
    std::vector<int32_t> get_i32_array(const char * key) const;
    std::vector<std::string> get_str_array(const char * key) const;

    // The tensor `name` with exactly the dimensions `ne` (ggml order, innermost first).
    ggml_tensor * require(const std::string & name, std::initializer_list<int64_t> ne);
    // Same, for tensors whose shape the caller checks itself.
    ggml_tensor * require(const std::string & name);
    bool          has_tensor(const std::string & name) const;

    // Moves ownership of the weights out (contexts and buffer) once loading is done.
    ggml_context_ptr        take_context() { return std::move(meta_); }
    ggml_backend_buffer_ptr take_buffer() { return std::move(buffer_); }
    size_t                  weight_bytes() const { return weight_bytes_; }

private:
    int64_t key_id(const char * key, enum gguf_type type) const;

    std::string             path_;
    gguf_context_ptr        gguf_;
    ggml_context_ptr        meta_;
    ggml_backend_buffer_ptr buffer_;
    std::map<std::string, ggml_tensor *> tensors_;
    size_t                  weight_bytes_ = 0;
};

// Checksum of a tensor's bytes as the converter computes it: the sum over little-endian
// 64-bit words w_i (zero-padded) of w_i * (2 i + 1), modulo 2^64. Any change to one word
// changes the sum, so a flipped byte is caught.
uint64_t tensor_checksum(const void * data, size_t n_bytes);

} // namespace qt
