/* Minimal assertion helpers for the C tests: every failure names the file, line and the
 * library's last error message. */
#ifndef DRPTTRACER_TEST_UTIL_H
#define DRPTTRACER_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drpttracer.h"

/* ctest SKIP_RETURN_CODE */
#define TEST_SKIP_CODE 77

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__,  \
                    __LINE__, #cond, drpttracer_ext_last_error());                    \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

#define CHECK_STATUS(call, expected)                                                  \
    do {                                                                              \
        drpttracer_status_t s_ = (call);                                              \
        if (s_ != (expected)) {                                                       \
            fprintf(stderr, "%s:%d: %s returned %d, expected %s=%d (last error: %s)\n", \
                    __FILE__, __LINE__, #call, (int)s_, #expected, (int)(expected),   \
                    drpttracer_ext_last_error());                                     \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

/* The last error message contains `needle`. */
#define CHECK_MSG(needle)                                                             \
    do {                                                                              \
        const char *m_ = drpttracer_ext_last_error();                                 \
        if (m_ == NULL || strstr(m_, (needle)) == NULL) {                             \
            fprintf(stderr, "%s:%d: last error \"%s\" does not mention \"%s\"\n",     \
                    __FILE__, __LINE__, m_ ? m_ : "(null)", (needle));                \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

#endif
