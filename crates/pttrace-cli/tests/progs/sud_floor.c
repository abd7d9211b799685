/* The floor of any Syscall User Dispatch tracer: N getppid() calls trapped with SIGSYS
 * by a handler that only performs the syscall (no recording). Prints loop ns for the plain
 * and the trapped loop. Used by benches/shim.rs for comparison. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

static volatile char selector = 0;
extern char floor_begin[], floor_end[], floor_restorer[];
__asm__(".text\n"
        "floor_begin:\n"
        "  mov %rdi, %rax\n"
        "  syscall\n"
        "  ret\n"
        "floor_restorer:\n"
        "  mov $15, %eax\n"
        "  syscall\n"
        "floor_end:\n"
        "  nop\n");

struct ksigaction { void *handler; unsigned long flags; void *restorer; unsigned long mask; };

static long via_stub(long nr) {
    long r;
    __asm__ volatile("call floor_begin" : "=a"(r) : "D"(nr) : "rcx", "r11", "memory");
    return r;
}

/* Compiled with -mno-red-zone: the handler's `call` must not clobber a red zone. */
static void on_sigsys(int sig, siginfo_t *si, void *p) {
    (void)sig; (void)si;
    ucontext_t *uc = p;
    uc->uc_mcontext.gregs[REG_RAX] = via_stub(uc->uc_mcontext.gregs[REG_RAX]);
}

static long long now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 100000;
    struct ksigaction k = {on_sigsys, SA_SIGINFO | SA_NODEFER | 0x04000000, floor_restorer, 0};
    if (syscall(SYS_rt_sigaction, SIGSYS, &k, NULL, 8) != 0) return 1;
    if (prctl(59, 1, (unsigned long)floor_begin, (unsigned long)(floor_end - floor_begin + 1),
              &selector) != 0)
        return 2;
    long long t0 = now();
    for (long i = 0; i < n; i++) getppid();
    long long t1 = now();
    selector = 1;
    long long t2 = now();
    for (long i = 0; i < n; i++) getppid();
    long long t3 = now();
    selector = 0;
    printf("%lld %lld\n", t1 - t0, t3 - t2);
    return 0;
}
