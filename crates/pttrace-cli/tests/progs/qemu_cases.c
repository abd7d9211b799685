/* Programs with exactly known control flow for the QEMU backend tests (built -no-pie so
 * the symbols' addresses are the run-time ones).
 *   loop N    pt_loop(N) between getppid and gettid
 *   mix       data-dependent branches, indirect calls through a table, recursion, libc
 *             (qsort with a callback, strlen), syscalls; prints what it computed
 *   alarm N   SIGALRM every 200 us while pt_loop runs, until N were handled (default 20)
 *   pkill     another thread sends SIGUSR1 to the main thread 200 times (pthread_kill)
 *             while it runs pt_loop
 *   jitfault  code written at run time faults: once restarted by a SIGSEGV handler that
 *             makes the page readable, once left by siglongjmp
 *   threads   8 threads, thread i runs pt_loop(100 * (i + 1)) between getppid and gettid
 *   jit       RWX page: code written, called, rewritten at the same address, called again
 *   rep       10 rounds of rep movsb (100), rep stosq (50), cpuid and a getppid syscall
 *   repalarm N  SIGALRM every 200 us while rep movsb copies 64 KiB at a time, until N
 *             were handled (default 20): signals land between iterations of the copy
 *   crash     3 getppid syscalls, then a write through a null pointer (SIGSEGV)
 *   closefds P  closes every descriptor above 2 (as a subprocess child does), creates P
 *             (it gets the lowest number: one the tracer used), 20 getppid, writes a line
 *             to P, 5 getppid */
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

__attribute__((noinline)) void pt_loop(long n) {
    __asm__ volatile(
        "mov %0, %%rcx\n"
        ".globl pt_loop_head\n"
        "pt_loop_head:\n"
        "test $1, %%cl\n"
        "jz 1f\n"
        "nop\n"
        "1:\n"
        "dec %%rcx\n"
        "jnz pt_loop_head\n"
        :
        : "r"(n)
        : "rcx", "cc");
}

static volatile long sink;
__attribute__((noinline)) void fn_a(long v) { sink += v; }
__attribute__((noinline)) void fn_b(long v) { sink -= v; }
__attribute__((noinline)) void fn_c(long v) { sink ^= v; }
static void (*const table[3])(long) = {fn_a, fn_b, fn_c};

__attribute__((noinline)) long fib(long n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

static int cmp(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

static void mix(void) {
    unsigned x = 12345;
    long odd = 0;
    for (int i = 0; i < 64; i++) {
        x = x * 1103515245u + 12345u;
        if ((x >> 16) & 1) /* data-dependent */
            odd++;
    }
    for (long i = 0; i < 30; i++)
        table[i % 3](i);
    long f = fib(12);
    int v[16];
    for (int i = 0; i < 16; i++)
        v[i] = (i * 7919) % 16;
    qsort(v, 16, sizeof v[0], cmp);
    size_t len = strlen("processor trace");
    for (int i = 0; i < 5; i++)
        syscall(SYS_getppid);
    printf("odd=%ld fib=%ld sorted=%d,%d len=%zu sink=%ld\n", odd, f, v[0], v[15], len, sink);
}

static volatile long alarms;
__attribute__((noinline)) void on_alarm(int sig) {
    (void)sig;
    alarms++;
}

/* SIGALRM to on_alarm every 200 us (on), or no more (off). */
static void alarms_every_200us(int on) {
    if (on) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_alarm;
        sa.sa_flags = SA_RESTART;
        sigaction(SIGALRM, &sa, 0);
    }
    struct itimerval it = {{0, on ? 200 : 0}, {0, on ? 200 : 0}};
    setitimer(ITIMER_REAL, &it, 0);
}

static void alarm_case(long want) {
    alarms_every_200us(1);
    long rounds = 0;
    while (alarms < want) {
        pt_loop(10000);
        rounds++;
    }
    alarms_every_200us(0);
    printf("alarms=%ld rounds=%ld\n", alarms, rounds);
}

__attribute__((noinline)) void rep_copy(void *dst, const void *src, long n) {
    __asm__ volatile(
        "mov %0, %%rdi\n"
        "mov %1, %%rsi\n"
        "mov %2, %%rcx\n"
        ".globl rep_copy_at\n"
        "rep_copy_at:\n"
        "rep movsb\n"
        :
        : "r"(dst), "r"(src), "r"(n)
        : "rcx", "rsi", "rdi", "memory");
}

static void repalarm_case(long want) {
    static char src[64 << 10], dst[64 << 10];
    alarms_every_200us(1);
    long rounds = 0;
    while (alarms < want) {
        rep_copy(dst, src, sizeof dst);
        rounds++;
    }
    alarms_every_200us(0);
    printf("alarms=%ld rounds=%ld\n", alarms, rounds);
}

static volatile long usr1s;
__attribute__((noinline)) void on_usr1(int sig) {
    (void)sig;
    usr1s++;
}
static pthread_t main_thread;
static volatile int sending = 1;

static void *killer(void *arg) {
    (void)arg;
    for (int i = 0; i < 200; i++) {
        pthread_kill(main_thread, SIGUSR1);
        usleep(100);
    }
    sending = 0;
    return 0;
}

static void pkill_case(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, 0);
    main_thread = pthread_self();
    pthread_t t;
    pthread_create(&t, 0, killer, 0);
    while (sending)
        pt_loop(1000);
    pthread_join(t, 0);
    printf("usr1=%ld\n", usr1s);
}

