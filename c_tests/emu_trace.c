/* The emulated PT backend through the C API: trace a function with known control flow
 * (data-dependent branches, indirect calls, recursion, a libc call, a syscall) and check
 * the window's PT and sideband, the extended metadata, the refusal of kernel modes and
 * linear-mode overflow. The backend is forced with PTTRACER_BACKEND=emulated so the test
 * runs the same on machines with and without Intel PT. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"

static const uint8_t psb[16] = { 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82,
                                 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82 };

static __attribute__((noinline)) long leaf_a(long x) { return x + 1; }
static __attribute__((noinline)) long leaf_b(long x) { return x * 2; }
static __attribute__((noinline)) long leaf_c(long x) { return x - 3; }

static __attribute__((noinline)) long recurse(int depth)
{
    if (depth == 0)
        return 1;
    return recurse(depth - 1) + 1;
}

static long (*const volatile table[3])(long) = { leaf_a, leaf_b, leaf_c };

static __attribute__((noinline)) long known_flow(const long *data, int n)
{
    long s = 0;
    for (int i = 0; i < n; i++) {
        if (data[i] & 1)
            s += table[data[i] % 3](data[i]);
        else
            s += data[i];
    }
    s += recurse(5);
    s += (long)strlen("emulated");
    s += getppid() & 1;
    return s;
}

static __attribute__((noinline)) long long_loop(long n)
{
    volatile long s = 0;
    for (long i = 0; i < n; i++)
        s += i & 7;
    return s;
}

int main(void)
{
    setenv("PTTRACER_BACKEND", "emulated", 1);
    CHECK(drpttracer_init());

    /* Kernel modes cannot be emulated. */
    void *kh = NULL;
    CHECK_STATUS(drpttracer_create_handle(NULL, DRPTTRACER_TRACING_ONLY_KERNEL, 4, 4, &kh),
                 DRPTTRACER_ERROR_FAILED_TO_OPEN_PERF_EVENT);
    CHECK_MSG("kernel");

    void *h = NULL;
    CHECK_STATUS(drpttracer_create_handle(NULL, DRPTTRACER_TRACING_ONLY_USER, 6, 4, &h),
                 DRPTTRACER_SUCCESS);
    drpttracer_ext_metadata_t em;
    memset(&em, 0, sizeof(em));
    em.struct_size = sizeof(em);
    CHECK_STATUS(drpttracer_ext_get_metadata(h, &em), DRPTTRACER_SUCCESS);
    CHECK(em.backend == 1);
    CHECK(em.perf_type == 0);

    drpttracer_output_t *out = NULL;
    CHECK_STATUS(drpttracer_create_output(NULL, 6, 4, &out), DRPTTRACER_SUCCESS);

    const long data[] = { 4, 7, 1, 8, 9, 12, 15, 2, 3 };
    const int n = (int)(sizeof(data) / sizeof(data[0]));
    long expect = known_flow(data, n);

    CHECK_STATUS(drpttracer_start_tracing(NULL, h), DRPTTRACER_SUCCESS);
    long got = known_flow(data, n);
    CHECK_STATUS(drpttracer_stop_tracing(NULL, h, out), DRPTTRACER_SUCCESS);
    CHECK(got == expect);

    /* Non-empty PT that starts with a PSB, has its PSBEND right after, and ends with the
     * TIP.PGD (IP suppressed: a single 0x01 byte) that closes the window. */
    const uint8_t *pt = (const uint8_t *)out->pt_buffer;
    CHECK(out->pt_size > 64);
    CHECK(memcmp(pt, psb, sizeof(psb)) == 0);
    int psbend = 0;
    for (size_t i = 16; i + 1 < 64; i++)
        psbend |= pt[i] == 0x02 && pt[i + 1] == 0x23;
    CHECK(psbend);
    CHECK(pt[out->pt_size - 1] == 0x01);

    /* Sideband: perf records, the first one a synthesized MMAP2 (type 10). */
    CHECK(out->sideband_size >= 8);
    uint32_t type;
    memcpy(&type, out->sideband_buffer, sizeof(type));
    CHECK(type == 10);

    /* The handle is reusable; a second window gives a second trace. */
    size_t first_size = out->pt_size;
    CHECK_STATUS(drpttracer_start_tracing(NULL, h), DRPTTRACER_SUCCESS);
    got = known_flow(data, n);
    CHECK_STATUS(drpttracer_stop_tracing(NULL, h, out), DRPTTRACER_SUCCESS);
    CHECK(got == expect);
    CHECK(out->pt_size > 64 && memcmp(pt, psb, sizeof(psb)) == 0);
    (void)first_size;

    CHECK_STATUS(drpttracer_destroy_handle(NULL, h), DRPTTRACER_SUCCESS);

    /* A window longer than a 2-page ring: linear mode stops and reports the loss, and what
     * was captured is still a well-formed trace. */
    CHECK_STATUS(drpttracer_create_handle(NULL, DRPTTRACER_TRACING_ONLY_USER, 1, 4, &h),
                 DRPTTRACER_SUCCESS);
    CHECK_STATUS(drpttracer_start_tracing(NULL, h), DRPTTRACER_SUCCESS);
    long l = long_loop(20000);
    CHECK_STATUS(drpttracer_stop_tracing(NULL, h, out), DRPTTRACER_ERROR_OVERWRITTEN_PT_TRACE);
    CHECK(l == long_loop(20000));
    CHECK(out->pt_size > 0 && out->pt_size <= 2 * (size_t)sysconf(_SC_PAGESIZE));
    CHECK(memcmp(pt, psb, sizeof(psb)) == 0);
    CHECK(pt[out->pt_size - 1] == 0x01);
    CHECK_STATUS(drpttracer_destroy_handle(NULL, h), DRPTTRACER_SUCCESS);

    CHECK_STATUS(drpttracer_destroy_output(NULL, out), DRPTTRACER_SUCCESS);
    drpttracer_exit();
    printf("emu_trace: OK (pt %zu bytes)\n", first_size);
    return 0;
}
