/* SIGKILL at any instant.
 *
 * killme self T N SEED: T threads (main included) make getppid() calls, N in all, split by
 *   SEED; the workers then block in pause(); once every worker is in it, main prints
 *   "tid count" for each thread and "end" on stdout (a pipe, so the line is out before the
 *   kill) and kills its own process with SIGKILL.
 * killme loop T FILE: T threads call getppid() for ever; after each call returns, a thread
 *   adds 1 to its counter in FILE (MAP_SHARED: the counts survive the kill), slot i
 *   holding {tid, count}. The test kills the process from outside at a random time. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAXT 8

static long counts[MAXT];
static pid_t tids[MAXT];
static atomic_int done;
static volatile long (*shared)[2];

struct arg { int i; long n; };

static void *self_worker(void *p) {
    struct arg *a = p;
    tids[a->i] = (pid_t)syscall(SYS_gettid);
    for (long k = 0; k < a->n; k++)
        getppid();
    counts[a->i] = a->n;
    atomic_fetch_add(&done, 1);
    for (;;)
        pause();
    return NULL;
}

static void *loop_worker(void *p) {
    struct arg *a = p;
    shared[a->i][0] = syscall(SYS_gettid);
    for (;;) {
        getppid();
        shared[a->i][1]++;
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 4)
        return 2;
    int t = atoi(argv[2]);
    if (t < 1 || t > MAXT)
        return 2;
    static struct arg args[MAXT];
    pthread_t th[MAXT];
    if (strcmp(argv[1], "self") == 0) {
        long n = atol(argv[3]);
        unsigned seed = argc > 4 ? (unsigned)atol(argv[4]) : 1;
        long left = n;
        for (int i = 0; i < t; i++) {
            long share = i == t - 1 ? left : (long)(rand_r(&seed) % (unsigned)(left + 1));
            args[i].i = i;
            args[i].n = share;
            left -= share;
        }
        for (int i = 1; i < t; i++)
            pthread_create(&th[i], NULL, self_worker, &args[i]);
        tids[0] = (pid_t)syscall(SYS_gettid);
        for (long k = 0; k < args[0].n; k++)
            getppid();
        counts[0] = args[0].n;
        while (atomic_load(&done) < t - 1)
            sched_yield();
        /* A worker counts itself done just before it enters pause(): wait until /proc says
         * each one is in that syscall, so that the kill finds it there (up to 10 s). */
        for (int i = 1; i < t; i++) {
            char path[64], buf[32];
            snprintf(path, sizeof path, "/proc/self/task/%d/syscall", tids[i]);
            for (int tries = 0; tries < 10000; tries++) {
                int fd = open(path, O_RDONLY);
                ssize_t r = fd < 0 ? -1 : read(fd, buf, sizeof buf - 1);
                if (fd >= 0)
                    close(fd);
                if (r > 0) {
                    buf[r] = 0;
                    if (atol(buf) == SYS_pause)
                        break;
                }
                usleep(1000);
            }
        }
        char line[64];
        for (int i = 0; i < t; i++) {
            int len = snprintf(line, sizeof line, "%d %ld\n", tids[i], counts[i]);
            write(1, line, (size_t)len);
        }
        write(1, "end\n", 4);
        kill(getpid(), SIGKILL);
        return 3;
    }
    int fd = open(argv[3], O_RDWR);
    if (fd < 0)
        return 2;
    shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (shared == MAP_FAILED)
        return 2;
    for (int i = 0; i < t; i++) {
        args[i].i = i;
        if (i > 0)
            pthread_create(&th[i], NULL, loop_worker, &args[i]);
    }
    write(1, "running\n", 8);
    loop_worker(&args[0]);
    return 0;
}
