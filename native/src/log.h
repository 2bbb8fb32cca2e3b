// Logging and the per-thread last-error message behind qt_last_error().
#pragma once

#include "qwen3-tts.h"

#include <stdexcept>
#include <string>

#ifdef __GNUC__
#    define QT_PRINTF(fmt_idx, arg_idx) __attribute__((format(printf, fmt_idx, arg_idx)))
#else
#    define QT_PRINTF(fmt_idx, arg_idx)
#endif

namespace qt {

// The sink of the thread that is inside an engine call; set by the C API on entry.
struct log_sink {
    qt_log_callback callback = nullptr;
    void *          user_data = nullptr;
};

// Installs `sink` for the current thread for the lifetime of the guard.
class log_scope {
public:
    explicit log_scope(const log_sink & sink);
    ~log_scope();
    log_scope(const log_scope &) = delete;
    log_scope & operator=(const log_scope &) = delete;

private:
    log_sink previous_;
};

void log(qt_log_level level, const char * fmt, ...) QT_PRINTF(2, 3);
std::string format(const char * fmt, ...) QT_PRINTF(1, 2);

void set_last_error(const std::string & message);
const char * last_error();

// Thrown inside the engine and turned into a status code at the C API boundary.
struct error : std::runtime_error {
    qt_status status;
    error(qt_status s, const std::string & message) : std::runtime_error(message), status(s) {}
};

} // namespace qt

#define QT_LOG_DEBUG(...) ::qt::log(QT_LOG_LEVEL_DEBUG, __VA_ARGS__)
#define QT_LOG_INFO(...)  ::qt::log(QT_LOG_LEVEL_INFO, __VA_ARGS__)
#define QT_LOG_WARN(...)  ::qt::log(QT_LOG_LEVEL_WARN, __VA_ARGS__)
#define QT_LOG_ERROR(...) ::qt::log(QT_LOG_LEVEL_ERROR, __VA_ARGS__)
