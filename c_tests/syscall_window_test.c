/* Modelled on how DynamoRIO's drpttracer test client traces syscalls: each thread owns a
 * kernel-mode handle; the PT window opens right before a syscall and closes right after
 * it; the output holds the kernel's PT and no sideband.
 *
 * Needs Intel PT hardware and kernel tracing rights. Without them it asserts the clean
 * failure (status + message) and exits with SKIP (ctest code 77), printing why. */
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "test_util.h"

#define SYSCALLS 16

static int
trace_syscalls(void)
{
    void *h = NULL;
    drpttracer_output_t *out = NULL;
    drpttracer_status_t st =
        drpttracer_create_handle(NULL, DRPTTRACER_TRACING_ONLY_KERNEL, 8, 2, &h);
    if (st != DRPTTRACER_SUCCESS) {
        const char *msg = drpttracer_ext_last_error();
        /* The clean failure: a perf-open status, no handle, and an actionable reason. */
        CHECK(st == DRPTTRACER_ERROR_FAILED_TO_OPEN_PERF_EVENT);
        CHECK(h == NULL);
        CHECK(strstr(msg, "intel_pt") != NULL || strstr(msg, "perf_event_paranoid") != NULL);
        printf("SKIP: kernel-mode PT unavailable here: %s\n", msg);
        return TEST_SKIP_CODE;
    }
    CHECK_STATUS(drpttracer_create_output(NULL, 8, 0, &out), DRPTTRACER_SUCCESS);
    for (int i = 0; i < SYSCALLS; i++) {
        CHECK_STATUS(drpttracer_start_tracing(NULL, h), DRPTTRACER_SUCCESS);
        long r = syscall(SYS_getppid);
        drpttracer_status_t s = drpttracer_stop_tracing(NULL, h, out);
        CHECK(r > 0);
        CHECK(s == DRPTTRACER_SUCCESS || s == DRPTTRACER_ERROR_OVERWRITTEN_PT_TRACE);
        CHECK(out->pt_size > 0);
        CHECK(out->sideband_size == 0);
        /* A PT stream of a kernel window starts with a PSB (02 82 x8). */
        CHECK(((unsigned char *)out->pt_buffer)[0] == 0x02);
    }
    CHECK_STATUS(drpttracer_destroy_output(NULL, out), DRPTTRACER_SUCCESS);
    CHECK_STATUS(drpttracer_destroy_handle(NULL, h), DRPTTRACER_SUCCESS);
    return 0;
}

static void *
thread_main(void *arg)
{
    (void)arg;
    return (void *)(long)trace_syscalls();
}

int
main(void)
{
    CHECK(drpttracer_init());
    int rc = trace_syscalls();
    if (rc == 0) {
        pthread_t t;
        void *trc;
        CHECK(pthread_create(&t, NULL, thread_main, NULL) == 0);
        CHECK(pthread_join(t, &trc) == 0);
        CHECK(trc == NULL);
        printf("syscall windows: %d per thread on 2 threads traced\n", SYSCALLS);
    }
    drpttracer_exit();
    return rc;
}
