# cmake -DGGML_SOURCE=<ggml source dir> -P ggml-sharing-barrier.cmake
#
# Keeps a thread waiting at ggml_barrier from burning a core that its parked partner or another
# process needs (llama.cpp #13079, whisper.cpp #2725): it spins for a bounded time
# (GGML_BARRIER_SPIN_US, default 50 us), then sleeps on a futex (other systems: yields) until
# the last thread arrives, which wakes sleepers only when there are any. ggml's barrier spins
# without bound. Measured alone (two threads beside one busy process, 2 cores) it took the
# slowdown from 2.9-3.1x to 2.3-2.8x the quiet speed; the rest comes from running fewer threads
# (native/src/core-share.h). Applied to the pinned sdist's ggml-cpu.c by exact-text replacement;
# any mismatch fails the build instead of building unpatched.
set(file "${GGML_SOURCE}/src/ggml-cpu/ggml-cpu.c")
file(READ "${file}" text)

function(replace_once anchor replacement)
    string(FIND "${text}" "${anchor}" at)
    if(at EQUAL -1)
        message(FATAL_ERROR "ggml-sharing-barrier: anchor not found in ${file}:\n${anchor}")
    endif()
    string(REPLACE "${anchor}" "${replacement}" patched "${text}")
    set(text "${patched}" PARENT_SCOPE)
endfunction()

if(text MATCHES "n_barrier_sleepers")
    return()  # already applied
endif()

replace_once("    atomic_int GGML_CACHE_ALIGN n_barrier_passed;\n"
"    atomic_int GGML_CACHE_ALIGN n_barrier_passed;
    atomic_int GGML_CACHE_ALIGN n_barrier_sleepers; // threads asleep in ggml_barrier
    int64_t      barrier_spin_us; // how long ggml_barrier spins before it sleeps
")

replace_once("void ggml_barrier(struct ggml_threadpool * tp) {\n"
"static void ggml_barrier_wait(struct ggml_threadpool * tp, int n_passed) {
    const int64_t t0 = ggml_time_us();
    for (int i = 1; atomic_load_explicit(&tp->n_barrier_passed, memory_order_relaxed) == n_passed; i++) {
        if ((i & 63) != 0 || ggml_time_us() - t0 < tp->barrier_spin_us) {
            ggml_thread_cpu_relax();
            continue;
        }
        atomic_fetch_add_explicit(&tp->n_barrier_sleepers, 1, memory_order_seq_cst);
        if (atomic_load_explicit(&tp->n_barrier_passed, memory_order_seq_cst) == n_passed) {
#if defined(__gnu_linux__)
            syscall(SYS_futex, &tp->n_barrier_passed, 0x80 /* FUTEX_WAIT_PRIVATE */, n_passed, NULL, NULL, 0);
#elif defined(_WIN32)
            SwitchToThread();
#else
            sched_yield();
#endif
        }
        atomic_fetch_sub_explicit(&tp->n_barrier_sleepers, 1, memory_order_seq_cst);
    }
}

static void ggml_barrier_release(struct ggml_threadpool * tp) {
    atomic_fetch_add_explicit(&tp->n_barrier_passed, 1, memory_order_seq_cst);
#if defined(__gnu_linux__)
    if (atomic_load_explicit(&tp->n_barrier_sleepers, memory_order_seq_cst) > 0) {
        syscall(SYS_futex, &tp->n_barrier_passed, 0x81 /* FUTEX_WAKE_PRIVATE */, INT_MAX, NULL, NULL, 0);
    }
#endif
}

void ggml_barrier(struct ggml_threadpool * tp) {
")

replace_once("        // exit barrier (full seq-cst fence)
        atomic_fetch_add_explicit(&tp->n_barrier_passed, 1, memory_order_seq_cst);
        return;
    }

    // wait for other threads
    while (atomic_load_explicit(&tp->n_barrier_passed, memory_order_relaxed) == n_passed) {
        ggml_thread_cpu_relax();
    }
"
"        // exit barrier (full seq-cst fence)
        ggml_barrier_release(tp);
        return;
    }

    // wait for other threads: spin briefly, then sleep
    ggml_barrier_wait(tp, n_passed);
")

replace_once("        threadpool->n_barrier_passed = 0;\n"
"        threadpool->n_barrier_passed = 0;
        threadpool->n_barrier_sleepers = 0;
        {
            const char * spin_us = getenv(\"GGML_BARRIER_SPIN_US\");
            threadpool->barrier_spin_us = spin_us ? atoll(spin_us) : 50;
        }
")

file(WRITE "${file}" "${text}")
