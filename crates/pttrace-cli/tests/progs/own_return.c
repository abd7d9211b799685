/* A return to an address no call pushed (`push` + `ret`, as JITs and interpreters make
 * their own return addresses): `pttrace view` says its stacks may be wrong from there.
 *
 *   own_return          main calls detour(): one such return
 *   own_return thread   a thread calls detours(8): eight in a row, more than its frames */
#include <pthread.h>
#include <string.h>

volatile int sink;

__attribute__((noinline)) void detour(void) {
    __asm__ volatile("lea 1f(%%rip), %%rax\n\tpush %%rax\n\tret\n1:\n" ::: "rax", "memory");
    sink += 1;
}

__attribute__((noinline)) void detours(int n) {
    for (int i = 0; i < n; i++)
        __asm__ volatile("lea 1f(%%rip), %%rax\n\tpush %%rax\n\tret\n1:\n" ::: "rax", "memory");
    sink += 1;
}

static void *worker(void *arg) {
    (void)arg;
    detours(8);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "thread")) {
        pthread_t t;
        if (pthread_create(&t, 0, worker, 0) != 0)
            return 1;
        pthread_join(t, 0);
        return 0;
    }
    detour();
    return 0;
}
