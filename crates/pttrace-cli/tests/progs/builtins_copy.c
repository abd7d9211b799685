/* Runs code from a copy, as V8 runs its embedded builtins ("short builtin calls"): the
 * code between v8_Default_embedded_blob_code_ and + v8_Default_embedded_blob_code_size_
 * is copied to a fresh anonymous page and called there, 1000 times
 * Builtins_SumSquares(i, 3), which calls Builtins_Square three times.
 * Prints the sum of the results. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

__asm__(".text\n"
        ".p2align 12\n"
        ".globl v8_Default_embedded_blob_code_\n"
        "v8_Default_embedded_blob_code_:\n"
        /* A page of padding first: the called code sits on the copy's second page. */
        ".fill 4096, 1, 0xcc\n"
        ".globl Builtins_Square\n"
        ".type Builtins_Square, @function\n"
        "Builtins_Square:\n"
        "  movl %edi, %eax\n"
        "  imull %edi, %eax\n"
        "  addl $0x12345, %eax\n"
        "  subl $0x12345, %eax\n"
        "  ret\n"
        ".size Builtins_Square, .-Builtins_Square\n"
        /* SumSquares(x, n): x*x + (x+1)*(x+1) + ... n terms. */
        ".globl Builtins_SumSquares\n"
        ".type Builtins_SumSquares, @function\n"
        "Builtins_SumSquares:\n"
        "  pushq %rbx\n"
        "  pushq %r12\n"
        "  pushq %r13\n"
        "  movl %edi, %ebx\n"
        "  movl %esi, %r12d\n"
        "  xorl %r13d, %r13d\n"
        "1:\n"
        "  movl %ebx, %edi\n"
        "  call Builtins_Square\n"
        "  addl %eax, %r13d\n"
        "  incl %ebx\n"
        "  decl %r12d\n"
        "  jnz 1b\n"
        "  movl %r13d, %eax\n"
        "  popq %r13\n"
        "  popq %r12\n"
        "  popq %rbx\n"
        "  ret\n"
        ".size Builtins_SumSquares, .-Builtins_SumSquares\n"
        "v8_blob_end:\n"
        ".section .rodata\n"
        ".p2align 2\n"
        ".globl v8_Default_embedded_blob_code_size_\n"
        "v8_Default_embedded_blob_code_size_:\n"
        "  .long v8_blob_end - v8_Default_embedded_blob_code_\n"
        ".text\n");

extern const unsigned char v8_Default_embedded_blob_code_[];
extern const uint32_t v8_Default_embedded_blob_code_size_;
int Builtins_SumSquares(int x, int n);

int main(void)
{
    size_t size = v8_Default_embedded_blob_code_size_;
    unsigned char *copy =
        mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (copy == MAP_FAILED)
        return 1;
    memcpy(copy, v8_Default_embedded_blob_code_, size);
    if (mprotect(copy, size, PROT_READ | PROT_EXEC) != 0)
        return 2;
    int (*sum_squares)(int, int) =
        (int (*)(int, int))(copy + ((const unsigned char *)Builtins_SumSquares -
                                    v8_Default_embedded_blob_code_));
    long total = 0;
    for (int i = 0; i < 1000; i++)
        total += sum_squares(i, 3);
    printf("%ld\n", total);
    return 0;
}
