/* Loads libm after the shim started (a mapping the info file does not list), prints the
 * address of cos, then calls it: its code must decode through the window sideband. */
#include <dlfcn.h>
#include <stdio.h>

int main(void) {
    void *h = dlopen("libm.so.6", RTLD_NOW);
    if (!h)
        return 2;
    double (*f)(double) = (double (*)(double))dlsym(h, "cos");
    if (!f)
        return 3;
    printf("%p\n", (void *)f);
    fflush(stdout);
    volatile double x = f(0.5);
    return x > 2.0;
}
