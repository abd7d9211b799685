/* Known loads and stores for `run --memory`: three passes over a 1,000-element array of
 * longs, each element read once and written once per pass (arr[i] += i, the array
 * volatile so that every access happens), in order. Then twice a cell read and written
 * by instructions 600 bytes into their block (QEMU's log names such an
 * instruction in a wide entry). Built -O1 -no-pie: `arr`, `far_cell` and `far_access`
 * are at their symbols' addresses. */
static volatile long arr[1000];
volatile long far_cell;

/* 150 four-byte nops, then the access: one block (page-aligned, so that no page boundary
 * cuts it), the access at offset 600. */
__attribute__((noinline, aligned(4096))) void far_access(void)
{
    __asm__ volatile(".rept 150\n\tnopl 0(%%rax,%%rax,1)\n\t.endr" ::: "memory");
    far_cell = far_cell + 1;
}

int main(void)
{
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < 1000; i++)
            arr[i] = arr[i] + i;
    far_access();
    far_access();
    return arr[999] == 2997 && far_cell == 2 ? 0 : 1;
}
