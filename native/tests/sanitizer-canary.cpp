// Proves that a sanitized build catches what it is meant to: each mode does one thing the
// sanitizers must stop (ctest expects these runs to fail, so a build whose sanitizers were
// silently lost fails the suite).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

int main(int argc, char ** argv) {
    const char * mode = argc > 1 ? argv[1] : "";
    volatile int past = argc + 7;  // not known to the compiler
    if (!strcmp(mode, "heap-overflow")) {
        char * block = static_cast<char *>(malloc(8));
        block[past] = 1;
        printf("%d\n", block[past]);
        free(block);
    } else if (!strcmp(mode, "signed-overflow")) {
        volatile int big = std::numeric_limits<int>::max();
        printf("%d\n", big + past);
    } else if (!strcmp(mode, "leak")) {
        char * block = static_cast<char *>(malloc(64));
        block[0] = char(past);
        printf("%p\n", static_cast<void *>(block));
        block = nullptr;
    }
    return 0;
}
