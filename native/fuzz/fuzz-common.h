// Shared by the fuzz targets: the model they run on and an in-memory file for generated inputs.
#pragma once

#include "qwen3-tts.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <sys/mman.h>
#include <unistd.h>

namespace fuzz {

// $VOCABLE_FUZZ_MODEL: a converted tiny model (tools/fuzz.sh converts the test fixture).
inline const char * model_path() {
    const char * path = std::getenv("VOCABLE_FUZZ_MODEL");
    if (!path || !*path) {
        fprintf(stderr, "set VOCABLE_FUZZ_MODEL to a converted model (tools/fuzz.sh does)\n");
        std::exit(2);
    }
    return path;
}

inline void quiet_log(qt_log_level, const char *, void *) {}

// The model, loaded once per process, with one thread and no dumps.
inline qt_context * shared_context() {
    static qt_context * ctx = [] {
        qt_init_params p = qt_init_default_params();
        p.model_path = model_path();
        p.n_threads = 1;
        p.share_cores = 0;
        p.log_callback = quiet_log;
        qt_context * c = qt_init(&p);
        if (!c) {
            fprintf(stderr, "cannot load %s: %s\n", p.model_path, qt_last_error());
            std::exit(2);
        }
        return c;
    }();
    return ctx;
}

// A file in memory, rewritten for every input: its path is /proc/self/fd/N.
class memory_file {
public:
    memory_file() : fd_(memfd_create("vocable-fuzz", 0)), path_("/proc/self/fd/" + std::to_string(fd_)) {}
    ~memory_file() { close(fd_); }

    const char * write_all(const void * a, size_t na, const void * b = nullptr, size_t nb = 0) {
        if (ftruncate(fd_, 0) != 0 || lseek(fd_, 0, SEEK_SET) != 0 || !put(a, na) || !put(b, nb)) {
            perror("memory_file");
            std::abort();
        }
        return path_.c_str();
    }

private:
    bool put(const void * data, size_t n) {
        const auto * p = static_cast<const uint8_t *>(data);
        while (n > 0) {
            const ssize_t w = ::write(fd_, p, n);
            if (w <= 0) {
                return false;
            }
            p += w;
            n -= size_t(w);
        }
        return true;
    }

    int         fd_;
    std::string path_;
};

// Reads consecutive values of the fuzz input; zeros past its end.
class input_reader {
public:
    input_reader(const uint8_t * data, size_t size) : data_(data), size_(size) {}

    template <class T> T take() {
        T v{};
        uint8_t * out = reinterpret_cast<uint8_t *>(&v);
        for (size_t i = 0; i < sizeof(T) && pos_ < size_; ++i) {
            out[i] = data_[pos_++];
        }
        return v;
    }
    size_t left() const { return size_ - pos_; }

private:
    const uint8_t * data_;
    size_t          size_;
    size_t          pos_ = 0;
};

} // namespace fuzz
