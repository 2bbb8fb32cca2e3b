#include "model-loader.h"

#include "gguf-names.h"
#include "log.h"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#if !defined(_WIN32)
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace qt {

namespace {

struct file_closer {
    void operator()(FILE * f) const { fclose(f); }
};

// Positions past 2 GiB (a 1.7B model's file): `long`, fseek's offset, has 32 bits on Windows.
int seek_to(FILE * f, uint64_t offset) {
#if defined(_WIN32)
    return _fseeki64(f, int64_t(offset), SEEK_SET);
#else
    return fseeko(f, off_t(offset), SEEK_SET);
#endif
}

uint64_t size_of(FILE * f) {
#if defined(_WIN32)
    return _fseeki64(f, 0, SEEK_END) == 0 ? uint64_t(_ftelli64(f)) : 0;
#else
    return fseeko(f, 0, SEEK_END) == 0 ? uint64_t(ftello(f)) : 0;
#endif
}

std::string dims_to_string(const int64_t * ne, int n) {
    std::string s = "[";
    for (int i = 0; i < n; ++i) {
        s += (i ? ", " : "") + std::to_string(ne[i]);
    }
    return s + "]";
}

} // namespace

uint64_t tensor_checksum_update(uint64_t sum, uint64_t first_word, const void * data, size_t n_bytes) {
    const auto * bytes = static_cast<const uint8_t *>(data);
    const size_t n_words = n_bytes / 8;
    for (size_t i = 0; i < n_words; ++i) {
        uint64_t w;
        memcpy(&w, bytes + 8 * i, 8);
        sum += w * (2 * (first_word + i) + 1);
    }
    if (n_bytes % 8) {
        uint64_t w = 0;
        memcpy(&w, bytes + 8 * n_words, n_bytes % 8);
        sum += w * (2 * (first_word + n_words) + 1);
    }
    return sum;
}

uint64_t tensor_checksum(const void * data, size_t n_bytes) { return tensor_checksum_update(0, 0, data, n_bytes); }

model_loader::model_loader(const std::string & path, ggml_backend_t backend)
    : path_(path), on_cpu_(ggml_backend_dev_type(ggml_backend_get_device(backend)) == GGML_BACKEND_DEVICE_TYPE_CPU) {
    std::unique_ptr<FILE, file_closer> file(fopen(path.c_str(), "rb"));
    if (!file) {
        throw error(QT_STATUS_INVALID_PARAMS, format("model file not found or unreadable: %s", path.c_str()));
    }
    char magic[4] = {};
    if (fread(magic, 1, 4, file.get()) != 4 || memcmp(magic, "GGUF", 4) != 0) {
        throw error(QT_STATUS_INVALID_PARAMS,
                    format("%s is not a GGUF model file (convert a Hugging Face model folder with `vocable convert`)",
                           path.c_str()));
    }
    const uint64_t file_size = size_of(file.get());
    rewind(file.get());

    ggml_context * meta = nullptr;
    gguf_init_params gp = { /*.no_alloc =*/ true, /*.ctx =*/ &meta };
    gguf_.reset(gguf_init_from_file_ptr(file.get(), gp));
    if (!gguf_) {
        throw error(QT_STATUS_INVALID_PARAMS,
                    format("%s is truncated or corrupt: its GGUF header cannot be read", path.c_str()));
    }
    meta_.reset(meta);

    if (get_str(QT_KEY_ARCH) != QT_ARCH) {
        throw error(QT_STATUS_INVALID_PARAMS, format("%s is a '%s' model, not a Qwen3-TTS model", path.c_str(),
                                                     get_str(QT_KEY_ARCH).c_str()));
    }
    const uint32_t version = get_u32(QT_KEY_FORMAT_VERSION);
    if (version != QT_FORMAT_VERSION) {
        throw error(QT_STATUS_INVALID_PARAMS,
                    format("%s has model format version %u; this engine reads version %d (convert the model again)",
                           path.c_str(), version, QT_FORMAT_VERSION));
    }
    if (get_str(QT_KEY_MODEL_TYPE) != "base") {
        throw error(QT_STATUS_INVALID_PARAMS, format("%s is a '%s' model; only 12 Hz Base models clone voices",
                                                     path.c_str(), get_str(QT_KEY_MODEL_TYPE).c_str()));
    }

    const int64_t n_tensors = gguf_get_n_tensors(gguf_.get());
    const size_t  data_offset = gguf_get_data_offset(gguf_.get());
    uint64_t      data_end = data_offset;
    for (int64_t i = 0; i < n_tensors; ++i) {
        const uint64_t end = data_offset + gguf_get_tensor_offset(gguf_.get(), i) + gguf_get_tensor_size(gguf_.get(), i);
        data_end = end > data_end ? end : data_end;
    }
    if (data_end > file_size) {
        throw error(QT_STATUS_INVALID_PARAMS,
                    format("%s is truncated: %" PRIu64 " bytes, but its tensors need %" PRIu64
                           " (download or convert it again)",
                           path.c_str(), file_size, data_end));
    }

    // The converter writes one checksum per tensor into a last tensor, as int32 pairs.
    const int64_t checksum_id = gguf_find_tensor(gguf_.get(), QT_TENSOR_CHECKSUMS);
    if (n_tensors < 2 || checksum_id != n_tensors - 1 || gguf_get_tensor_type(gguf_.get(), checksum_id) != GGML_TYPE_I32 ||
        gguf_get_tensor_size(gguf_.get(), checksum_id) != size_t(8 * (n_tensors - 1))) {
        throw error(QT_STATUS_INVALID_PARAMS, format("%s is corrupt: its tensor checksum table is malformed", path.c_str()));
    }
    std::vector<uint64_t> checksums(size_t(n_tensors - 1));
    if (seek_to(file.get(), data_offset + gguf_get_tensor_offset(gguf_.get(), checksum_id)) != 0 ||
        fread(checksums.data(), 8, checksums.size(), file.get()) != checksums.size()) {
        throw error(QT_STATUS_INVALID_PARAMS, format("%s is truncated: its checksum table cannot be read", path.c_str()));
    }

    for (int64_t i = 0; i + 1 < n_tensors; ++i) {
        const char * name = gguf_get_tensor_name(gguf_.get(), i);
        check_tensor_type(name, ggml_get_tensor(meta_.get(), name));
    }

    // Every tensor is checked against its checksum by streaming the file through a small block,
    // then the weights are mapped rather than read: the process holds only the pages its graphs
    // touch (the synthesis never reads the speaker and codec encoders or most rows of the text
    // embedding), and the page cache shares them between engines and runs.
    std::vector<uint8_t> block(k_read_block);
    for (int64_t i = 0; i + 1 < n_tensors; ++i) {
        const char * name = gguf_get_tensor_name(gguf_.get(), i);
        const size_t nbytes = gguf_get_tensor_size(gguf_.get(), i);
        if (seek_to(file.get(), data_offset + gguf_get_tensor_offset(gguf_.get(), i)) != 0) {
            throw error(QT_STATUS_INVALID_PARAMS, format("%s is truncated: tensor '%s' cannot be read", path.c_str(), name));
        }
        uint64_t sum = 0;
        for (size_t done = 0; done < nbytes;) {
            const size_t n = std::min(nbytes - done, block.size());  // a multiple of 8 but for the last
            if (fread(block.data(), 1, n, file.get()) != n) {
                throw error(QT_STATUS_INVALID_PARAMS,
                            format("%s is truncated: tensor '%s' cannot be read", path.c_str(), name));
            }
            sum = tensor_checksum_update(sum, done / 8, block.data(), n);
            done += n;
        }
        if (sum != checksums[size_t(i)]) {
            throw error(QT_STATUS_INVALID_PARAMS,
                        format("%s is corrupt: tensor '%s' does not match its checksum (download or convert it again)",
                               path.c_str(), name));
        }
    }
    block = {};

    if (!map_weights(file.get(), file_size, data_offset, data_end, backend)) {
        read_weights(file.get(), data_offset, backend);
    }
    for (int64_t i = 0; i + 1 < n_tensors; ++i) {
        const char * name = gguf_get_tensor_name(gguf_.get(), i);
        tensors_[name] = ggml_get_tensor(meta_.get(), name);
        weight_bytes_ += gguf_get_tensor_size(gguf_.get(), i);
    }
}

bool model_loader::map_weights(FILE * file, uint64_t file_size, size_t data_offset, uint64_t data_end,
                               ggml_backend_t backend) {
#if defined(_WIN32)
    (void) file, (void) file_size, (void) data_offset, (void) data_end, (void) backend;
    return false;
#else
    if (!ggml_backend_buft_is_host(ggml_backend_get_default_buffer_type(backend)) || data_end <= data_offset) {
        return false;
    }
    // For a model on a network share that may change under the engine (a mapped file that
    // shrinks faults the process), or to compare: VOCABLE_NO_MMAP=1 reads the weights instead.
    const char * no_mmap = std::getenv("VOCABLE_NO_MMAP");
    if (no_mmap && *no_mmap && strcmp(no_mmap, "0") != 0) {
        QT_LOG_INFO("%s: VOCABLE_NO_MMAP is set: weights read into memory", path_.c_str());
        return false;
    }
    // ggml needs its tensors aligned; the converter aligns them, a foreign file might not
    const int64_t n_tensors = gguf_get_n_tensors(gguf_.get());
    bool aligned = data_offset % k_tensor_alignment == 0;
    for (int64_t i = 0; i < n_tensors; ++i) {
        aligned = aligned && gguf_get_tensor_offset(gguf_.get(), i) % k_tensor_alignment == 0;
    }
    if (!aligned) {
        QT_LOG_INFO("%s: tensors not aligned to %zu bytes: weights read into memory", path_.c_str(), k_tensor_alignment);
        return false;
    }
    void * base = mmap(nullptr, size_t(file_size), PROT_READ, MAP_PRIVATE, fileno(file), 0);
    if (base == MAP_FAILED) {
        QT_LOG_INFO("%s: cannot map the file (%s): weights read into memory", path_.c_str(), strerror(errno));
        return false;
    }
    // a descriptor of its own for the tables' rows (table-rows.h); without one they are read
    // through the mapping
    mapping_ = std::make_shared<mapped_model_file>(base, size_t(file_size), fcntl(fileno(file), F_DUPFD_CLOEXEC, 0));
    auto * data = static_cast<uint8_t *>(base) + data_offset;
    buffer_.reset(ggml_backend_cpu_buffer_from_ptr(data, size_t(data_end - data_offset)));
    if (!buffer_) {
        mapping_.reset();
        return false;
    }
    ggml_backend_buffer_set_usage(buffer_.get(), GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    // The vectors (norms, biases, scales: 0.75 MiB in 375 of a 0.6B model's 875 tensors) are
    // read into memory of their own. Read through the mapping, every one of them brought the
    // pages around it in (a fault maps more than its own page), among them pages of the
    // matrices beside it that the engine had given back after rearranging them: measured on
    // Linux 6.18, a q8_0 synthesis made 44 MiB of the talker's released rows and 10 MiB of the
    // decoder's resident again.
    std::vector<ggml_tensor *> tensors(static_cast<size_t>(n_tensors));
    size_t                     vector_bytes = 0;
    for (int64_t i = 0; i < n_tensors; ++i) {
        ggml_tensor * t = ggml_get_tensor(meta_.get(), gguf_get_tensor_name(gguf_.get(), i));
        tensors[size_t(i)] = t;
        if (ggml_n_dims(t) == 1) {
            vector_bytes += GGML_PAD(gguf_get_tensor_size(gguf_.get(), i), k_tensor_alignment);
        }
    }
    ggml_backend_buffer_t vectors = nullptr;
    if (vector_bytes > 0) {
        vectors = ggml_backend_buft_alloc_buffer(ggml_backend_cpu_buffer_type(), vector_bytes);
        if (!vectors) {
            throw error(QT_STATUS_OUT_OF_MEMORY, format("not enough memory for the vectors of %s", path_.c_str()));
        }
        mapping_->keep(vectors);
        ggml_backend_buffer_set_usage(vectors, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    }
    size_t at = 0;
    for (int64_t i = 0; i < n_tensors; ++i) {
        ggml_tensor * t = tensors[size_t(i)];
        const bool    vector = ggml_n_dims(t) == 1;
        const size_t  offset = gguf_get_tensor_offset(gguf_.get(), i);
        const size_t  n_bytes = gguf_get_tensor_size(gguf_.get(), i);
        auto *        where = vector ? static_cast<uint8_t *>(ggml_backend_buffer_get_base(vectors)) + at : data + offset;
        if (ggml_backend_tensor_alloc(vector ? vectors : buffer_.get(), t, where) != GGML_STATUS_SUCCESS) {
            throw error(QT_STATUS_FAILED, format("%s: cannot place tensor '%s'", path_.c_str(), t->name));
        }
        if (vector) {
            if (seek_to(file, data_offset + offset) != 0 || fread(where, 1, n_bytes, file) != n_bytes) {
                throw error(QT_STATUS_FAILED, format("%s: cannot read tensor '%s' (%s)", path_.c_str(), t->name,
                                                     ferror(file) ? strerror(errno) : "the file ends before it"));
            }
            at += GGML_PAD(n_bytes, k_tensor_alignment);
        }
    }
    return true;
#endif
}

void model_loader::read_weights(FILE * file, size_t data_offset, ggml_backend_t backend) {
    buffer_.reset(ggml_backend_alloc_ctx_tensors(meta_.get(), backend));
    if (!buffer_) {
        throw error(QT_STATUS_OUT_OF_MEMORY, format("not enough memory for the weights of %s", path_.c_str()));
    }
    ggml_backend_buffer_set_usage(buffer_.get(), GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    const bool           host = ggml_backend_buffer_is_host(buffer_.get());
    std::vector<uint8_t> staging;
    for (int64_t i = 0; i < gguf_get_n_tensors(gguf_.get()); ++i) {
        ggml_tensor * t = ggml_get_tensor(meta_.get(), gguf_get_tensor_name(gguf_.get(), i));
        const size_t  nbytes = ggml_nbytes(t);
        void *        dst = t->data;
        if (!host) {
            staging.resize(nbytes);
            dst = staging.data();
        }
        // the checksums were verified from this same open file a moment ago
        if (seek_to(file, data_offset + gguf_get_tensor_offset(gguf_.get(), i)) != 0 ||
            fread(dst, 1, nbytes, file) != nbytes) {
            throw error(QT_STATUS_INVALID_PARAMS, format("%s is truncated: tensor '%s' cannot be read", path_.c_str(),
                                                         t->name));
        }
        if (!host) {
            ggml_backend_tensor_set(t, dst, 0, nbytes);
        }
    }
}

// The types the converter writes (app/vocable/engine/convert.py, _choose_type): vectors, codebooks and
// the speaker and codec encoders stay f32; the codec decoder is f32 or f16; the talker and the
// code predictor may be quantised. A tensor of any other type (an integer or f64 matrix, a
// quantised norm) would crash or mislead the graph ops, so it is refused here.
void model_loader::check_tensor_type(const char * name, const ggml_tensor * t) const {
    const std::string n(name);
    const bool        f32_only = ggml_n_dims(t) < 2 || n.rfind("spk.", 0) == 0 || n.rfind("cenc.", 0) == 0 ||
                          n.find(".codebook.") != std::string::npos;
    const bool        decoder = n.rfind("cdec.", 0) == 0;
    const ggml_type   type = t->type;
    const bool        ok = type == GGML_TYPE_F32 ||
                    (!f32_only && (type == GGML_TYPE_F16 || (!decoder && (type == GGML_TYPE_Q8_0 || type == GGML_TYPE_Q4_K))));
    if (!ok) {
        throw error(QT_STATUS_INVALID_PARAMS,
                    format("%s is corrupt: tensor '%s' has type %s, which this tensor cannot have (allowed: %s)",
                           path_.c_str(), name, ggml_type_name(type),
                           f32_only ? "f32" : decoder ? "f32, f16" : "f32, f16, q8_0, q4_K"));
    }
}

int64_t model_loader::key_id(const char * key, enum gguf_type type) const {
    const int64_t id = gguf_find_key(gguf_.get(), key);
    if (id < 0) {
        throw error(QT_STATUS_INVALID_PARAMS, format("%s lacks the metadata key '%s' (convert the model again)",
                                                     path_.c_str(), key));
    }
    if (gguf_get_kv_type(gguf_.get(), id) != type) {
        throw error(QT_STATUS_INVALID_PARAMS,
                    format("%s is corrupt: metadata key '%s' has type %s, expected %s", path_.c_str(), key,
                           gguf_type_name(gguf_get_kv_type(gguf_.get(), id)), gguf_type_name(type)));
    }
    return id;
}

uint32_t model_loader::get_u32(const char * key) const {
    const uint32_t v = gguf_get_val_u32(gguf_.get(), key_id(key, GGUF_TYPE_UINT32));
    if (v > k_max_u32_value) {
        throw error(QT_STATUS_INVALID_PARAMS, format("%s is corrupt: metadata key '%s' is %u, over the limit of %u",
                                                     path_.c_str(), key, v, k_max_u32_value));
    }
    return v;
}

int model_loader::get_size(const char * key) const {
    const uint32_t v = get_u32(key);
    if (v == 0) {
        throw error(QT_STATUS_INVALID_PARAMS, format("%s is corrupt: metadata key '%s' is 0", path_.c_str(), key));
    }
    return int(v);
}

float model_loader::get_f32(const char * key) const {
    const float v = gguf_get_val_f32(gguf_.get(), key_id(key, GGUF_TYPE_FLOAT32));
    if (!std::isfinite(v)) {
        throw error(QT_STATUS_INVALID_PARAMS,
                    format("%s is corrupt: metadata key '%s' is not a finite number", path_.c_str(), key));
    }
    return v;
}

std::string model_loader::get_str(const char * key) const {
    return gguf_get_val_str(gguf_.get(), key_id(key, GGUF_TYPE_STRING));
}

std::vector<int32_t> model_loader::get_i32_array(const char * key) const {
    const int64_t id = key_id(key, GGUF_TYPE_ARRAY);
    if (gguf_get_arr_type(gguf_.get(), id) != GGUF_TYPE_INT32) {
        throw error(QT_STATUS_INVALID_PARAMS,
                    format("%s is corrupt: metadata key '%s' is not an int32 array", path_.c_str(), key));
    }
    const size_t n = gguf_get_arr_n(gguf_.get(), id);
    if (n == 0 || n > k_max_array_size) {
        throw error(QT_STATUS_INVALID_PARAMS, format("%s is corrupt: metadata key '%s' has %zu values", path_.c_str(), key, n));
    }
    const auto * data = static_cast<const int32_t *>(gguf_get_arr_data(gguf_.get(), id));
    for (size_t i = 0; i < n; ++i) {
        if (data[i] < 0 || uint32_t(data[i]) > k_max_u32_value) {
            throw error(QT_STATUS_INVALID_PARAMS, format("%s is corrupt: metadata key '%s' has the value %d",
                                                         path_.c_str(), key, data[i]));
        }
    }
    return std::vector<int32_t>(data, data + n);
}

std::vector<std::string> model_loader::get_str_array(const char * key) const {
    const int64_t id = key_id(key, GGUF_TYPE_ARRAY);
    if (gguf_get_arr_type(gguf_.get(), id) != GGUF_TYPE_STRING) {
        throw error(QT_STATUS_INVALID_PARAMS,
                    format("%s is corrupt: metadata key '%s' is not a string array", path_.c_str(), key));
    }
    std::vector<std::string> out;
    for (size_t i = 0; i < gguf_get_arr_n(gguf_.get(), id); ++i) {
        out.emplace_back(gguf_get_arr_str(gguf_.get(), id, i));
    }
    return out;
}

bool model_loader::has_tensor(const std::string & name) const { return tensors_.count(name) != 0; }

bool model_loader::maps(const ggml_tensor * t) const { return mapping_ && t->buffer == buffer_.get(); }

void model_loader::release(const ggml_tensor * t) const {
    if (maps(t)) {
        release_pages(t);
    }
}

void model_loader::release_pages(const ggml_tensor * t) {
#if !defined(_WIN32)
    const auto      page = uintptr_t(sysconf(_SC_PAGESIZE));
    const uintptr_t begin = (uintptr_t(t->data) + page - 1) / page * page;
    const uintptr_t end = (uintptr_t(t->data) + ggml_nbytes(t)) / page * page;
    if (end > begin) {
        madvise(reinterpret_cast<void *>(begin), end - begin, MADV_DONTNEED);
    }
#else
    (void) t;
#endif
}

table_rows model_loader::require_table(const std::string & name, std::initializer_list<int64_t> ne) {
    ggml_tensor * t = require(name, ne);
    return table_rows(t, maps(t) ? mapping_ : nullptr);
}

ggml_tensor * model_loader::require(const std::string & name) {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) {
        throw error(QT_STATUS_INVALID_PARAMS, format("%s lacks the tensor '%s' (convert the model again)",
                                                     path_.c_str(), name.c_str()));
    }
    return it->second;
}

ggml_tensor * model_loader::require(const std::string & name, std::initializer_list<int64_t> ne) {
    ggml_tensor * t = require(name);
    int64_t want[GGML_MAX_DIMS] = { 1, 1, 1, 1 };
    int     i = 0;
    for (int64_t d : ne) {
        want[i++] = d;
    }
    if (memcmp(want, t->ne, sizeof(want)) != 0) {
        throw error(QT_STATUS_INVALID_PARAMS,
                    format("%s: tensor '%s' has shape %s, expected %s", path_.c_str(), name.c_str(),
                           dims_to_string(t->ne, GGML_MAX_DIMS).c_str(), dims_to_string(want, GGML_MAX_DIMS).c_str()));
    }
    return t;
}

} // namespace qt
