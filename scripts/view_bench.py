#!/usr/bin/env python3
"""`pttrace view` against `pttrace decode` on the same trace directories, side by side.

    scripts/view_bench.py PTTRACE TRACE_DIR... [--rounds N]

For each trace: N paired rounds (decode --format summary, then view into a fresh
directory), the median wall time of each and their ratio, the peak RSS of each (wait4),
and from the last view: the calls, the bytes of every file written, and timeline.pftrace's
bytes per call. A measuring script, not a test: this VM is shared and noisy.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time


def measured(cmd):
    """(seconds, peak RSS in bytes, stdout) of one run of `cmd`."""
    start = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    took = time.monotonic() - start
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)}: exit status {code}")
    return took, usage.ru_maxrss * 1024, out.decode(errors="replace")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pttrace")
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    for trace in args.traces:
        dec, view, dec_rss, view_rss = [], [], 0, 0
        said = ""
        out = tempfile.mkdtemp(prefix="view-bench-")
        try:
            for _ in range(args.rounds):
                t, rss, _ = measured([args.pttrace, "decode", trace, "--format", "summary"])
                dec.append(t)
                dec_rss = max(dec_rss, rss)
                shutil.rmtree(out, ignore_errors=True)
                t, rss, said = measured([args.pttrace, "view", trace, "-o", out])
                view.append(t)
                view_rss = max(view_rss, rss)
            m = re.search(r"(\d+) instructions, (\d+) function spans", said)
            insns, spans = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
            print(f"{trace}: {insns} instructions, {spans} calls (function spans)")
            d, v = statistics.median(dec), statistics.median(view)
            print(f"  decode {d:.2f} s (rounds {', '.join(f'{x:.2f}' for x in dec)}), peak RSS {dec_rss >> 20} MiB")
            print(f"  view   {v:.2f} s (rounds {', '.join(f'{x:.2f}' for x in view)}), peak RSS {view_rss >> 20} MiB")
            print(f"  view / decode: {v / d:.2f}x (medians)")
            for f in sorted(os.listdir(out)):
                size = os.path.getsize(os.path.join(out, f))
                extra = ""
                if f == "timeline.pftrace" and spans:
                    extra = f"  ({size / spans:.2f} bytes per call)"
                print(f"  {f}: {size} bytes{extra}")
        finally:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
