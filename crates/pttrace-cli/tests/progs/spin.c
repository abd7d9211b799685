/* Makes getppid syscalls forever (until killed), printing "running" once started. */
#include <stdio.h>
#include <unistd.h>
int main(void) {
    printf("running\n");
    fflush(stdout);
    for (;;)
        getppid();
}
