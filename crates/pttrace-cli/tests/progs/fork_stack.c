/* A fork made three calls deep: the child returns through the frames it inherited
 * (level2, level1, main) and ends by returning from main; the parent waits for it. */
#include <sys/wait.h>
#include <unistd.h>

volatile int sink;

__attribute__((noinline)) int level2(void) {
    int pid = fork();
    sink += 1;
    return pid;
}

__attribute__((noinline)) int level1(void) {
    int pid = level2();
    sink += 2;
    return pid;
}

int main(void) {
    int pid = level1();
    if (pid > 0)
        waitpid(pid, 0, 0);
    return 0;
}
