/* The main thread leaves with pthread_exit; the last thread to exit ends the process. */
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
static void *worker(void *a) {
    (void)a;
    for (int i = 0; i < 100; i++)
        getppid();
    return NULL;
}
int main(void) {
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    printf("main leaving\n");
    fflush(stdout);
    pthread_exit(NULL);
}
