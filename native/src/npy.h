// Minimal .npy (format 1.0) writer for stage dumps.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qt {

// Writes a C-order array; `shape` is in numpy order (slowest axis first). Throws qt::error.
void npy_write(const std::string & path, const float * data, const std::vector<int64_t> & shape);
void npy_write(const std::string & path, const int32_t * data, const std::vector<int64_t> & shape);

} // namespace qt
