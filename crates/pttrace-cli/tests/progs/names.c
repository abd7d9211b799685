/* Names test: an always_inline function inlined into its caller, a static helper that is
 * not inlined, and a loop whose lines are known. Built -O2 -g, its debug info split off. */
#include <stdio.h>

static volatile long sink;

static inline __attribute__((always_inline)) long mix(long x)
{
    return (x * 2654435761L) ^ (x >> 3); /* MIX_LINE */
}

static __attribute__((noinline)) long helper(long n)
{
    long acc = 0;
    for (long i = 0; i < n; i++)
        acc += mix(i + acc); /* HELPER_LOOP */
    return acc;
}

__attribute__((noinline)) long outer(long n)
{
    return helper(n) + mix(n);
}

int main(int argc, char **argv)
{
    (void)argv;
    sink = outer(1000 + argc);
    printf("%ld\n", (long)sink);
    return 0;
}
