/* 16 threads, each makes exactly 1000 getppid() calls (glibc wrapper -> syscall 110). */
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#define THREADS 16
#define CALLS 1000

static void *worker(void *arg) {
    long sum = 0;
    for (int i = 0; i < CALLS; i++)
        sum += getppid();
    return (void *)sum;
}

int main(void) {
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        if (pthread_create(&t[i], NULL, worker, NULL) != 0) {
            perror("pthread_create");
            return 1;
        }
    long expect = (long)getppid() * CALLS, bad = 0;
    for (int i = 0; i < THREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        if ((long)r != expect)
            bad++;
    }
    printf("threads done, %ld wrong sums\n", bad);
    return bad != 0;
}
