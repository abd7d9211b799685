/* 50 getppid calls, then dies: argv[1] = "segv" (NULL write) or "term" (raise SIGTERM).
 * First checks that sigaction still reports the default SIGSEGV disposition. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
    struct sigaction old;
    if (sigaction(SIGSEGV, NULL, &old) != 0 || old.sa_handler != SIG_DFL) {
        printf("SIGSEGV disposition is not reported as SIG_DFL\n");
        return 1;
    }
    for (int i = 0; i < 50; i++)
        getppid();
    if (argc > 1 && strcmp(argv[1], "term") == 0)
        raise(SIGTERM);
    *(volatile int *)0 = 1;
    return 0;
}
