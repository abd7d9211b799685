/* Workload for the user-mode stepping part of benches/shim.rs: N iterations of a dec/jnz
 * loop (2N instructions) between two syscalls. Prints the loop's duration in ns
 * (CLOCK_MONOTONIC through the vDSO, read outside the loop). With argument "bare" the loop
 * runs with EFLAGS.TF set and a SIGTRAP handler that only counts: the bare cost of
 * single-stepping on this machine, for comparison. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static volatile long traps;
static void on_trap(int sig) {
    (void)sig;
    traps++;
}

static long long now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 100000;
    int bare = argc > 2 && strcmp(argv[2], "bare") == 0;
    if (bare) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_trap;
        sigaction(SIGTRAP, &sa, 0);
    }
    long long t0 = now();
    syscall(SYS_getppid);
    if (bare)
        __asm__ volatile("pushfq\n orq $0x100, (%%rsp)\n popfq\n"
                         "1: dec %0\n jnz 1b\n"
                         "pushfq\n andq $-257, (%%rsp)\n popfq\n"
                         : "+r"(n)::"cc", "memory");
    else
        __asm__ volatile("1: dec %0\n jnz 1b\n" : "+r"(n)::"cc");
    syscall(SYS_gettid);
    long long t1 = now();
    printf("%lld %ld\n", t1 - t0, traps);
    return 0;
}
