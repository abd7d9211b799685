/* Misuse from C: every invalid call returns a clean status with a message, never a crash.
 * NULLs, pointers the library never handed out, a handle used from a foreign thread,
 * double destroy, bad shifts and modes, and calls out of order. */
#include <pthread.h>
#include <stdint.h>

#include "test_util.h"

static void *g_handle;
static drpttracer_output_t *g_output;

static void *
foreign_thread(void *arg)
{
    (void)arg;
    pt_metadata_t m;
    CHECK_STATUS(drpttracer_start_tracing(NULL, g_handle), DRPTTRACER_ERROR_INVALID_PARAMETER);
    CHECK_MSG("belongs to thread");
    CHECK_STATUS(drpttracer_stop_tracing(NULL, g_handle, g_output),
                 DRPTTRACER_ERROR_INVALID_PARAMETER);
    CHECK_STATUS(drpttracer_get_pt_metadata(g_handle, &m), DRPTTRACER_ERROR_INVALID_PARAMETER);
    CHECK_STATUS(drpttracer_destroy_handle(NULL, g_handle), DRPTTRACER_ERROR_INVALID_PARAMETER);
    CHECK_MSG("per thread");
    return NULL;
}

int
main(void)
{
    void *h = NULL;
    drpttracer_output_t *out = NULL;
    pt_metadata_t meta;
    int on_stack = 0;
    void *bogus[] = { &on_stack, (void *)(uintptr_t)1, (void *)(uintptr_t)0xdeadbeef000ull };

    /* Before init. */
    CHECK_STATUS(drpttracer_create_handle(NULL, DRPTTRACER_TRACING_ONLY_USER, 4, 4, &h),
                 DRPTTRACER_ERROR);
    CHECK_MSG("drpttracer_init");

    CHECK(drpttracer_init());

    /* create_handle: NULL out pointer, zero shifts, unknown mode. */
    CHECK_STATUS(drpttracer_create_handle(NULL, DRPTTRACER_TRACING_ONLY_USER, 4, 4, NULL),
                 DRPTTRACER_ERROR_INVALID_PARAMETER);
    CHECK_MSG("NULL");
    CHECK_STATUS(drpttracer_create_handle(NULL, DRPTTRACER_TRACING_ONLY_USER, 0, 4, &h),
                 DRPTTRACER_ERROR_INVALID_PARAMETER);
    CHECK_MSG("pt_size_shift=0");
    CHECK_STATUS(drpttracer_create_handle(NULL, DRPTTRACER_TRACING_ONLY_USER, 4, 0, &h),
                 DRPTTRACER_ERROR_INVALID_PARAMETER);
    CHECK_MSG("sideband_size_shift=0");
    CHECK_STATUS(drpttracer_create_handle(NULL, DRPTTRACER_TRACING_ONLY_USER, 99, 4, &h),
                 DRPTTRACER_ERROR_INVALID_PARAMETER);
    CHECK_STATUS(drpttracer_create_handle(NULL, (drpttracer_tracing_mode_t)7, 4, 4, &h),
                 DRPTTRACER_ERROR_INVALID_PARAMETER);
    CHECK_MSG("tracing_mode=7");
    CHECK(h == NULL);

    /* Every handle-taking call with NULL and with pointers never handed out. */
    CHECK_STATUS(drpttracer_start_tracing(NULL, NULL), DRPTTRACER_ERROR_INVALID_PARAMETER);
    CHECK_STATUS(drpttracer_destroy_handle(NULL, NULL), DRPTTRACER_ERROR_INVALID_PARAMETER);
    CHECK_STATUS(drpttracer_get_pt_metadata(NULL, &meta), DRPTTRACER_ERROR_INVALID_PARAMETER);
    for (size_t i = 0; i < sizeof(bogus) / sizeof(bogus[0]); i++) {
        CHECK_STATUS(drpttracer_start_tracing(NULL, bogus[i]),
                     DRPTTRACER_ERROR_INVALID_PARAMETER);
        CHECK_MSG("not a live handle");
        CHECK_STATUS(drpttracer_stop_tracing(NULL, bogus[i], NULL),
                     DRPTTRACER_ERROR_INVALID_PARAMETER);
        CHECK_STATUS(drpttracer_destroy_handle(NULL, bogus[i]),
                     DRPTTRACER_ERROR_INVALID_PARAMETER);
        CHECK_STATUS(drpttracer_get_pt_metadata(bogus[i], &meta),
                     DRPTTRACER_ERROR_INVALID_PARAMETER);
        CHECK_STATUS(drpttracer_destroy_output(NULL, (drpttracer_output_t *)bogus[i]),
                     DRPTTRACER_ERROR_INVALID_PARAMETER);
        CHECK_MSG("not made by drpttracer_create_output");
    }

    /* Outputs. */
    CHECK_STATUS(drpttracer_create_output(NULL, 4, 2, NULL), DRPTTRACER_ERROR_INVALID_PARAMETER);
    CHECK_STATUS(drpttracer_create_output(NULL, 0, 2, &out), DRPTTRACER_ERROR_INVALID_PARAMETER);
    CHECK_MSG("pt_buf_size_shift=0");
    CHECK_STATUS(drpttracer_destroy_output(NULL, NULL), DRPTTRACER_ERROR_INVALID_PARAMETER);
    CHECK_STATUS(drpttracer_create_output(NULL, 4, 0, &out), DRPTTRACER_SUCCESS);
    CHECK(out->pt_buffer != NULL && out->pt_buffer_size == 16 * 4096);
    CHECK(out->sideband_buffer == NULL && out->sideband_buffer_size == 0);
    CHECK_STATUS(drpttracer_destroy_output(NULL, out), DRPTTRACER_SUCCESS);
    CHECK_STATUS(drpttracer_destroy_output(NULL, out), DRPTTRACER_ERROR_INVALID_PARAMETER);
    CHECK_STATUS(drpttracer_create_output(NULL, 4, 2, &out), DRPTTRACER_SUCCESS);
    CHECK(out->sideband_buffer != NULL && out->sideband_buffer_size == 5 * 4096);

    /* A real handle (user mode works everywhere: hardware or emulated backend). */
    CHECK_STATUS(drpttracer_create_handle(NULL, DRPTTRACER_TRACING_ONLY_USER, 6, 4, &h),
                 DRPTTRACER_SUCCESS);
    CHECK(h != NULL);
    CHECK_STATUS(drpttracer_get_pt_metadata(h, NULL), DRPTTRACER_ERROR_INVALID_PARAMETER);
    CHECK_STATUS(drpttracer_stop_tracing(NULL, h, out), DRPTTRACER_ERROR_FAILED_TO_STOP_TRACING);
    CHECK_MSG("not tracing");
    CHECK_STATUS(drpttracer_start_tracing(NULL, h), DRPTTRACER_SUCCESS);
    CHECK_STATUS(drpttracer_start_tracing(NULL, h), DRPTTRACER_ERROR_FAILED_TO_START_TRACING);
    CHECK_STATUS(drpttracer_stop_tracing(NULL, h, NULL), DRPTTRACER_ERROR_INVALID_PARAMETER);
    CHECK_STATUS(drpttracer_stop_tracing(NULL, h, out), DRPTTRACER_SUCCESS);
    CHECK(out->pt_size > 0);

    /* Foreign thread. */
    g_handle = h;
    g_output = out;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, foreign_thread, NULL) == 0);
    CHECK(pthread_join(t, NULL) == 0);

    /* Double destroy. */
    CHECK_STATUS(drpttracer_destroy_handle(NULL, h), DRPTTRACER_SUCCESS);
    CHECK_STATUS(drpttracer_destroy_handle(NULL, h), DRPTTRACER_ERROR_INVALID_PARAMETER);
    CHECK_MSG("already destroyed");
    CHECK_STATUS(drpttracer_start_tracing(NULL, h), DRPTTRACER_ERROR_INVALID_PARAMETER);

    CHECK_STATUS(drpttracer_destroy_output(NULL, out), DRPTTRACER_SUCCESS);
    drpttracer_exit();
    drpttracer_exit(); /* unbalanced exit is harmless */
    printf("misuse: all invalid calls returned clean statuses with messages\n");
    return 0;
}
