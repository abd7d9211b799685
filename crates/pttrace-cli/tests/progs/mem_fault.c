/* A read-modify-write whose store faults: `addl $1, (page)` on a read-only page. Its load
 * succeeds first (QEMU reports it), then its store faults; the SIGSEGV handler makes the
 * page writable and returns, and the instruction runs again, whole. The first attempt did
 * not retire: its load is not one of the program's accesses. Prints the value (6) and the
 * faults (1). */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

int *page;
static volatile int faults;

static void on_segv(int sig)
{
    (void)sig;
    faults++;
    mprotect(page, 4096, PROT_READ | PROT_WRITE);
}

__attribute__((noinline)) void bump(int *p)
{
    __asm__ volatile(".globl bump_add\nbump_add:\n\taddl $1, (%0)" : : "r"(p) : "memory");
}

int main(void)
{
    page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED)
        return 1;
    page[0] = 5;
    mprotect(page, 4096, PROT_READ);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_segv;
    sigaction(SIGSEGV, &sa, NULL);
    bump(page);
    printf("%d %d\n", page[0], faults);
    return 0;
}
