/* Line coverage against gcov: some lines run, some never (the input decides). */
#include <stdio.h>
#include <string.h>

static int classify(int v) {
    if (v % 15 == 0)
        return 3;
    if (v % 5 == 0)
        return 2;
    if (v % 3 == 0)
        return 1;
    if (v < 0) {
        puts("negative");
        return -1;
    }
    return 0;
}

static void never_called(void) {
    puts("never");
}

int main(int argc, char **argv) {
    int counts[4] = {0, 0, 0, 0};
    for (int i = 1; i <= 100; i++) {
        int c = classify(i);
        if (c >= 0)
            counts[c]++;
    }
    if (argc > 1 && strcmp(argv[1], "never") == 0)
        never_called();
    printf("%d %d %d %d\n", counts[0], counts[1], counts[2], counts[3]);
    return 0;
}
