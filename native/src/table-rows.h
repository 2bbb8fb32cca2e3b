// Row lookups in the weight tables that are read a few rows at a time: the text and codec
// embeddings and the codec decoder's codebooks.
//
// A lookup through the mapped model file makes more than its row resident: on every page fault
// in a file mapping Linux also maps the cached pages around it (fault-around, 64 KiB by default),
// and madvise(MADV_RANDOM) does not stop it. Measured on a real-shape 0.6B q8_0 model, 50 frames:
// the code predictor's embeddings (32 MiB) and the decoder's codebooks (32 MiB) were wholly
// resident, and the 315 MiB text embedding grows the same way with every new word of a long
// text. Where a table lies in the mapped file and the graph runs on the CPU, its rows are read
// from the file with pread instead: they come from the page cache, and the process maps none of
// the table. Same bits as ggml_get_rows.
#pragma once

#include "ggml-backend.h"
#include "ggml.h"

#include <cstddef>
#include <cstdint>
#include <memory>

namespace qt {

// The model file mapped read-only, with a descriptor of its own for reading rows; unmapped and
// closed with the last owner.
class mapped_model_file {
public:
    mapped_model_file(void * base, size_t size, int fd) : base_(base), size_(size), fd_(fd) {}
    ~mapped_model_file();
    mapped_model_file(const mapped_model_file &) = delete;
    mapped_model_file & operator=(const mapped_model_file &) = delete;

    const uint8_t * base() const { return static_cast<const uint8_t *>(base_); }
    size_t          size() const { return size_; }
    int             fd() const { return fd_; }  // -1: none, rows are read through the mapping

    // Keeps the buffer of the file's vectors, read into memory beside the mapping
    // (model_loader::map_weights), as long as the mapping.
    void keep(ggml_backend_buffer_t vectors) { vectors_ = vectors; }

private:
    void *                base_;
    size_t                size_;
    int                   fd_;
    ggml_backend_buffer_t vectors_ = nullptr;
};

// A (row, n_rows) weight table and how to read its rows.
class table_rows {
public:
    table_rows() = default;
    // `file`: the mapping `table` lies in, or null for a table in any other buffer (read into
    // memory, or on a device).
    table_rows(ggml_tensor * table, std::shared_ptr<const mapped_model_file> file);

    ggml_tensor * table() const { return table_; }
    // (row, n) f32: rows ids (I32, n) of the table, bit for bit ggml_get_rows(table, ids). Read
    // from the file on the CPU; ggml_get_rows itself elsewhere (a device's graph, or a table
    // not in a mapped file).
    ggml_tensor * get(ggml_context * ctx, ggml_tensor * ids) const;

    struct source;  // what the lookup op reads: the descriptor, the table's offset and layout

private:
    ggml_tensor *                 table_ = nullptr;
    std::shared_ptr<const source> source_;
};

} // namespace qt
