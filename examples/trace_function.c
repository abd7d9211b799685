/* Example: trace one function of this program in user mode through the drpttracer C API
 * and save the window as files `pttrace decode` reads.
 *
 *   cc -o trace_function examples/trace_function.c -Iinclude -Ltarget/release \
 *      -Wl,-rpath,$PWD/target/release -ldrpttracer
 *   ./trace_function /tmp/window   # writes /tmp/window.pt, .sideband, .meta
 *
 * Without Intel PT, drpttracer_init() returns false (as DynamoRIO's library) unless a
 * software backend is asked for: PTTRACER_BACKEND=auto ./trace_function /tmp/window
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drpttracer.h"

static int __attribute__((noinline)) collatz_steps(unsigned long n)
{
    int steps = 0;
    while (n != 1) {
        n = (n & 1) ? 3 * n + 1 : n / 2;
        steps++;
    }
    return steps;
}

static int
save(const char *prefix, const char *ext, const void *data, size_t len)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s.%s", prefix, ext);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(data, 1, len, f) != len) {
        perror(path);
        return -1;
    }
    fclose(f);
    printf("  %-40s %zu bytes\n", path, len);
    return 0;
}

int
main(int argc, char **argv)
{
    const char *prefix = argc > 1 ? argv[1] : "window";
    void *tracer = NULL;
    drpttracer_output_t *out = NULL;
    pt_metadata_t meta;
    drpttracer_ext_metadata_t ext;

    if (!drpttracer_init()) {
        fprintf(stderr, "drpttracer: %s\n", drpttracer_ext_last_error());
        return 1;
    }
    if (drpttracer_create_handle(NULL, DRPTTRACER_TRACING_ONLY_USER, 8, 6, &tracer) !=
            DRPTTRACER_SUCCESS ||
        drpttracer_create_output(NULL, 8, 6, &out) != DRPTTRACER_SUCCESS) {
        fprintf(stderr, "drpttracer: %s\n", drpttracer_ext_last_error());
        return 1;
    }
    drpttracer_get_pt_metadata(tracer, &meta);
    memset(&ext, 0, sizeof(ext));
    ext.struct_size = sizeof(ext);
    drpttracer_ext_get_metadata(tracer, &ext);

    drpttracer_start_tracing(NULL, tracer);
    int steps = collatz_steps(27);
    drpttracer_status_t st = drpttracer_stop_tracing(NULL, tracer, out);
    if (st != DRPTTRACER_SUCCESS)
        fprintf(stderr, "stop_tracing: %d: %s\n", (int)st, drpttracer_ext_last_error());

    printf("collatz(27) = %d steps, traced with the %s backend (cpu %u/%u/%u):\n", steps,
           ext.backend == 0 ? "hardware" : "emulated", (unsigned)meta.cpu_family,
           (unsigned)meta.cpu_model, (unsigned)meta.cpu_stepping);
    int rc = save(prefix, "pt", out->pt_buffer, out->pt_size) ||
        save(prefix, "sideband", out->sideband_buffer, out->sideband_size) ||
        save(prefix, "meta", &meta, sizeof(meta));
    drpttracer_destroy_output(NULL, out);
    drpttracer_destroy_handle(NULL, tracer);
    drpttracer_exit();
    return rc == 0 && st == DRPTTRACER_SUCCESS ? 0 : 1;
}
