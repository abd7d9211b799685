/* A known call structure for `pttrace view` (tests/view.rs): main calls a() three times,
 * a calls b, then main calls c. They call nothing else (no libc), so every call runs the
 * same instructions. Built with -O0 -fno-inline -fno-omit-frame-pointer. */
volatile int sink;

void b(void) {
    for (int i = 0; i < 100; i++)
        sink += i;
}

void a(void) {
    sink += 1;
    b();
}

void c(void) {
    for (int i = 0; i < 50; i++)
        sink ^= i;
}

int main(void) {
    for (int i = 0; i < 3; i++)
        a();
    c();
    return 0;
}
