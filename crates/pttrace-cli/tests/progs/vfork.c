/* Creates a child with fork (argv[1] = 0), vfork (1) or a raw clone(CLONE_VFORK|SIGCHLD)
 * (2); the child makes exactly 3 getppid calls and _exits. */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int mode = argc > 1 ? atoi(argv[1]) : 0;
    pid_t p;
    if (mode == 0)
        p = fork();
    else if (mode == 1)
        p = vfork();
    else
        p = syscall(SYS_clone, CLONE_VFORK | SIGCHLD, 0, 0, 0, 0);
    if (p == 0) {
        getppid();
        getppid();
        getppid();
        _exit(0);
    }
    int st;
    if (waitpid(p, &st, 0) != p || !WIFEXITED(st)) return 1;
    printf("child %d\n", (int)p);
    return 0;
}
