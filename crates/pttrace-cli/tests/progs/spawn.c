/* posix_spawn children (glibc: clone(CLONE_VM|CLONE_VFORK) on a separate stack, sharing
 * the parent's memory until exec): /bin/echo; a missing program (the child's execve fails
 * and it _exits with 127); posix_spawnp of "echo" along a PATH whose first entry does not
 * exist (a failed execve, then one that succeeds); and system() (sh -c). */
#include <errno.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
extern char **environ;

static int wait_ok(pid_t pid) {
    int st;
    return waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int main(void) {
    pid_t pid;
    char *argv[] = {"echo", "spawned", NULL};
    if (posix_spawn(&pid, "/bin/echo", NULL, NULL, argv, environ) != 0) {
        perror("posix_spawn");
        return 1;
    }
    if (!wait_ok(pid)) return 2;
    printf("spawn ok %d\n", (int)pid);
    fflush(stdout);
    char *missing[] = {"missing", NULL};
    int r = posix_spawn(&pid, "/nonexistent/missing", NULL, NULL, missing, environ);
    if (r != ENOENT) return 3;
    printf("spawn missing ok\n");
    fflush(stdout);
    setenv("PATH", "/nonexistent:/bin:/usr/bin", 1);
    char *argv2[] = {"echo", "spawnp", NULL};
    if (posix_spawnp(&pid, "echo", NULL, NULL, argv2, environ) != 0) return 4;
    if (!wait_ok(pid)) return 5;
    printf("spawnp ok\n");
    fflush(stdout);
    if (system("echo system ok") != 0) return 6;
    return 0;
}
