/* A tiny JIT: writes `lea eax,[rdi+rdi+1]; ret` into an executable page, names it in
 * /tmp/perf-PID.map as perf's JIT interface asks, and calls it 1000 times.
 * `minijit jitdump`: names it in ./jit-PID.dump (perf's jitdump format: file header and
 * one JIT_CODE_LOAD record) instead.
 * `minijit unnamed`: names nothing, and writes 100 copies of the code 32 bytes apart,
 * calling each 10 times. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static int write_jitdump(const unsigned char *code, size_t size, const char *name)
{
    char path[64];
    snprintf(path, sizeof path, "jit-%d.dump", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return -1;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    struct {
        uint32_t magic, version, total_size, elf_mach, pad1, pid;
        uint64_t timestamp, flags;
    } __attribute__((packed)) head = {0x4A695444, 1, 40, 62, 0, (uint32_t)getpid(), now, 0};
    size_t name_len = strlen(name) + 1;
    struct {
        uint32_t id, total_size;
        uint64_t timestamp;
        uint32_t pid, tid;
        uint64_t vma, code_addr, code_size, code_index;
    } __attribute__((packed)) load = {0, (uint32_t)(56 + name_len + size), now,
                                      (uint32_t)getpid(), (uint32_t)getpid(),
                                      (uint64_t)(uintptr_t)code, (uint64_t)(uintptr_t)code,
                                      size, 0};
    int ok = fwrite(&head, sizeof head, 1, f) == 1 && fwrite(&load, sizeof load, 1, f) == 1 &&
             fwrite(name, name_len, 1, f) == 1 && fwrite(code, size, 1, f) == 1;
    return fclose(f) == 0 && ok ? 0 : -1;
}

int main(int argc, char **argv)
{
    static const unsigned char code[] = {0x8d, 0x44, 0x3f, 0x01, 0xc3};
    unsigned char *page =
        mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED)
        return 1;
    memcpy(page + 64, code, sizeof code);
    if (argc > 1 && strcmp(argv[1], "unnamed") == 0) {
        long sum = 0;
        for (int k = 0; k < 100; k++)
            memcpy(page + 512 + 32 * k, code, sizeof code);
        for (int k = 0; k < 100; k++)
            for (int i = 0; i < 10; i++)
                sum += ((int (*)(int))(void *)(page + 512 + 32 * k))(i);
        printf("%ld\n", sum);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "jitdump") == 0) {
        if (write_jitdump(page + 64, sizeof code, "jitted double (2x+1) via jitdump") != 0)
            return 3;
    } else {
        char path[64];
        snprintf(path, sizeof path, "/tmp/perf-%d.map", (int)getpid());
        FILE *map = fopen(path, "w");
        if (map == NULL)
            return 2;
        fprintf(map, "%lx %zx jitted double (2x+1)\n", (unsigned long)(page + 64), sizeof code);
        fclose(map);
    }
    int (*f)(int) = (int (*)(int))(void *)(page + 64);
    long sum = 0;
    for (int i = 0; i < 1000; i++)
        sum += f(i);
    printf("%ld\n", sum);
    return 0;
}
