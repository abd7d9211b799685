/* Syscall sites of the forms the shim patches into stubs, exercised before and after the
 * patch: `mov $nr,%eax; syscall` (5-byte mov), `mov $nr,%rax; syscall` (7-byte mov), a
 * jump straight to a patched site's `syscall`, and a site inside code that keeps values in
 * every register, the flags, xmm0 and the red zone across the syscall. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

long site5(void);
long site7(void);
long site_jt(void);
long jump_to_syscall(void);
extern unsigned char site_jt_sys[];
/* out[0..16]: rbx rbp r12-r15 rdi rsi rdx r8 r9 r10 red-zone xmm0 cf rax */
void regcheck(uint64_t *out);

__asm__(".text\n"
        ".p2align 4\n"
        ".globl site5\n"
        "site5:\n"
        "  mov $110, %eax\n"
        "  syscall\n"
        "  ret\n"
        ".p2align 4\n"
        ".globl site7\n"
        "site7:\n"
        "  mov $110, %rax\n"
        "  syscall\n"
        "  ret\n"
        ".p2align 4\n"
        ".globl site_jt\n"
        "site_jt:\n"
        "  mov $110, %eax\n"
        ".globl site_jt_sys\n"
        "site_jt_sys:\n"
        "  syscall\n"
        "  ret\n"
        ".p2align 4\n"
        ".globl jump_to_syscall\n"
        "jump_to_syscall:\n"
        "  mov $39, %eax\n" /* getpid, through site_jt's syscall */
        "  jmp site_jt_sys\n"
        ".p2align 4\n"
        ".globl regcheck\n"
        "regcheck:\n"
        "  push %rbx\n  push %rbp\n  push %r12\n  push %r13\n  push %r14\n  push %r15\n"
        "  push %rdi\n"
        "  movq $0x5a5a5a5a, -8(%rsp)\n"
        "  mov $0x1001, %rbx\n  mov $0x1002, %rbp\n  mov $0x1003, %r12\n"
        "  mov $0x1004, %r13\n  mov $0x1005, %r14\n  mov $0x1006, %r15\n"
        "  mov $0x2001, %rdi\n  mov $0x2002, %rsi\n  mov $0x2003, %rdx\n"
        "  mov $0x2004, %r8\n  mov $0x2005, %r9\n  mov $0x2006, %r10\n"
        "  mov $0x3003300330033003, %rax\n  movq %rax, %xmm0\n"
        "  stc\n"
        "  jmp 1f\n"
        ".p2align 4\n"
        "1:\n"
        "  mov $110, %eax\n"
        "  syscall\n"
        "  setc %cl\n"
        "  movzbq %cl, %rcx\n"
        "  mov -8(%rsp), %r11\n"
        "  push %rax\n"
        "  mov 8(%rsp), %rax\n" /* out pointer */
        "  mov %rbx, 0(%rax)\n  mov %rbp, 8(%rax)\n  mov %r12, 16(%rax)\n"
        "  mov %r13, 24(%rax)\n  mov %r14, 32(%rax)\n  mov %r15, 40(%rax)\n"
        "  mov %rdi, 48(%rax)\n  mov %rsi, 56(%rax)\n  mov %rdx, 64(%rax)\n"
        "  mov %r8, 72(%rax)\n  mov %r9, 80(%rax)\n  mov %r10, 88(%rax)\n"
        "  mov %r11, 96(%rax)\n  movq %xmm0, %rbx\n  mov %rbx, 104(%rax)\n"
        "  mov %rcx, 112(%rax)\n"
        "  pop %rbx\n  mov %rbx, 120(%rax)\n"
        "  pop %rdi\n"
        "  pop %r15\n  pop %r14\n  pop %r13\n  pop %r12\n  pop %rbp\n  pop %rbx\n"
        "  ret\n");

static const uint64_t want[16] = {0x1001, 0x1002, 0x1003, 0x1004, 0x1005, 0x1006,
                                  0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006,
                                  0x5a5a5a5a, 0x3003300330033003ULL, 1, 0};

int main(void) {
    long ppid = getppid(), pid = getpid();
    int bad = 0;
    for (int i = 0; i < 50; i++) {
        if (site5() != ppid || site7() != ppid || site_jt() != ppid)
            bad |= 1;
        if (jump_to_syscall() != pid)
            bad |= 2;
        uint64_t out[16];
        memset(out, 0, sizeof out);
        regcheck(out);
        uint64_t w[16];
        memcpy(w, want, sizeof w);
        w[15] = (uint64_t)ppid;
        for (int k = 0; k < 16; k++)
            if (out[k] != w[k]) {
                printf("iteration %d: register slot %d = %#llx, want %#llx\n", i, k,
                       (unsigned long long)out[k], (unsigned long long)w[k]);
                bad |= 4;
            }
    }
    /* 1 where the shim replaced the mov by a jmp (0xe9). */
    printf("patched %d %d %d; syscall kept %d; bad %d\n", ((unsigned char *)site5)[0] == 0xe9,
           ((unsigned char *)site7)[0] == 0xe9, ((unsigned char *)site_jt)[0] == 0xe9,
           site_jt_sys[0] == 0x0f && site_jt_sys[1] == 0x05, bad);
    return bad;
}
