// How many cores other processes leave free, so the engine's thread pool can shrink instead of
// fighting them.
//
// ggml's workers meet at a barrier after every graph node (hundreds per generated frame). When
// the engine runs more threads than there are free cores, one of them is always waiting for the
// scheduler, and every other thread waits for it at the next barrier: with one busy process on
// two cores, two engine threads ran 2.7-3.1x slower than quiet, one thread (with a core to
// itself) 1.7-1.9x. So the engine runs as many threads as cores are free, up to the number it
// was given.
//
// Free cores are measured, not guessed: the CPU time all processes used over the last window
// (/proc/stat) minus this process's own (CLOCK_PROCESS_CPUTIME_ID), so the engine's own
// threads never count as load. Elsewhere than Linux every core counts as free.
#pragma once

#include <chrono>
#include <cstdint>

namespace qt {

class core_monitor {
public:
    core_monitor();

    int n_cores() const { return n_cores_; }

    // Cores that other processes left idle over the time since the previous call (at least
    // `min_window`; sooner calls return the previous figure). -1 until a window has passed, or
    // where the system does not tell.
    double free_cores(std::chrono::milliseconds min_window = std::chrono::milliseconds(250));

private:
    struct sample {
        std::chrono::steady_clock::time_point wall;
        double busy_s = 0.0;  // all processes, all cores
        double self_s = 0.0;  // this process
    };
    bool read(sample & s) const;

    int    n_cores_ = 1;
    double tick_s_ = 0.01;
    bool   have_last_ = false;
    sample last_;
    double free_ = -1.0;
};

// The thread count for the next graph: as many as cores are free (rounded to the nearest, at
// least 1), at most `max_threads`; `max_threads` while nothing is known.
int threads_for_free_cores(double free_cores, int max_threads);

} // namespace qt
