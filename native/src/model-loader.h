// Loads the engine's GGUF model: validates the file and every tensor's checksum, maps the file
// (or, where it cannot, reads the tensors into one backend buffer) and hands out tensors by name
// with shape checks. Components read their own
// hyperparameters and tensors from it (see gguf-names.h).
#pragma once

#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "gguf.h"
#include "table-rows.h"

#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace qt {

class model_loader {
public:
    // Parses and validates the file and loads all tensor data. Throws qt::error with a message
    // that names the file and what is wrong with it.
    model_loader(const std::string & path, ggml_backend_t backend);

    const std::string & path() const { return path_; }
    // Whether the weights are in the CPU's memory for the CPU backend (not a device's).
    bool                on_cpu() const { return on_cpu_; }

    // Every integer of this model family's metadata (sizes, ids, counts) is far below 2^24
    // (the largest, the text vocabulary, is 151,936): anything larger is refused as corrupt.
    static constexpr uint32_t k_max_u32_value = 1u << 24;
    // Arrays (channels, ratios, language ids) have a few dozen entries at most.
    static constexpr size_t   k_max_array_size = 4096;

    uint32_t    get_u32(const char * key) const;
    // A size or count: 1 .. k_max_u32_value.
    int         get_size(const char * key) const;
    float       get_f32(const char * key) const;  // finite
    std::string get_str(const char * key) const;
    std::vector<int32_t> get_i32_array(const char * key) const;  // 1 .. k_max_array_size values in [0, k_max_u32_value]
    std::vector<std::string> get_str_array(const char * key) const;

    // The tensor `name` with exactly the dimensions `ne` (ggml order, innermost first).
    ggml_tensor * require(const std::string & name, std::initializer_list<int64_t> ne);
    // Same, for tensors whose shape the caller checks itself.
    ggml_tensor * require(const std::string & name);
    // A table read a few rows at a time (an embedding, a codebook): `require` with its rows read
    // from the file where the weights are mapped (table-rows.h).
    table_rows    require_table(const std::string & name, std::initializer_list<int64_t> ne);
    bool          has_tensor(const std::string & name) const;
    // `t` is no longer read (its user keeps a rearranged copy): where the weights are mapped,
    // the pages wholly inside it leave the process's memory (they stay in the page cache).
    void          release(const ggml_tensor * t) const;
    // Whether `t` lies in this loader's file mapping; release_pages() then does what release()
    // does, and may be called after the loader is gone (the mapping outlives it).
    bool          maps(const ggml_tensor * t) const;
    static void   release_pages(const ggml_tensor * t);

    // Moves ownership of the weights out (contexts, buffer and the file mapping the buffer may
    // point into: it must outlive the buffer) once loading is done.
    ggml_context_ptr        take_context() { return std::move(meta_); }
    ggml_backend_buffer_ptr take_buffer() { return std::move(buffer_); }
    std::shared_ptr<void>   take_mapping() { return std::move(mapping_); }
    bool                    mapped() const { return mapping_ != nullptr; }
    size_t                  weight_bytes() const { return weight_bytes_; }

private:
    static constexpr size_t k_read_block = size_t(4) << 20;  // a multiple of 8: see tensor_checksum_update
    static constexpr size_t k_tensor_alignment = 32;          // ggml's TENSOR_ALIGNMENT

    int64_t key_id(const char * key, enum gguf_type type) const;
    void    check_tensor_type(const char * name, const ggml_tensor * t) const;
    bool    map_weights(FILE * file, uint64_t file_size, size_t data_offset, uint64_t data_end, ggml_backend_t backend);
    void    read_weights(FILE * file, size_t data_offset, ggml_backend_t backend);

    std::string             path_;
    gguf_context_ptr        gguf_;
    ggml_context_ptr        meta_;
    std::shared_ptr<mapped_model_file> mapping_;  // declared before buffer_: destroyed after it
    ggml_backend_buffer_ptr buffer_;
    std::map<std::string, ggml_tensor *> tensors_;
    size_t                  weight_bytes_ = 0;
    bool                    on_cpu_ = false;
};

// Checksum of a tensor's bytes as the converter computes it: the sum over little-endian
// 64-bit words w_i (zero-padded) of w_i * (2 i + 1), modulo 2^64. Any change to one word
// changes the sum, so a flipped byte is caught.
uint64_t tensor_checksum(const void * data, size_t n_bytes);
// The same sum continued over the next bytes, which start at word `first_word`; every piece but
// the last must be a multiple of 8 bytes.
uint64_t tensor_checksum_update(uint64_t sum, uint64_t first_word, const void * data, size_t n_bytes);

} // namespace qt
