/* Over a million calls in about a hundred million instructions: three levels of small
 * functions, none inlined, for the view of a large trace. */
#include <stdio.h>

static volatile int sink;

__attribute__((noinline)) static int leaf(int x) {
    for (int j = 0; j < 6; j++)
        x = x * 3 + j;
    return x;
}

__attribute__((noinline)) static int mid(int x) {
    int s = 0;
    for (int i = 0; i < 4; i++)
        s += leaf(x + i);
    return s;
}

__attribute__((noinline)) static int top(int x) {
    int s = 0;
    for (int i = 0; i < 8; i++)
        s += mid(x + i);
    return s;
}

int main(void) {
    int s = 0;
    for (int i = 0; i < 70000; i++)
        s += top(i);
    sink = s;
    printf("%d\n", s);
    return 0;
}
