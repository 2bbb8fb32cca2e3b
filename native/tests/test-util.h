// Helpers shared by the C++ tests: reading the fixtures' .npy files and comparing vectors.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace test {

struct npy_array {
    std::vector<int64_t> shape;
    std::vector<float>   f32;  // float arrays
    std::vector<int32_t> i32;  // int arrays
    int64_t rows() const { return shape.empty() ? 1 : shape[0]; }
    int64_t cols() const { return shape.size() < 2 ? 1 : shape[1]; }
};

// Reads a C-order little-endian float32 or int32 array (format 1.0 or 2.0).
inline npy_array npy_read(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) {
        throw std::runtime_error("cannot open " + path);
    }
    char magic[8];
    f.read(magic, 8);
    if (!f || memcmp(magic, "\x93NUMPY", 6) != 0) {
        throw std::runtime_error(path + " is not a .npy file");
    }
    uint32_t header_len = 0;
    if (magic[6] == 1) {
        uint16_t n = 0;
        f.read(reinterpret_cast<char *>(&n), 2);
        header_len = n;
    } else {
        f.read(reinterpret_cast<char *>(&header_len), 4);
    }
    std::string header(header_len, '\0');
    f.read(&header[0], header_len);
    auto field = [&](const char * key) {
        const size_t at = header.find(key);
        if (at == std::string::npos) {
            throw std::runtime_error(path + ": header lacks " + key);
        }
        return at + strlen(key);
    };
    size_t d = header.find('\'', field("'descr':"));
    const std::string descr = header.substr(d + 1, header.find('\'', d + 1) - d - 1);
    if (header.find("True", field("'fortran_order':")) < header.find(',', field("'fortran_order':"))) {
        throw std::runtime_error(path + ": Fortran order");
    }
    npy_array a;
    size_t s = header.find('(', field("'shape':")) + 1;
    const size_t e = header.find(')', s);
    while (s < e) {
        char * end = nullptr;
        const long long v = strtoll(header.c_str() + s, &end, 10);
        if (end == header.c_str() + s) {
            break;
        }
        a.shape.push_back(v);
        s = size_t(end - header.c_str());
        while (s < e && (header[s] == ',' || header[s] == ' ')) {
            ++s;
        }
    }
    int64_t n = 1;
    for (int64_t v : a.shape) {
        n *= v;
    }
    if (descr == "<f4") {
        a.f32.resize(size_t(n));
        f.read(reinterpret_cast<char *>(a.f32.data()), std::streamsize(n * 4));
    } else if (descr == "<i4") {
        a.i32.resize(size_t(n));
        f.read(reinterpret_cast<char *>(a.i32.data()), std::streamsize(n * 4));
    } else {
        throw std::runtime_error(path + ": unsupported dtype " + descr);
    }
    if (!f) {
        throw std::runtime_error(path + ": truncated");
    }
    return a;
}

inline double cosine(const float * a, const float * b, size_t n) {
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < n; ++i) {
        ab += double(a[i]) * b[i];
        aa += double(a[i]) * a[i];
        bb += double(b[i]) * b[i];
    }
    return ab / (std::sqrt(aa) * std::sqrt(bb) + 1e-300);
}

inline double cosine(const std::vector<float> & a, const std::vector<float> & b) {
    return a.size() == b.size() ? cosine(a.data(), b.data(), a.size()) : -2.0;
}

inline double max_abs_diff(const std::vector<float> & a, const std::vector<float> & b) {
    if (a.size() != b.size()) {
        return INFINITY;
    }
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        m = std::max(m, double(std::fabs(a[i] - b[i])));
    }
    return m;
}

// Row `r` of a 2-D float array.
inline std::vector<float> row(const npy_array & a, int64_t r) {
    const int64_t c = a.cols();
    return std::vector<float>(a.f32.begin() + r * c, a.f32.begin() + (r + 1) * c);
}

// A fresh directory under /tmp for stage dumps, and its removal.
inline std::string make_temp_dir() {
    char tmpl[] = "/tmp/qt-test-XXXXXX";
    const char * d = mkdtemp(tmpl);
    if (!d) {
        throw std::runtime_error("mkdtemp failed");
    }
    return d;
}

inline void remove_dir(const std::string & dir) {
    const std::string cmd = "rm -rf '" + dir + "'";
    if (system(cmd.c_str()) != 0) {
        fprintf(stderr, "warning: could not remove %s\n", dir.c_str());
    }
}

} // namespace test
