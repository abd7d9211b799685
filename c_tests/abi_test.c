/* ABI test: the header's layouts and enum values are DynamoRIO's, byte for byte.
 * Compiled as C and as C++ (abi_test_cxx). */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "drpttracer.h"

#ifdef __cplusplus
#define STATIC_CHECK(c) static_assert(c, #c)
#else
#define STATIC_CHECK(c) _Static_assert(c, #c)
#endif

STATIC_CHECK(sizeof(pt_metadata_t) == 18);
STATIC_CHECK(offsetof(pt_metadata_t, cpu_family) == 0);
STATIC_CHECK(offsetof(pt_metadata_t, cpu_model) == 2);
STATIC_CHECK(offsetof(pt_metadata_t, cpu_stepping) == 3);
STATIC_CHECK(offsetof(pt_metadata_t, time_shift) == 4);
STATIC_CHECK(offsetof(pt_metadata_t, time_mult) == 6);
STATIC_CHECK(offsetof(pt_metadata_t, time_zero) == 10);

STATIC_CHECK(sizeof(drpttracer_output_t) == 48);
STATIC_CHECK(offsetof(drpttracer_output_t, pt_buffer) == 0);
STATIC_CHECK(offsetof(drpttracer_output_t, pt_buffer_size) == 8);
STATIC_CHECK(offsetof(drpttracer_output_t, pt_size) == 16);
STATIC_CHECK(offsetof(drpttracer_output_t, sideband_buffer) == 24);
STATIC_CHECK(offsetof(drpttracer_output_t, sideband_buffer_size) == 32);
STATIC_CHECK(offsetof(drpttracer_output_t, sideband_size) == 40);

STATIC_CHECK(sizeof(drpttracer_status_t) == sizeof(int));
STATIC_CHECK(sizeof(drpttracer_tracing_mode_t) == sizeof(int));

STATIC_CHECK(DRPTTRACER_SUCCESS == 0);
STATIC_CHECK(DRPTTRACER_ERROR == 1);
STATIC_CHECK(DRPTTRACER_ERROR_INVALID_PARAMETER == 2);
STATIC_CHECK(DRPTTRACER_ERROR_FAILED_TO_OPEN_PERF_EVENT == 3);
STATIC_CHECK(DRPTTRACER_ERROR_FAILED_TO_MMAP_PERF_DATA == 4);
STATIC_CHECK(DRPTTRACER_ERROR_FAILED_TO_MMAP_PT_DATA == 5);
STATIC_CHECK(DRPTTRACER_ERROR_FAILED_TO_ALLOCATE_OUTPUT_BUFFER == 6);
STATIC_CHECK(DRPTTRACER_ERROR_FAILED_TO_START_TRACING == 7);
STATIC_CHECK(DRPTTRACER_ERROR_FAILED_TO_STOP_TRACING == 8);
STATIC_CHECK(DRPTTRACER_ERROR_OVERWRITTEN_PT_TRACE == 9);
STATIC_CHECK(DRPTTRACER_ERROR_FAILED_TO_READ_PT_DATA == 10);
STATIC_CHECK(DRPTTRACER_ERROR_OVERWRITTEN_SIDEBAND_DATA == 11);
STATIC_CHECK(DRPTTRACER_ERROR_FAILED_TO_READ_SIDEBANBD_DATA == 12);

STATIC_CHECK(DRPTTRACER_TRACING_ONLY_USER == 0);
STATIC_CHECK(DRPTTRACER_TRACING_ONLY_KERNEL == 1);
STATIC_CHECK(DRPTTRACER_TRACING_USER_AND_KERNEL == 2);

int
main(void)
{
    /* The packed layout at run time: fields land at DynamoRIO's byte offsets. */
    pt_metadata_t m;
    unsigned char *b = (unsigned char *)&m;
    memset(&m, 0, sizeof(m));
    m.cpu_family = 0x0106;
    m.cpu_model = 0x55;
    m.cpu_stepping = 7;
    m.time_shift = 31;
    m.time_mult = 0x11223344u;
    m.time_zero = 0x0102030405060708ull;
    static const unsigned char expect[18] = { 0x06, 0x01, 0x55, 7,    31,   0,
                                              0x44, 0x33, 0x22, 0x11, 8,    7,
                                              6,    5,    4,    3,    2,    1 };
    if (memcmp(b, expect, 18) != 0) {
        fprintf(stderr, "pt_metadata_t byte layout differs from DynamoRIO's\n");
        return 1;
    }
    printf("abi: pt_metadata_t=%zu drpttracer_output_t=%zu, 13 status and 3 mode values OK\n",
           sizeof(pt_metadata_t), sizeof(drpttracer_output_t));
    return 0;
}
