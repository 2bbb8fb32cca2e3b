// The check lines shared by the C++ tests and their tally: one "ok  :" or "FAIL:" line per
// check, the final status line and the exit status. No engine headers, so that tests built
// without src/ on the include path (test-codec-decoder) can use it too.
#pragma once

#include <cstdarg>
#include <cstdio>
#include <exception>

namespace test {

inline int failures = 0;

void check(bool ok, const char * fmt, ...) __attribute__((format(printf, 2, 3)));

inline void check(bool ok, const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(ok ? stdout : stderr, "%s: ", ok ? "ok  " : "FAIL");
    vfprintf(ok ? stdout : stderr, fmt, ap);
    fputc('\n', ok ? stdout : stderr);
    va_end(ap);
    if (!ok) {
        ++failures;
    }
}

// The last line of a run, `passed` when no check failed, and the exit status.
inline int finish(const char * passed) {
    printf("%s\n", failures ? "FAILED" : passed);
    return failures ? 1 : 0;
}

// The exit status of `run`; an exception (a model that does not load, a missing fixture) is a
// FAIL line and status 1.
template <class Run> int run_or_fail(Run run) {
    try {
        return run();
    } catch (const std::exception & e) {
        fprintf(stderr, "FAIL: %s\n", e.what());
        return 1;
    }
}

} // namespace test
