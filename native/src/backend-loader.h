// ggml's CPU backend, loaded at run time: the engine's build ships the CPU backend as several
// variants (libggml-cpu-<name>.so: x64, haswell, skylakex, icelake, zen4, sapphirerapids, ...;
// cmake/ggml.cmake), and the best one this processor can run is loaded once per process.
// VOCABLE_CPU_VARIANT=<name> forces a lower (or any supported) variant, so one machine can
// measure several.
#pragma once

#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <string>
#include <vector>

namespace qt {

struct cpu_backend_info {
    std::string              variant;    // "zen4"; "built in" when ggml has no loadable variants
    std::string              features;   // what the variant uses: "AVX2 FMA F16C AVX512 ..."
    std::vector<std::string> available;  // every variant found, best first, with "(not on this CPU)"
    ggml_backend_dev_t       device = nullptr;
    // The loaded variant's ggml_get_type_traits_cpu (each variant has its own kernels); null
    // where it cannot be found, and then nothing may assume ggml's per-type kernels.
    const ggml_type_traits_cpu * (*type_traits)(ggml_type) = nullptr;

    // Whether `features` lists `name` as a word ("AVX512" is not "AVX512_VNNI").
    bool has_feature(const char * name) const;
    // "zen4 (SSE3 ... AVX512 ...); kernels: avx512; variants: zen4, icelake, ..., x64"
    // (qt_system_info()), with the kernels of cpu-ops.h that run beside it.
    std::string describe(const char * kernels) const;
};

// Loads the CPU backend on the first call (thread-safe) and returns what was loaded. Throws
// qt::error (QT_STATUS_FAILED) when no variant can be loaded or the forced one cannot run here.
const cpu_backend_info & cpu_backend_loaded();

// A device ggml can compute on: the CPU, or one of a device backend's (Vulkan; CUDA and Metal
// where built).
struct device_info {
    std::string        id;           // "cpu", "vulkan:0": the backend's name and the device's index in it
    std::string        description;  // "AMD EPYC 7B13", "llvmpipe (LLVM 15.0.6, 256 bits)"
    std::string        kind;         // "cpu", "gpu", "igpu" (integrated) or "accel"
    size_t             memory_total = 0;  // bytes, as the backend reports them
    size_t             memory_free = 0;
    ggml_backend_dev_t device = nullptr;
};

struct devices_found {
    std::vector<device_info> devices;  // the CPU first
    // Why a device backend beside ggml gave no device, one line each: it could not be loaded
    // (no Vulkan loader on this machine, say) or it found no device.
    std::vector<std::string> notes;
};

// Loads the CPU backend and every device backend module beside ggml (libggml-vulkan.so, ...)
// once, and lists the devices with their free memory as of this call. A backend that cannot
// load is a note, never an error: the CPU is always there. Throws only what
// cpu_backend_loaded() throws.
devices_found devices_loaded();

} // namespace qt
