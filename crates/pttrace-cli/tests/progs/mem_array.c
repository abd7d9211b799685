/* Known loads and stores for `run --memory`: three passes over a 1,000-element array of
 * longs, each element read once and written once per pass (arr[i] += i, the array
 * volatile so that every access happens), in order. Built -O1 -no-pie: `arr` is at its
 * symbol's address. */
static volatile long arr[1000];

int main(void)
{
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < 1000; i++)
            arr[i] = arr[i] + i;
    return arr[999] == 2997 ? 0 : 1;
}
