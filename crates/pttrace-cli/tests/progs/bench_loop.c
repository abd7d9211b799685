/* Syscall-heavy workload for benches/shim.rs: N getppid() calls; prints the loop's
 * duration in ns measured with CLOCK_MONOTONIC (vDSO, not a syscall). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static long long now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 100000;
    long sum = 0;
    long long t0 = now();
    for (long i = 0; i < n; i++)
        sum += getppid();
    long long t1 = now();
    printf("%lld %ld\n", t1 - t0, sum != 0);
    return 0;
}
