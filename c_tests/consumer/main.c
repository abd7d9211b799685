/* Links through find_package(drpttracer): init, one output, exit. */
#include <stdio.h>

#include <drpttracer.h>

int
main(void)
{
    drpttracer_output_t *out = NULL;
    if (!drpttracer_init())
        return 1;
    if (drpttracer_create_output(NULL, 2, 1, &out) != DRPTTRACER_SUCCESS)
        return 2;
    int ok = out->pt_buffer_size == 4 * 4096 && out->sideband_buffer_size == 3 * 4096;
    drpttracer_destroy_output(NULL, out);
    drpttracer_exit();
    printf("consumer: linked via find_package, output sizes %s\n", ok ? "ok" : "WRONG");
    return ok ? 0 : 3;
}
