/* 8 threads, each with its own handle, create/start/stop/destroy concurrently. */
#include <pthread.h>

#include "test_util.h"

#define THREADS 8
#define WINDOWS 10

static volatile unsigned long sink;

static unsigned long
work(unsigned long n)
{
    unsigned long acc = 0;
    for (unsigned long i = 0; i < n; i++)
        acc += (i & 1) ? i * 3 : i ^ 5;
    return acc;
}

static void *
thread_main(void *arg)
{
    long id = (long)arg;
    for (int round = 0; round < 3; round++) {
        void *h = NULL;
        drpttracer_output_t *out = NULL;
        pt_metadata_t m;
        CHECK_STATUS(drpttracer_create_handle(NULL, DRPTTRACER_TRACING_ONLY_USER, 6, 4, &h),
                     DRPTTRACER_SUCCESS);
        CHECK_STATUS(drpttracer_create_output(NULL, 6, 4, &out), DRPTTRACER_SUCCESS);
        CHECK_STATUS(drpttracer_get_pt_metadata(h, &m), DRPTTRACER_SUCCESS);
        for (int w = 0; w < WINDOWS; w++) {
            CHECK_STATUS(drpttracer_start_tracing(NULL, h), DRPTTRACER_SUCCESS);
            sink += work(50 + id);
            CHECK_STATUS(drpttracer_stop_tracing(NULL, h, out), DRPTTRACER_SUCCESS);
            CHECK(out->pt_size > 0);
            CHECK(out->sideband_size > 0); /* user mode: at least the synthesized mappings */
        }
        CHECK_STATUS(drpttracer_destroy_output(NULL, out), DRPTTRACER_SUCCESS);
        CHECK_STATUS(drpttracer_destroy_handle(NULL, h), DRPTTRACER_SUCCESS);
    }
    return NULL;
}

int
main(void)
{
    pthread_t t[THREADS];
    CHECK(drpttracer_init());
    for (long i = 0; i < THREADS; i++)
        CHECK(pthread_create(&t[i], NULL, thread_main, (void *)i) == 0);
    for (int i = 0; i < THREADS; i++)
        CHECK(pthread_join(t[i], NULL) == 0);
    drpttracer_exit();
    printf("mt: %d threads x 3 handles x %d windows traced\n", THREADS, WINDOWS);
    return 0;
}
