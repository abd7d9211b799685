/* No call of the C API registers a thread-local destructor.
 *
 * DynamoRIO loads its clients' libraries with a private loader under which glibc's
 * __cxa_thread_atexit_impl (what a C++ thread_local or a Rust thread_local! with a
 * destructor registers through) dereferences NULL. This program defines that function
 * itself: the library's weak reference binds to this definition, which counts every call
 * and forwards it. Every API function then runs, successes and failures, on 8 threads that
 * also exit with a live handle (the library's own clean-up of such handles must not
 * register one either), with the emulated backend (PTTRACER_BACKEND=auto without PT). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>

#include "test_util.h"

#define THREADS 8

static atomic_int registrations;

typedef int (*atexit_impl_t)(void (*)(void *), void *, void *);

int
__cxa_thread_atexit_impl(void (*dtor)(void *), void *obj, void *dso)
{
    atomic_fetch_add(&registrations, 1);
    atexit_impl_t next = (atexit_impl_t)dlsym(RTLD_NEXT, "__cxa_thread_atexit_impl");
    return next != NULL ? next(dtor, obj, dso) : 0;
}

static volatile unsigned long sink;

static void *
thread_main(void *arg)
{
    (void)arg;
    void *h = NULL;
    drpttracer_output_t *out = NULL;
    pt_metadata_t m;
    drpttracer_ext_metadata_t em = { .struct_size = sizeof(em) };
    /* Failures first: they write this thread's last-error message. */
    CHECK_STATUS(drpttracer_create_handle(NULL, DRPTTRACER_TRACING_ONLY_USER, 0, 4, &h),
                 DRPTTRACER_ERROR_INVALID_PARAMETER);
    CHECK_MSG("pt_size_shift=0");
    CHECK_STATUS(drpttracer_create_output(NULL, 0, 4, &out),
                 DRPTTRACER_ERROR_INVALID_PARAMETER);
    CHECK_STATUS(drpttracer_start_tracing(NULL, NULL), DRPTTRACER_ERROR_INVALID_PARAMETER);
    CHECK_STATUS(drpttracer_destroy_output(NULL, NULL), DRPTTRACER_ERROR_INVALID_PARAMETER);
    /* Then a full round. */
    CHECK_STATUS(drpttracer_create_handle(NULL, DRPTTRACER_TRACING_ONLY_USER, 6, 4, &h),
                 DRPTTRACER_SUCCESS);
    CHECK_STATUS(drpttracer_create_output(NULL, 6, 4, &out), DRPTTRACER_SUCCESS);
    CHECK_STATUS(drpttracer_get_pt_metadata(h, &m), DRPTTRACER_SUCCESS);
    CHECK_STATUS(drpttracer_ext_get_metadata(h, &em), DRPTTRACER_SUCCESS);
    for (int w = 0; w < 3; w++) {
        CHECK_STATUS(drpttracer_start_tracing(NULL, h), DRPTTRACER_SUCCESS);
        for (int i = 0; i < 100; i++)
            sink += (unsigned long)i * 3;
        CHECK_STATUS(drpttracer_stop_tracing(NULL, h, out), DRPTTRACER_SUCCESS);
        CHECK(out->pt_size > 0);
    }
    CHECK_STATUS(drpttracer_destroy_output(NULL, out), DRPTTRACER_SUCCESS);
    CHECK_STATUS(drpttracer_destroy_handle(NULL, h), DRPTTRACER_SUCCESS);
    /* A second handle is left alive: the library destroys it when the thread exits. */
    CHECK_STATUS(drpttracer_create_handle(NULL, DRPTTRACER_TRACING_ONLY_USER, 4, 4, &h),
                 DRPTTRACER_SUCCESS);
    return NULL;
}

int
main(void)
{
    pthread_t t[THREADS];
    CHECK(drpttracer_init());
    for (long i = 0; i < THREADS; i++)
        CHECK(pthread_create(&t[i], NULL, thread_main, NULL) == 0);
    for (int i = 0; i < THREADS; i++)
        CHECK(pthread_join(t[i], NULL) == 0);
    size_t vdso_size = 0, maps_size = 0;
    uint64_t vdso_addr = 0;
    CHECK_STATUS(drpttracer_ext_get_vdso(NULL, 0, &vdso_size, &vdso_addr),
                 DRPTTRACER_ERROR_INVALID_PARAMETER);
    CHECK_STATUS(drpttracer_ext_synthesize_mappings(NULL, 0, &maps_size),
                 DRPTTRACER_ERROR_INVALID_PARAMETER);
    drpttracer_exit();
    int n = atomic_load(&registrations);
    printf("no_tls_destructor: %d threads, every API function: %d thread-local destructor "
           "registrations\n",
           THREADS, n);
    CHECK(n == 0);
    return 0;
}
