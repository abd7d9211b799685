/* 1,000 thread lifetimes for the drpttracer client (c_tests/dynamorio/client.c): ROUNDS
 * rounds of THREADS threads that start, make a few syscalls (getpid, write to /dev/null)
 * and exit. Arguments: [rounds [threads]] (default 125 x 8). Prints one line at the end.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

static int devnull = -1;

static void *
worker(void *arg)
{
    (void)arg;
    static const char msg[] = "drpttracer\n";
    for (int i = 0; i < 2; i++) {
        if (syscall(SYS_getpid) <= 0)
            abort();
        if (write(devnull, msg, sizeof(msg) - 1) != (ssize_t)(sizeof(msg) - 1))
            abort();
    }
    return NULL;
}

int
main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 125;
    int nthreads = argc > 2 ? atoi(argv[2]) : 8;
    if (rounds <= 0 || nthreads <= 0 || nthreads > 64) {
        fprintf(stderr, "usage: %s [rounds [threads<=64]]\n", argv[0]);
        return 2;
    }
    devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (devnull < 0) {
        perror("open /dev/null");
        return 1;
    }
    pthread_t t[64];
    int lifetimes = 0;
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < nthreads; i++) {
            if (pthread_create(&t[i], NULL, worker, NULL) != 0) {
                perror("pthread_create");
                return 1;
            }
        }
        for (int i = 0; i < nthreads; i++) {
            pthread_join(t[i], NULL);
            lifetimes++;
        }
    }
    close(devnull);
    printf("threads: %d thread lifetimes (%d rounds of %d)\n", lifetimes, rounds, nthreads);
    return 0;
}
