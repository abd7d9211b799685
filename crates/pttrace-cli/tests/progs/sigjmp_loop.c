/* A timer signal interrupts a loop of conditional branches 20 times; its handler leaves
 * with siglongjmp, never returning to the interrupted instruction: under QEMU the plugin
 * cannot tell which way the last branch went, and writes OVF there. */
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <sys/time.h>

static sigjmp_buf jb;
static volatile int hits;

static void on_alarm(int sig)
{
    (void)sig;
    /* A last alarm may come after the loop ended, before the timer is off. */
    if (hits < 20)
        hits++;
    siglongjmp(jb, 1);
}

int main(void)
{
    signal(SIGALRM, on_alarm);
    struct itimerval it = {{0, 2000}, {0, 2000}};
    setitimer(ITIMER_REAL, &it, NULL);
    volatile unsigned long x = 0;
    sigsetjmp(jb, 1);
    while (hits < 20) {
        for (unsigned long i = 0; i < 100000; i++) {
            if (i & 1)
                x += i;
            else
                x ^= i;
        }
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("%d\n", hits);
    return 0;
}
