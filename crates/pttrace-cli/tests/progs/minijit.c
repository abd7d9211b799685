/* A tiny JIT: writes `lea eax,[rdi+rdi+1]; ret` into an executable page, names it in
 * /tmp/perf-PID.map as perf's JIT interface asks, and calls it 1000 times. */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int main(void)
{
    static const unsigned char code[] = {0x8d, 0x44, 0x3f, 0x01, 0xc3};
    unsigned char *page =
        mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED)
        return 1;
    memcpy(page + 64, code, sizeof code);
    char path[64];
    snprintf(path, sizeof path, "/tmp/perf-%d.map", (int)getpid());
    FILE *map = fopen(path, "w");
    if (map == NULL)
        return 2;
    fprintf(map, "%lx %zx jitted double (2x+1)\n", (unsigned long)(page + 64), sizeof code);
    fclose(map);
    int (*f)(int) = (int (*)(int))(void *)(page + 64);
    long sum = 0;
    for (int i = 0; i < 1000; i++)
        sum += f(i);
    printf("%ld\n", sum);
    return 0;
}
