#include "npy.h"

#include "log.h"

#include <cstdio>
#include <memory>

namespace qt {

namespace {

void write_npy(const std::string & path, const char * descr, const void * data, size_t elem_size,
               const std::vector<int64_t> & shape) {
    std::string dims;
    size_t count = 1;
    for (int64_t d : shape) {
        dims += std::to_string(d) + ",";
        count *= size_t(d);
    }
    if (shape.size() > 1) {
        dims.pop_back();  // numpy writes "(3,)" for 1-D and "(3, 4)" otherwise
    }
    std::string header = "{'descr': '" + std::string(descr) + "', 'fortran_order': False, 'shape': (" + dims + "), }";
    // magic (6) + version (2) + header length (2) + header + '\n' is padded to a multiple of 64
    const size_t unpadded = 10 + header.size() + 1;
    header.append((64 - unpadded % 64) % 64, ' ');
    header.push_back('\n');

    std::unique_ptr<FILE, int (*)(FILE *)> f(fopen(path.c_str(), "wb"), fclose);
    if (!f) {
        throw error(QT_STATUS_FAILED, format("cannot write dump file %s", path.c_str()));
    }
    const unsigned char preamble[8] = { 0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0 };
    const uint16_t header_len = uint16_t(header.size());
    const unsigned char len_le[2] = { uint8_t(header_len & 0xff), uint8_t(header_len >> 8) };
    bool ok = fwrite(preamble, 1, 8, f.get()) == 8 && fwrite(len_le, 1, 2, f.get()) == 2 &&
              fwrite(header.data(), 1, header.size(), f.get()) == header.size() &&
              fwrite(data, elem_size, count, f.get()) == count;
    if (!ok) {
        throw error(QT_STATUS_FAILED, format("short write to dump file %s", path.c_str()));
    }
}

} // namespace

void npy_write(const std::string & path, const float * data, const std::vector<int64_t> & shape) {
    write_npy(path, "<f4", data, sizeof(float), shape);
}

void npy_write(const std::string & path, const int32_t * data, const std::vector<int64_t> & shape) {
    write_npy(path, "<i4", data, sizeof(int32_t), shape);
}

} // namespace qt
