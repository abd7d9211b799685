// Stacks against gdb: recursion, longjmp, a C++ exception crossing frames, a signal
// handler, a second thread and an exec into a second image (this program again, with
// the argument `child`); every interesting point calls probe(), where gdb breaks.
#include <csetjmp>
#include <csignal>
#include <cstdio>
#include <pthread.h>
#include <stdexcept>
#include <unistd.h>

extern "C" __attribute__((noinline)) void probe(int tag)
{
    asm volatile("" ::"r"(tag) : "memory");
}

static volatile int sink;

__attribute__((noinline)) int fact(int n)
{
    if (n <= 1) {
        probe(1);
        return 1;
    }
    return n * fact(n - 1);
}

static jmp_buf jb;

__attribute__((noinline)) void deep_jump(int d)
{
    if (d == 0)
        longjmp(jb, 1);
    deep_jump(d - 1);
    sink++;
}

__attribute__((noinline)) void after_jump() { probe(2); }

__attribute__((noinline)) void jumper()
{
    if (setjmp(jb) == 0)
        deep_jump(3);
    else
        after_jump();
}

__attribute__((noinline)) void thrower(int d)
{
    if (d == 0)
        throw std::runtime_error("x");
    thrower(d - 1);
    sink++;
}

__attribute__((noinline)) void after_catch() { probe(3); }

__attribute__((noinline)) void catcher()
{
    try {
        thrower(3);
    } catch (const std::exception &) {
        after_catch();
    }
}

static void handler(int) { probe(4); }

__attribute__((noinline)) void signaller()
{
    signal(SIGUSR1, handler);
    raise(SIGUSR1);
    probe(5);
}

static void *worker(void *)
{
    for (int i = 0; i < 3; i++)
        sink += fact(4);
    catcher();
    return nullptr;
}

// The exec'd image: a stack that starts over at its own entry point.
static int child()
{
    sink += fact(5);
    catcher();
    signaller();
    printf("%d\n", sink);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1)
        return child();
    for (int i = 0; i < 4; i++)
        sink += fact(3 + i);
    for (int i = 0; i < 3; i++)
        jumper();
    for (int i = 0; i < 3; i++)
        catcher();
    for (int i = 0; i < 3; i++)
        signaller();
    pthread_t t;
    pthread_create(&t, nullptr, worker, nullptr);
    pthread_join(t, nullptr);
    for (int i = 0; i < 2; i++)
        sink += fact(2);
    printf("%d\n", sink);
    fflush(stdout);
    execl(argv[0], argv[0], "child", (char *)nullptr);
    return 1;
}
