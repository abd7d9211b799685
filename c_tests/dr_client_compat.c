/* Written the way a DynamoRIO client uses drpttracer.h (its types: uint, bool, size_t,
 * drpttracer_output_t, pt_metadata_t, both enums), with no DynamoRIO headers: it must
 * compile unchanged as C and as C++ and link against libdrpttracer. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "drpttracer.h"

typedef struct {
    void *tracer;
    drpttracer_output_t *output;
    pt_metadata_t metadata;
} per_thread_t;

static const uint PT_SHIFT = 8;
static const uint SIDEBAND_SHIFT = 4;

static bool
thread_init(void *drcontext, per_thread_t *pt, drpttracer_tracing_mode_t mode)
{
    drpttracer_status_t st =
        drpttracer_create_handle(drcontext, mode, PT_SHIFT, SIDEBAND_SHIFT, &pt->tracer);
    if (st != DRPTTRACER_SUCCESS)
        return false;
    size_t sd_shift = mode == DRPTTRACER_TRACING_ONLY_KERNEL ? 0 : SIDEBAND_SHIFT;
    if (drpttracer_create_output(drcontext, PT_SHIFT, sd_shift, &pt->output) !=
        DRPTTRACER_SUCCESS)
        return false;
    return drpttracer_get_pt_metadata(pt->tracer, &pt->metadata) == DRPTTRACER_SUCCESS;
}

int
main(void)
{
    void *drcontext = NULL;
    per_thread_t pt;
    memset(&pt, 0, sizeof(pt));
    if (!drpttracer_init())
        return 1;
    bool ok = thread_init(drcontext, &pt, DRPTTRACER_TRACING_ONLY_USER);
    printf("dr client compat: user-mode handle %s (family %u)\n", ok ? "created" : "refused",
           (uint)pt.metadata.cpu_family);
    if (pt.output != NULL)
        drpttracer_destroy_output(drcontext, pt.output);
    if (pt.tracer != NULL)
        drpttracer_destroy_handle(drcontext, pt.tracer);
    drpttracer_exit();
    return ok ? 0 : 1;
}
