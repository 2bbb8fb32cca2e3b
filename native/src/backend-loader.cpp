#include "backend-loader.h"

#include "log.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <sstream>
#include <string_view>

#if defined(_WIN32)
#    include <windows.h>
#else
#    include <dlfcn.h>
#endif

namespace fs = std::filesystem;

namespace qt {
namespace {

#if defined(_WIN32)
constexpr std::string_view k_prefix = "ggml-cpu-";
constexpr std::string_view k_suffix = ".dll";
#else
constexpr std::string_view k_prefix = "libggml-cpu-";
constexpr std::string_view k_suffix = ".so";
#endif

std::string joined(const std::vector<std::string> & items) {
    std::string out;
    for (const std::string & item : items) {
        out += (out.empty() ? "" : ", ") + item;
    }
    return out.empty() ? "none" : out;
}

// The folder of the shared object that holds `symbol` (empty where it cannot be told).
fs::path folder_of(const void * symbol) {
#if defined(_WIN32)
    HMODULE module = nullptr;
    wchar_t path[MAX_PATH];
    if (GetModuleHandleExW(GET_MODULE_HANDLE_EX_FLAG_FROM_ADDRESS | GET_MODULE_HANDLE_EX_FLAG_UNCHANGED_REFCOUNT,
                           static_cast<LPCWSTR>(symbol), &module) &&
        GetModuleFileNameW(module, path, MAX_PATH)) {
        return fs::path(path).parent_path();
    }
    return {};
#else
    Dl_info info{};
    if (dladdr(symbol, &info) && info.dli_fname) {
        std::error_code ec;
        const fs::path p = fs::canonical(info.dli_fname, ec);
        return ec ? fs::path(info.dli_fname).parent_path() : p.parent_path();
    }
    return {};
#endif
}

// ggml_backend_score() of a variant: 0 when this processor lacks what it was built for, -1 when
// it cannot be opened.
int variant_score(const fs::path & path) {
#if defined(_WIN32)
    HMODULE lib = LoadLibraryW(path.wstring().c_str());
    if (!lib) {
        return -1;
    }
    auto score = reinterpret_cast<int (*)()>(GetProcAddress(lib, "ggml_backend_score"));
    const int s = score ? score() : -1;
    FreeLibrary(lib);
    return s;
#else
    void * lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        return -1;
    }
    auto score = reinterpret_cast<int (*)()>(dlsym(lib, "ggml_backend_score"));
    const int s = score ? score() : -1;
    dlclose(lib);
    return s;
#endif
}

struct variant {
    std::string name;
    fs::path    path;
    int         score = 0;
};

// The variants next to ggml (a wheel, a build tree) or in lib/ beside the engine (a bundle,
// where the loader may have found ggml elsewhere first), best first.
std::vector<variant> find_variants() {
    std::vector<variant> found;
    for (const fs::path & dir : { folder_of(reinterpret_cast<const void *>(&ggml_backend_load)),
                                  folder_of(reinterpret_cast<const void *>(&cpu_backend_loaded)) / "lib" }) {
        std::error_code ec;
        for (const auto & entry : fs::directory_iterator(dir, ec)) {
            const std::string  file = entry.path().filename().string();
            const std::string_view f = file;
            if (f.size() <= k_prefix.size() + k_suffix.size() || f.substr(0, k_prefix.size()) != k_prefix ||
                f.substr(f.size() - k_suffix.size()) != k_suffix) {
                continue;
            }
            const std::string name(f.substr(k_prefix.size(), f.size() - k_prefix.size() - k_suffix.size()));
            if (std::none_of(found.begin(), found.end(), [&](const variant & v) { return v.name == name; })) {
                found.push_back({ name, entry.path(), variant_score(entry.path()) });
            }
        }
    }
    std::stable_sort(found.begin(), found.end(), [](const variant & a, const variant & b) { return a.score > b.score; });
    return found;
}

std::string features_of(ggml_backend_reg_t reg) {
    auto get = reinterpret_cast<ggml_backend_get_features_t>(ggml_backend_reg_get_proc_address(reg, "ggml_backend_get_features"));
    std::string out;
    for (const ggml_backend_feature * f = get ? get(reg) : nullptr; f && f->name; ++f) {
        if (std::string(f->value) == "1") {
            out += (out.empty() ? "" : " ") + std::string(f->name);
        }
    }
    return out;
}

using type_traits_fn = const ggml_type_traits_cpu * (*)(ggml_type);

// ggml_get_type_traits_cpu of the loaded variant (already open: this only finds it), or of the
// CPU backend linked in when there are no variants.
type_traits_fn type_traits_of(const fs::path * variant_path) {
#if defined(_WIN32)
    HMODULE lib = variant_path ? GetModuleHandleW(variant_path->wstring().c_str()) : GetModuleHandleW(nullptr);
    return lib ? reinterpret_cast<type_traits_fn>(GetProcAddress(lib, "ggml_get_type_traits_cpu")) : nullptr;
#else
    void * lib = variant_path ? dlopen(variant_path->c_str(), RTLD_NOW | RTLD_NOLOAD) : RTLD_DEFAULT;
    if (!lib) {
        return nullptr;
    }
    auto fn = reinterpret_cast<type_traits_fn>(dlsym(lib, "ggml_get_type_traits_cpu"));
    if (variant_path) {
        dlclose(lib);  // drops the reference NOLOAD took; ggml keeps the library open
    }
    return fn;
#endif
}

// ggml's own messages ("load_backend: loaded CPU backend from ...", gguf errors) go to the
// engine's log (qt_init_params.log_callback) instead of straight to stderr.
void forward_ggml_log(ggml_log_level level, const char * text, void *) {
    std::string line(text ? text : "");
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) {
        line.pop_back();
    }
    if (line.empty()) {
        return;
    }
    const qt_log_level to = level == GGML_LOG_LEVEL_ERROR  ? QT_LOG_LEVEL_ERROR
                            : level == GGML_LOG_LEVEL_WARN ? QT_LOG_LEVEL_WARN
                            : level == GGML_LOG_LEVEL_DEBUG ? QT_LOG_LEVEL_DEBUG
                                                            : QT_LOG_LEVEL_INFO;
    log(to, "ggml: %s", line.c_str());
}

