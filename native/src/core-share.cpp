#include "core-share.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <thread>

#if defined(__linux__)
#    include <unistd.h>
#endif

namespace qt {

core_monitor::core_monitor() {
    const unsigned n = std::thread::hardware_concurrency();
    n_cores_ = n ? int(n) : 1;
#if defined(__linux__)
    const long ticks = sysconf(_SC_CLK_TCK);
    if (ticks > 0) {
        tick_s_ = 1.0 / double(ticks);
    }
#endif
}

bool core_monitor::read(sample & s) const {
#if defined(__linux__)
    FILE * f = std::fopen("/proc/stat", "r");
    if (!f) {
        return false;
    }
    // cpu  user nice system idle iowait irq softirq steal ...
    unsigned long long user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
    const int n = std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &user, &nice, &system, &idle, &iowait,
                              &irq, &softirq, &steal);
    std::fclose(f);
    if (n < 4) {
        return false;
    }
    timespec self{};
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &self) != 0) {
        return false;
    }
    s.wall = std::chrono::steady_clock::now();
    s.busy_s = double(user + nice + system + irq + softirq + steal) * tick_s_;
    s.self_s = double(self.tv_sec) + 1e-9 * double(self.tv_nsec);
    return true;
#else
    (void) s;
    return false;
#endif
}

double core_monitor::free_cores(std::chrono::milliseconds min_window) {
    const auto now = std::chrono::steady_clock::now();
    if (have_last_ && now - last_.wall < min_window) {
        return free_;
    }
    sample s;
    if (!read(s)) {
        return free_;
    }
    if (have_last_) {
        const double wall_s = std::chrono::duration<double>(s.wall - last_.wall).count();
        const double others = std::max(0.0, (s.busy_s - last_.busy_s) - (s.self_s - last_.self_s)) / wall_s;
        free_ = std::clamp(double(n_cores_) - others, 0.0, double(n_cores_));
    }
    last_ = s;
    have_last_ = true;
    return free_;
}

int threads_for_free_cores(double free_cores, int max_threads) {
    if (free_cores < 0.0) {
        return max_threads;
    }
    return std::clamp(int(std::lround(free_cores)), 1, max_threads);
}

} // namespace qt
