/* Snapshot (flight-recorder) tests: a long loop whose iterations the trace tells apart,
 * then a marker function.
 *
 *   snapshot_loop N [MODE [ARGS]]
 *
 * runs step(i) for i = 0..N-1, then by MODE:
 *   (none)           marker(), then exit 0
 *   twice            marker(), the loop again for i = N..2N-1, marker() again
 *   after            marker(), then step(i) for i = N, N+1, ... without any syscall until
 *                    it is killed
 *   syscall          getppid() (a syscall trigger), then marker()
 *   block            writes "ready 0\n" on stdout, then blocks reading one byte of stdin,
 *                    then marker()
 *   exec PROG ARGS   execv(PROG, [PROG, ARGS...]) first (no loop in this image)
 *   forever          after its loop, runs step(i) then getppid() for i = N, N+1, ...
 *                    until it is killed
 *   spin             another thread runs step(i) for i = 0, 1, ... until told to stop;
 *                    once it is looping, the main thread runs its loop, calls getppid(),
 *                    then stops it and joins it
 *   spinexit         like spin, but main returns right after its loop (exit_group while the
 *                    other thread is still looping)
 *   handler          like spin, but after its loop main sends the other thread SIGUSR1,
 *                    whose handler spins until told to stop; once it runs, main calls
 *                    getppid(), sleeps 1.5 s, then stops the handler and the thread
 *   threads K        K more threads: thread k (1..K) runs step(i) for i = kN..(k+1)N-1,
 *                    writes "ready k\n" and blocks reading a pipe; the main thread runs its
 *                    loop, writes "ready 0\n" and blocks reading stdin; a byte there makes
 *                    it call getppid(), then read stdin again; at its end (EOF) it closes
 *                    the pipe, the threads call marker() and end, and main joins them
 *
 * step(i) calls bit_one() or bit_zero() for each of the 17 low bits of i, lowest first, so
 * the decoded instruction stream spells every iteration's number.
 *
 * With SNAPSHOT_LOOP_SYSCALL set in the environment, main first calls getpid(): the
 * single-step backend of the LD_PRELOAD shim steps a thread's code from its first syscall
 * on, so that the loop is traced there too. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

static unsigned long per_thread;
static int pipe_fds[2];

static void ready(long k) {
    char msg[32];
    int len = snprintf(msg, sizeof msg, "ready %ld\n", k);
    (void)write(1, msg, len);
}

static void *worker(void *arg) {
    long k = (long)arg;
    char c;
    loop(k * per_thread, (k + 1) * per_thread);
    ready(k);
    (void)read(pipe_fds[0], &c, 1);
    marker();
    return 0;
}

static volatile int spin_started, spin_stop;

static void *spinner(void *arg) {
    (void)arg;
    for (unsigned long i = 0; !spin_stop; i++) {
        step(i);
        spin_started = 1;
    }
    return 0;
}

static volatile int in_handler, handler_stop;

static void on_usr1(int sig) {
    (void)sig;
    in_handler = 1;
    while (!handler_stop)
        ;
}

int main(int argc, char **argv) {
    unsigned long n = argc > 1 ? strtoul(argv[1], 0, 0) : 100000;
    const char *mode = argc > 2 ? argv[2] : "";
    if (getenv("SNAPSHOT_LOOP_SYSCALL"))
        (void)getpid();
    if (!strcmp(mode, "exec") && argc > 3) {
        execv(argv[3], argv + 3);
        return 4;
    }
    if (!strcmp(mode, "spin") || !strcmp(mode, "spinexit") || !strcmp(mode, "handler")) {
        pthread_t t;
        int handler = !strcmp(mode, "handler");
        if (handler)
            signal(SIGUSR1, on_usr1);
        if (pthread_create(&t, 0, spinner, 0) != 0)
            return 3;
        while (!spin_started)
            ;
        loop(0, n);
        if (!strcmp(mode, "spinexit"))
            return 0;
        if (handler) {
            pthread_kill(t, SIGUSR1);
            while (!in_handler)
                ;
            (void)getppid();
            usleep(1500000);
            handler_stop = 1;
            spin_stop = 1;
            pthread_join(t, 0);
            return 0;
        }
        (void)getppid();
        spin_stop = 1;
        pthread_join(t, 0);
        return 0;
    }
    if (!strcmp(mode, "threads") && argc > 3) {
        long k = strtol(argv[3], 0, 0);
        pthread_t t[64];
        char c;
        per_thread = n;
        if (k < 1 || k > 64 || pipe(pipe_fds) != 0)
            return 2;
        for (long i = 1; i <= k; i++)
            if (pthread_create(&t[i - 1], 0, worker, (void *)i) != 0)
                return 3;
        loop(0, n);
        ready(0);
        while (read(0, &c, 1) == 1)
            (void)getppid();
        close(pipe_fds[1]);
        for (long i = 1; i <= k; i++)
            pthread_join(t[i - 1], 0);
        marker();
        return 0;
    }
    loop(0, n);
    if (!strcmp(mode, "forever")) {
        for (unsigned long i = n;; i++) {
            step(i);
            (void)getppid();
        }
    }
    if (!strcmp(mode, "after")) {
        marker();
        for (unsigned long i = n;; i++)
            step(i);
    }
    if (!strcmp(mode, "block")) {
        char c;
        ready(0);
        (void)read(0, &c, 1);
    } else if (!strcmp(mode, "twice")) {
        marker();
        loop(n, 2 * n);
    } else if (!strcmp(mode, "syscall")) {
        (void)getppid();
    }
    marker();
    return 0;
}
