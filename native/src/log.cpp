#include "log.h"

#include <cstdarg>
#include <cstdio>
#include <vector>

namespace qt {

namespace {

thread_local log_sink    t_sink;
thread_local std::string t_last_error;

std::string vformat(const char * fmt, va_list args) {
    va_list copy;
    va_copy(copy, args);
    const int n = vsnprintf(nullptr, 0, fmt, copy);
    va_end(copy);
    if (n <= 0) {
        return {};
    }
    std::vector<char> buf(size_t(n) + 1);
    vsnprintf(buf.data(), buf.size(), fmt, args);
    return std::string(buf.data(), size_t(n));
}

} // namespace

log_scope::log_scope(const log_sink & sink) : previous_(t_sink) { t_sink = sink; }
log_scope::~log_scope() { t_sink = previous_; }

void log(qt_log_level level, const char * fmt, ...) {
    va_list args;
    va_start(args, fmt);
    const std::string text = vformat(fmt, args);
    va_end(args);
    if (t_sink.callback) {
        t_sink.callback(level, text.c_str(), t_sink.user_data);
    } else if (level >= QT_LOG_LEVEL_WARN) {
        fprintf(stderr, "qwen3-tts: %s\n", text.c_str());
    }
}

std::string format(const char * fmt, ...) {
    va_list args;
    va_start(args, fmt);
    std::string text = vformat(fmt, args);
    va_end(args);
    return text;
}

void set_last_error(const std::string & message) { t_last_error = message; }
const char * last_error() { return t_last_error.c_str(); }

} // namespace qt
