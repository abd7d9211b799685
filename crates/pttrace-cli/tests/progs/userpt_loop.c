/* A loop with exactly known control flow between two syscalls (user-mode PT tests).
 * pt_loop runs N iterations: `test cl,1; jz skip; nop; skip: dec rcx; jnz head`.
 * The jz at pt_loop_jz is taken when rcx is even (N/2 times for even N), the jnz at
 * pt_loop_jnz is taken N-1 times. With argument "threads", 4 threads run it with
 * N = 100, 200, 300, 400, each between its own getppid and gettid syscalls; with "long",
 * the loop runs 100000 iterations (more steps than a small capture buffer holds); with
 * "alarm", 20000 iterations while SIGALRM arrives every 20 ms. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <sys/time.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

__attribute__((noinline)) void pt_loop(long n) {
    __asm__ volatile(
        "mov %0, %%rcx\n"
        ".globl pt_loop_head\n"
        "pt_loop_head:\n"
        "test $1, %%cl\n"
        ".globl pt_loop_jz\n"
        "pt_loop_jz:\n"
        "jz 1f\n"
        "nop\n"
        "1:\n"
        "dec %%rcx\n"
        ".globl pt_loop_jnz\n"
        "pt_loop_jnz:\n"
        "jnz pt_loop_head\n"
        :
        : "r"(n)
        : "rcx", "cc");
}

static void *worker(void *arg) {
    long n = (long)arg;
    syscall(SYS_getppid);
    pt_loop(n);
    syscall(SYS_gettid);
    return 0;
}

static volatile long alarms;
static void on_alarm(int sig) {
    (void)sig;
    alarms++;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "alarm") == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_alarm;
        sigaction(SIGALRM, &sa, 0);
        struct itimerval it = {{0, 20000}, {0, 20000}};
        setitimer(ITIMER_REAL, &it, 0);
        syscall(SYS_getppid);
        pt_loop(20000);
        syscall(SYS_getpid);
        struct itimerval off = {{0, 0}, {0, 0}};
        setitimer(ITIMER_REAL, &off, 0);
        printf("alarms %ld\n", alarms);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "threads") == 0) {
        pthread_t t[4];
        for (long i = 0; i < 4; i++)
            pthread_create(&t[i], 0, worker, (void *)(100 * (i + 1)));
        for (int i = 0; i < 4; i++)
            pthread_join(t[i], 0);
        return 0;
    }
    long n = (argc > 1 && strcmp(argv[1], "long") == 0) ? 100000 : 1000;
    syscall(SYS_getppid);
    pt_loop(n);
    syscall(SYS_getpid);
    syscall(SYS_getppid);
    return 0;
}
