/* Snapshot (flight-recorder) tests: a long loop whose iterations the trace tells apart,
 * then a marker function.
 *
 *   snapshot_loop N [MODE [ARGS]]
 *
 * runs step(i) for i = 0..N-1, then by MODE:
 *   (none)           marker(), then exit 0
 *   twice            marker(), the loop again for i = N..2N-1, marker() again
 *   syscall          getppid() (a syscall trigger), then marker()
 *   wait READY GO    creates READY, waits (1 ms sleeps) until GO exists, then marker()
 *
 * step(i) calls bit_one() or bit_zero() for each of the 17 low bits of i, lowest first, so
 * the decoded instruction stream spells every iteration's number. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

volatile unsigned long sink;

__attribute__((noinline)) void bit_one(void) { sink += 1; }
__attribute__((noinline)) void bit_zero(void) { sink += 2; }

__attribute__((noinline)) void step(unsigned long i) {
    for (int b = 0; b < 17; b++) {
        if ((i >> b) & 1)
            bit_one();
        else
            bit_zero();
    }
}

__attribute__((noinline)) void marker(void) { sink ^= 0x5a; }

static void loop(unsigned long from, unsigned long to) {
    for (unsigned long i = from; i < to; i++)
        step(i);
}

int main(int argc, char **argv) {
    unsigned long n = argc > 1 ? strtoul(argv[1], 0, 0) : 100000;
    const char *mode = argc > 2 ? argv[2] : "";
    loop(0, n);
    if (!strcmp(mode, "twice")) {
        marker();
        loop(n, 2 * n);
    } else if (!strcmp(mode, "syscall")) {
        (void)getppid();
    } else if (!strcmp(mode, "wait") && argc > 4) {
        close(open(argv[3], O_CREAT | O_WRONLY, 0644));
        struct timespec ms = {0, 1000000};
        while (access(argv[4], F_OK) != 0)
            nanosleep(&ms, 0);
    }
    marker();
    return 0;
}
