/* Branches with known counts for `pttrace profile --format bolt`. count_loop(n) is
 * assembly so that its branches are at labels: it loops n times; each iteration's
 * skip_branch is taken unless a counter reaching 3 resets it (taken 2 iterations in 3),
 * and back_branch jumps back to loop_head on every iteration but the last. */
#include <stdio.h>
#include <stdlib.h>

int count_loop(int n);

__asm__(".text\n"
        ".globl count_loop\n"
        ".type count_loop, @function\n"
        "count_loop:\n"
        "  xor %ecx, %ecx\n"
        "  xor %edx, %edx\n"
        ".globl loop_head\n"
        "loop_head:\n"
        "  add $1, %edx\n"
        "  cmp $3, %edx\n"
        ".globl skip_branch\n"
        "skip_branch:\n"
        "  jne skip_target\n"
        "  xor %edx, %edx\n"
        ".globl skip_target\n"
        "skip_target:\n"
        "  add $1, %ecx\n"
        "  cmp %edi, %ecx\n"
        ".globl back_branch\n"
        "back_branch:\n"
        "  jb loop_head\n"
        ".globl loop_exit\n"
        "loop_exit:\n"
        "  mov %ecx, %eax\n"
        "  ret\n"
        ".size count_loop, .-count_loop\n");

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 3000;
    printf("%d\n", count_loop(n));
    return 0;
}
