/* Starts /bin/echo with posix_spawn (glibc: clone(CLONE_VM|CLONE_VFORK) on a separate
 * stack), waits for it, and also runs a child through system() (fork + exec of sh). */
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
extern char **environ;
int main(void) {
    pid_t pid;
    char *argv[] = {"echo", "spawned", NULL};
    if (posix_spawn(&pid, "/bin/echo", NULL, NULL, argv, environ) != 0) {
        perror("posix_spawn");
        return 1;
    }
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) return 2;
    printf("spawn ok %d\n", (int)pid);
    fflush(stdout);
    if (system("echo system ok") != 0) return 3;
    return 0;
}
