/* Threads, allocation (GC) and caught NullPointerExceptions in a hot loop: compiled code
 * takes implicit null checks (SIGSEGV) and safepoints. */
import java.util.ArrayList;

public class Faults {
    static final class Box {
        int v = 1;
    }

    static int touch(Box b) {
        return b.v;
    }

    public static void main(String[] args) throws Exception {
        Thread[] ts = new Thread[3];
        long[] npes = new long[ts.length];
        for (int t = 0; t < ts.length; t++) {
            final int me = t;
            ts[t] = new Thread(() -> {
                long sum = 0;
                ArrayList<int[]> keep = new ArrayList<>();
                for (int i = 0; i < 200000; i++) {
                    Box b = (i % 500 == 0) ? null : new Box();
                    try {
                        sum += touch(b);
                    } catch (NullPointerException e) {
                        npes[me]++;
                    }
                    if (i % 50 == 0) {
                        keep.add(new int[512]);
                        if (keep.size() > 400) keep.clear();
                    }
                }
                if (sum == 42) System.out.println("unlikely");
            });
            ts[t].start();
        }
        long total = 0;
        for (int t = 0; t < ts.length; t++) {
            ts[t].join();
            total += npes[t];
        }
        System.out.println("npes=" + total);
    }
}
