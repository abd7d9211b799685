/* A return to an address no call pushed (`push` + `ret`, as JITs and interpreters make
 * their own return addresses): `pttrace view` says its stacks may be wrong from there. */
volatile int sink;

__attribute__((noinline)) void detour(void) {
    __asm__ volatile("lea 1f(%%rip), %%rax\n\tpush %%rax\n\tret\n1:\n" ::: "rax", "memory");
    sink += 1;
}

int main(void) {
    detour();
    return 0;
}
