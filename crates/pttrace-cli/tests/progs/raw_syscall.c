/* Issues getppid (110) through inline-asm `syscall` instructions, bypassing libc,
 * with distinctive values in every argument register. */
#include <stdio.h>

static long raw6(long nr, long a1, long a2, long a3, long a4, long a5, long a6) {
    long ret;
    register long r10 __asm__("r10") = a4;
    register long r8 __asm__("r8") = a5;
    register long r9 __asm__("r9") = a6;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(nr), "D"(a1), "S"(a2), "d"(a3), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return ret;
}

int main(void) {
    long first = raw6(110, 0, 0, 0, 0, 0, 0);
    for (int i = 1; i < 100; i++) {
        long r = raw6(110, 0x1111 + i, 0x2222, 0x3333, 0x4444, 0x5555, 0x6666);
        if (r != first) {
            printf("raw getppid returned %ld, expected %ld\n", r, first);
            return 1;
        }
    }
    printf("raw syscalls ok ppid=%ld\n", first);
    return 0;
}