cpu_backend_info load() {
    ggml_log_set(forward_ggml_log, nullptr);
    cpu_backend_info info;
    const std::vector<variant> variants = find_variants();
    for (const variant & v : variants) {
        info.available.push_back(v.name + (v.score > 0 ? "" : " (not on this CPU)"));
    }
    const char * forced = std::getenv("VOCABLE_CPU_VARIANT");
    const variant * chosen = nullptr;
    if (forced && *forced) {
        for (const variant & v : variants) {
            if (v.name == forced) {
                chosen = &v;
            }
        }
        const std::string names = joined(info.available);
        if (!chosen) {
            throw error(QT_STATUS_FAILED, format("VOCABLE_CPU_VARIANT=%s: no such CPU variant (there are: %s)", forced,
                                                 names.c_str()));
        }
        if (chosen->score <= 0) {
            throw error(QT_STATUS_FAILED, format("VOCABLE_CPU_VARIANT=%s: this processor cannot run that variant "
                                                 "(there are: %s)", forced, names.c_str()));
        }
    } else if (!variants.empty() && variants.front().score > 0) {
        chosen = &variants.front();
    }
    if (chosen) {
        ggml_backend_reg_t reg = ggml_backend_load(chosen->path.string().c_str());
        if (!reg) {
            throw error(QT_STATUS_FAILED, format("cannot load ggml's CPU backend %s", chosen->path.string().c_str()));
        }
        info.variant = chosen->name;
    } else {
        info.variant = "built in";
    }
    info.device = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!info.device) {
        throw error(QT_STATUS_FAILED, variants.empty()
                                          ? std::string("ggml's CPU backend was not found (no libggml-cpu-*.so beside ggml)")
                                          : std::string("no CPU variant of ggml runs on this processor"));
    }
    info.features = features_of(ggml_backend_dev_backend_reg(info.device));
    info.type_traits = type_traits_of(chosen ? &chosen->path : nullptr);
    return info;
}

// The device backends ggml can build as loadable modules, by their file's name.
#if defined(_WIN32)
constexpr const char * k_device_modules[] = { "ggml-vulkan.dll", "ggml-cuda.dll" };
#elif defined(__APPLE__)
constexpr const char * k_device_modules[] = { "libggml-metal.so", "libggml-vulkan.so" };
#else
constexpr const char * k_device_modules[] = { "libggml-vulkan.so", "libggml-cuda.so" };
#endif

// Opens a module to learn whether it can be loaded at all ("" when it can), so that a missing
// dependency (the Vulkan loader, the CUDA runtime) is reported in the linker's own words.
std::string load_failure(const fs::path & path) {
#if defined(_WIN32)
    HMODULE lib = LoadLibraryW(path.wstring().c_str());
    if (!lib) {
        return format("cannot load %s (error %lu)", path.string().c_str(), GetLastError());
    }
    FreeLibrary(lib);
    return {};
#else
    void * lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char * why = dlerror();
        return why ? why : "cannot load " + path.string();
    }
    dlclose(lib);
    return {};
