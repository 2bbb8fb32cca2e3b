#include "table-rows.h"

#include "cpu-ops.h"

#include <cerrno>
#include <cstring>
#include <vector>

#if !defined(_WIN32)
#    include <sys/mman.h>
#    include <unistd.h>
#endif

namespace qt {

mapped_model_file::~mapped_model_file() {
    if (vectors_) {
        ggml_backend_buffer_free(vectors_);
    }
#if !defined(_WIN32)
    munmap(base_, size_);
    if (fd_ >= 0) {
        close(fd_);
    }
#endif
}

struct table_rows::source {
    std::shared_ptr<const mapped_model_file> file;
    const uint8_t *                          mapped;     // the table's first byte in the mapping
    int64_t                                  offset;     // ... and in the file
    size_t                                   row_bytes;  // as stored
    int64_t                                  row;        // values per row
    int64_t                                  n_rows;
    ggml_type                                type;
};

namespace {

// The whole of `n` bytes at `offset`, or false (a file that shrank or failed under the engine).
bool read_exactly(int fd, void * dst, size_t n, int64_t offset) {
#if !defined(_WIN32)
    auto * p = static_cast<uint8_t *>(dst);
    while (n > 0) {
        const ssize_t got = pread(fd, p, n, off_t(offset));
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got <= 0) {
            return false;
        }
        p += got;
        n -= size_t(got);
        offset += got;
    }
    return true;
#else
    (void) fd, (void) dst, (void) n, (void) offset;
    return false;
#endif
}

// dst (row, n) f32 = the rows src[0] (I32, n) of the table; userdata: its source.
void read_rows_op(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const auto &        s = *static_cast<const table_rows::source *>(userdata);
    const ggml_tensor * ids = dst->src[0];
    const int64_t       n = ggml_nelements(ids);
    const int64_t       first = n * ith / nth;
    const int64_t       last = n * (ith + 1) / nth;
    thread_local std::vector<uint8_t> raw;
    for (int64_t i = first; i < last; ++i) {
        const int32_t id = *reinterpret_cast<const int32_t *>(static_cast<const char *>(ids->data) + i * ids->nb[0]);
        GGML_ASSERT(id >= 0 && id < s.n_rows);  // as ggml_get_rows: callers check the ids they are given
        auto *        out = reinterpret_cast<float *>(static_cast<char *>(dst->data) + i * dst->nb[1]);
        const int64_t at = s.offset + int64_t(id) * int64_t(s.row_bytes);
        void *        bytes = out;
        if (s.type != GGML_TYPE_F32) {
            raw.resize(s.row_bytes);
            bytes = raw.data();
        }
        if (!read_exactly(s.file->fd(), bytes, s.row_bytes, at)) {
            // the mapping then, as ggml_get_rows would have read it
            std::memcpy(bytes, s.mapped + size_t(id) * s.row_bytes, s.row_bytes);
        }
        if (s.type != GGML_TYPE_F32) {
            ggml_get_type_traits(s.type)->to_float(raw.data(), out, s.row);
        }
    }
}

} // namespace

table_rows::table_rows(ggml_tensor * table, std::shared_ptr<const mapped_model_file> file) : table_(table) {
    GGML_ASSERT(table && ggml_n_dims(table) <= 2);
    const auto * data = static_cast<const uint8_t *>(table->data);
    if (!file || file->fd() < 0 || !ggml_is_contiguous(table) || !data || data < file->base() ||
        data + ggml_nbytes(table) > file->base() + file->size() ||
        (table->type != GGML_TYPE_F32 && !ggml_get_type_traits(table->type)->to_float)) {
        return;
    }
    auto s = std::make_shared<source>();
    s->mapped = data;
    s->offset = int64_t(data - file->base());
    s->row_bytes = table->nb[1];
    s->row = table->ne[0];
    s->n_rows = table->ne[1];
    s->type = table->type;
    s->file = std::move(file);
    source_ = std::move(s);
}

ggml_tensor * table_rows::get(ggml_context * ctx, ggml_tensor * ids) const {
    GGML_ASSERT(ids->type == GGML_TYPE_I32 && ggml_n_dims(ids) == 1);
    if (!source_ || standard_ops_only()) {
        return ggml_get_rows(ctx, table_, ids);
    }
    ggml_tensor * args[] = { ids };
    // one task: a lookup is a few rows, not worth waking the other threads for
    return ggml_custom_4d(ctx, GGML_TYPE_F32, table_->ne[0], ids->ne[0], 1, 1, args, 1, read_rows_op, 1,
                          const_cast<source *>(source_.get()));
}

} // namespace qt
