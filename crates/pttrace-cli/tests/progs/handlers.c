/* Installs its own SIGSYS and SIGTRAP handlers, makes syscalls from signal handlers
 * (including one that interrupts a blocking read, with and without SA_RESTART), and
 * blocks every signal with sigprocmask. Prints one line per check; exits 0 when all pass. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/time.h>
#include <unistd.h>

static volatile sig_atomic_t sigsys_seen, sigtrap_seen, alarm_seen;
static int pipefd[2];

static void on_sigsys(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    if (sig == SIGSYS && si->si_code == SI_TKILL)
        sigsys_seen++;
}

static void on_sigtrap(int sig) {
    (void)sig;
    sigtrap_seen++;
    getppid(); /* a syscall from inside a signal handler */
}

static void on_alarm_write(int sig) {
    (void)sig;
    alarm_seen++;
    char c = 'x';
    if (write(pipefd[1], &c, 1) != 1) /* runs while the main thread is blocked in read */
        _exit(3);
}

static void on_alarm_plain(int sig) {
    (void)sig;
    alarm_seen++;
}

static int fail(const char *what) {
    printf("FAIL %s (errno %d)\n", what, errno);
    return 1;
}

int main(void) {
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigsys;
    sa.sa_flags = SA_SIGINFO;
    sigfillset(&sa.sa_mask);
    if (sigaction(SIGSYS, &sa, NULL) != 0) return fail("sigaction SIGSYS");
    if (sigaction(SIGSYS, NULL, &old) != 0 || old.sa_sigaction != on_sigsys)
        return fail("SIGSYS query does not return our handler");
    raise(SIGSYS);
    if (sigsys_seen != 1) return fail("own SIGSYS handler not called");
    printf("ok sigsys handler\n");

    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigtrap;
    if (sigaction(SIGTRAP, &sa, NULL) != 0) return fail("sigaction SIGTRAP");
    __asm__ volatile("int3");
    if (sigtrap_seen != 1) return fail("own SIGTRAP handler not called");
    printf("ok sigtrap handler\n");

    /* Block everything (SIGSYS included, as far as the program knows), make syscalls. */
    sigset_t all, prev;
    sigfillset(&all);
    if (sigprocmask(SIG_SETMASK, &all, &prev) != 0) return fail("sigprocmask");
    getppid();
    sigset_t now;
    if (sigprocmask(SIG_SETMASK, &prev, &now) != 0) return fail("sigprocmask restore");
    if (!sigismember(&now, SIGUSR1)) return fail("mask not applied");
    printf("ok sigprocmask\n");

    /* SA_RESTART: the alarm handler writes to the pipe while read() blocks on it. */
    if (pipe(pipefd) != 0) return fail("pipe");
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm_write;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 0}, {0, 20000}};
    setitimer(ITIMER_REAL, &it, NULL);
    char c;
    ssize_t n = read(pipefd[0], &c, 1);
    if (n != 1 || c != 'x' || alarm_seen != 1) return fail("restarted read");
    printf("ok sa_restart read\n");

    /* Without SA_RESTART the read fails with EINTR. */
    sa.sa_handler = on_alarm_plain;
    sa.sa_flags = 0;
    sigaction(SIGALRM, &sa, NULL);
    setitimer(ITIMER_REAL, &it, NULL);
    n = read(pipefd[0], &c, 1);
    if (n != -1 || errno != EINTR || alarm_seen != 2) return fail("interrupted read");
    printf("ok eintr read\n");

    /* Under the shim, switching Syscall User Dispatch off is refused (EBUSY); without
     * it, turning off a dispatch that was never on succeeds. */
    int r = prctl(59 /* PR_SET_SYSCALL_USER_DISPATCH */, 0, 0, 0, 0);
    printf("sud off: %s\n", r == 0 ? "allowed" : errno == EBUSY ? "refused" : "other error");
    return 0;
}