#endif
}

std::vector<std::string> load_device_backends() {
    std::vector<std::string> notes;
    for (const char * module : k_device_modules) {
        for (const fs::path & dir : { folder_of(reinterpret_cast<const void *>(&ggml_backend_load)),
                                      folder_of(reinterpret_cast<const void *>(&cpu_backend_loaded)) / "lib" }) {
            std::error_code ec;
            const fs::path path = dir / module;
            if (!fs::is_regular_file(path, ec)) {
                continue;
            }
            const std::string failure = load_failure(path);
            if (!failure.empty()) {
                notes.push_back(format("%s: %s", module, failure.c_str()));
            } else if (ggml_backend_reg_t reg = ggml_backend_load(path.string().c_str())) {
                if (ggml_backend_reg_dev_count(reg) == 0) {
                    const std::string name = ggml_backend_reg_name(reg);
                    notes.push_back(format("%s: no %s device found%s", module, name.c_str(),
                                           name == "Vulkan" ? " (a software driver such as Mesa's lavapipe is listed "
                                                              "only when GGML_VK_VISIBLE_DEVICES selects it)"
                                                            : ""));
                }
            } else {
                notes.push_back(format("%s: ggml could not register it", module));
            }
            break;  // the first copy found is the one
        }
    }
    return notes;
}

const char * kind_of(enum ggml_backend_dev_type type) {
    switch (type) {
        case GGML_BACKEND_DEVICE_TYPE_CPU: return "cpu";
        case GGML_BACKEND_DEVICE_TYPE_GPU: return "gpu";
        case GGML_BACKEND_DEVICE_TYPE_IGPU: return "igpu";
        default: return "accel";
    }
}

} // namespace

devices_found devices_loaded() {
    const cpu_backend_info & cpu = cpu_backend_loaded();
    static std::mutex               mutex;
    static std::vector<std::string> notes;
    static bool                     done = false;
    {
        std::lock_guard<std::mutex> lock(mutex);
        if (!done) {
            notes = load_device_backends();
            done = true;
            for (const std::string & note : notes) {
                QT_LOG_INFO("device backend: %s", note.c_str());
            }
        }
    }
    devices_found found;
    found.notes = notes;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        const enum ggml_backend_dev_type type = ggml_backend_dev_type(dev);
        if (type == GGML_BACKEND_DEVICE_TYPE_CPU && dev != cpu.device) {
            continue;  // another CPU backend's (a BLAS one, say): the engine computes on its own
        }
        device_info d;
        d.device = dev;
        d.kind = kind_of(type);
        d.description = ggml_backend_dev_description(dev);
        if (type == GGML_BACKEND_DEVICE_TYPE_CPU) {
            d.id = "cpu";
        } else {
            ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
            std::string backend = ggml_backend_reg_name(reg);
            std::transform(backend.begin(), backend.end(), backend.begin(),
                           [](unsigned char c) { return char(std::tolower(c)); });
            size_t index = 0;
            while (index < ggml_backend_reg_dev_count(reg) && ggml_backend_reg_dev_get(reg, index) != dev) {
                ++index;
            }
            d.id = backend + ":" + std::to_string(index);
        }
        ggml_backend_dev_memory(dev, &d.memory_free, &d.memory_total);
        found.devices.push_back(std::move(d));
    }
    std::stable_partition(found.devices.begin(), found.devices.end(),
                          [](const device_info & d) { return d.kind == "cpu"; });
    return found;
}

bool cpu_backend_info::has_feature(const char * name) const {
    std::istringstream words(features);
    for (std::string word; words >> word;) {
        if (word == name) {
            return true;
        }
    }
    return false;
}

std::string cpu_backend_info::describe(const char * kernels) const {
    return variant + " (" + features + "); kernels: " + kernels + "; variants: " + joined(available);
}

const cpu_backend_info & cpu_backend_loaded() {
    static std::mutex       mutex;
    static cpu_backend_info loaded;
    static bool             done = false;
    std::lock_guard<std::mutex> lock(mutex);
    if (!done) {
        loaded = load();  // throws: the next call tries again
        done = true;
        QT_LOG_INFO("ggml CPU backend: %s variant (%s)", loaded.variant.c_str(), loaded.features.c_str());
    }
    return loaded;
}

} // namespace qt