static unsigned char *guard;
static sigjmp_buf jit_jump;
static volatile int segvs;
__attribute__((noinline)) void on_segv_fix(int sig, siginfo_t *si, void *uc) {
    (void)sig, (void)si, (void)uc;
    segvs++;
    mprotect(guard, 4096, PROT_READ);
}
__attribute__((noinline)) void on_segv_jump(int sig) {
    (void)sig;
    segvs++;
    siglongjmp(jit_jump, 1);
}

static void jitfault_case(void) {
    unsigned char *p = mmap(0, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    guard = mmap(0, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED || guard == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    /* nop; mov eax,[rdi]; add eax,1; mov [rsi],eax; ret */
    static const unsigned char v1[] = {0x90, 0x8b, 0x07, 0x83, 0xc0, 0x01, 0x89, 0x06, 0xc3};
    /* mov eax,[rdi]; test eax,eax; jz +0; ret */
    static const unsigned char v2[] = {0x8b, 0x07, 0x85, 0xc0, 0x74, 0x00, 0xc3};
    memcpy(p, v1, sizeof v1);
    memcpy(p + 64, v2, sizeof v2);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv_fix;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, 0);
    int out = 0;
    ((void (*)(void *, int *))p)(guard, &out);
    mprotect(guard, 4096, PROT_NONE);
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_segv_jump;
    sigaction(SIGSEGV, &sa, 0);
    if (!sigsetjmp(jit_jump, 1))
        ((void (*)(void *))(p + 64))(guard);
    printf("jit=%p out=%d segvs=%d\n", (void *)p, out, segvs);
}

static void *worker(void *arg) {
    syscall(SYS_getppid);
    pt_loop((long)arg);
    syscall(SYS_gettid);
    return 0;
}

static void threads_case(void) {
    pthread_t t[8];
    for (long i = 0; i < 8; i++)
        pthread_create(&t[i], 0, worker, (void *)(100 * (i + 1)));
    for (int i = 0; i < 8; i++)
        pthread_join(t[i], 0);
}

static void jit_case(void) {
    unsigned char *p = mmap(0, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    static const unsigned char v1[] = {0xb8, 0x01, 0x00, 0x00, 0x00, 0xc3}; /* mov eax,1; ret */
    static const unsigned char v2[] = {0xb8, 0x02, 0x00, 0x00, 0x00, /* mov eax,2 */
                                       0x83, 0xc0, 0x03,             /* add eax,3 */
                                       0xc3};                        /* ret */
    memcpy(p, v1, sizeof v1);
    int r1 = ((int (*)(void))p)();
    memcpy(p, v2, sizeof v2);
    int r2 = ((int (*)(void))p)();
    printf("jit=%p r1=%d r2=%d\n", (void *)p, r1, r2);
}

__attribute__((noinline)) void rep_round(void *dst, const void *src, void *q) {
    __asm__ volatile(
        "mov %0, %%rdi\n"
        "mov %1, %%rsi\n"
        "mov $100, %%rcx\n"
        ".globl rep_movsb_at\n"
        "rep_movsb_at:\n"
        "rep movsb\n"
        "mov %2, %%rdi\n"
        "xor %%eax, %%eax\n"
        "mov $50, %%rcx\n"
        ".globl rep_stosq_at\n"
        "rep_stosq_at:\n"
        "rep stosq\n"
        "xor %%eax, %%eax\n"
        ".globl cpuid_at\n"
        "cpuid_at:\n"
        "cpuid\n"
        "mov $110, %%eax\n" /* getppid */
        ".globl syscall_at\n"
        "syscall_at:\n"
        "syscall\n"
        :
        : "r"(dst), "r"(src), "r"(q)
        : "rax", "rbx", "rcx", "rdx", "rsi", "rdi", "r11", "memory", "cc");
}

static void rep_case(void) {
    static char src[100], dst[100];
    static long q[50];
    for (int i = 0; i < 10; i++)
        rep_round(dst, src, q);
    printf("rep done\n");
}

int main(int argc, char **argv) {
    const char *m = argc > 1 ? argv[1] : "loop";
    if (!strcmp(m, "loop")) {
        long n = argc > 2 ? atol(argv[2]) : 1000;
        syscall(SYS_getppid);
        pt_loop(n);
        syscall(SYS_gettid);
    } else if (!strcmp(m, "mix")) {
        mix();
    } else if (!strcmp(m, "alarm")) {
        alarm_case(argc > 2 ? atol(argv[2]) : 20);
    } else if (!strcmp(m, "pkill")) {
        pkill_case();
    } else if (!strcmp(m, "jitfault")) {
        jitfault_case();
    } else if (!strcmp(m, "threads")) {
        threads_case();
    } else if (!strcmp(m, "jit")) {
        jit_case();
    } else if (!strcmp(m, "repalarm")) {
        repalarm_case(argc > 2 ? atol(argv[2]) : 20);
    } else if (!strcmp(m, "rep")) {
        rep_case();
    } else if (!strcmp(m, "closefds") && argc > 2) {
        syscall(SYS_close_range, 3, ~0U, 0);
        int fd = open(argv[2], O_CREAT | O_TRUNC | O_WRONLY, 0644);
        for (int i = 0; i < 20; i++)
            syscall(SYS_getppid);
        if (write(fd, "guest data\n", 11) != 11)
            return 1;
        close(fd);
        for (int i = 0; i < 5; i++)
            syscall(SYS_getppid);
    } else if (!strcmp(m, "crash")) {
        for (int i = 0; i < 3; i++)
            syscall(SYS_getppid);
        *(volatile int *)(long)argc = 0; /* argc is small: an unmapped page */
    } else {
        fprintf(stderr, "unknown case %s\n", m);
        return 2;
    }
    return 0;
}
